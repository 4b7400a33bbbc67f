"""Builds the native CPU kernels as a plain shared library (loaded with ctypes, see
traceless/runner/kernels.py). Everything else about the package lives in pyproject.toml."""
import platform

from setuptools import Extension, setup

flags = ["-O3", "-fopenmp", "-ffast-math",
         "-std=c11"]
if platform.machine() not in ("x86_64", "AMD64"):
    flags.append("-mcpu=native")

setup(
    ext_modules=[
        Extension(
            "traceless.model.layers._kernels",
            sources=["traceless/model/layers/csrc/kernels.c", "traceless/model/layers/csrc/qmatmul.c"],
            extra_compile_args=flags,
            extra_link_args=["-fopenmp", "-lm", *(["-lmvec"] if platform.machine() in ("x86_64", "AMD64") else [])],
        )
    ]
)
