"""Builds the native CPU kernels as a plain shared library (loaded with ctypes, see
traceless/runner/kernels.py). Everything else about the package lives in pyproject.toml."""

import platform

from setuptools import Extension, setup

flags = ["-O3", "-fopenmp", "-ffast-math", "-std=c11"]
if platform.machine() not in ("x86_64", "AMD64"):
    flags.append("-mcpu=native")

setup(
    ext_modules=[
        Extension(
            "traceless.model.layers._kernels",
            sources=[
                "traceless/model/layers/csrc/kernels.c",
                "traceless/model/layers/csrc/qmatmul.c",
                "traceless/model/layers/csrc/forward.c",
                "traceless/model/layers/csrc/team.c",
                "traceless/model/layers/csrc/pool_stacks.c",
                "traceless/server/csrc/dead_stack.c",
            ],
            depends=["traceless/model/layers/csrc/shapes.h"],
            extra_compile_args=flags,
            extra_link_args=["-fopenmp", "-lm", *(["-lmvec"] if platform.machine() in ("x86_64", "AMD64") else [])],
        ),
        # the dead part of a thread's stack cleared (server/dead_stack.py); plain C, no OpenMP
        Extension(
            "traceless.server._dead_stack",
            sources=["traceless/server/csrc/dead_stack.c"],
            extra_compile_args=["-O2", "-std=c11"],
        ),
    ]
)
