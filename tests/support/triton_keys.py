"""What Triton keys its compiled-kernel cache by, computed on a CPU: the specialization of one
launch's arguments (types, pointer alignment, integers equal to 1 or divisible by 16, constexprs),
as the runtime's binder computes it before looking a kernel up. Works whether the kernel is a
JITFunction or, under TRITON_INTERPRET=1, an InterpretedFunction (rebuilt as the JITFunction the
same decorator makes on a GPU)."""

from __future__ import annotations

from collections.abc import Callable


def binder(kernel) -> Callable[..., tuple]:
    """binder(*args, **kwargs) -> the specialization tuple a launch with these arguments gets."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import create_function_from_signature

    jit = _jit(kernel)
    bind = create_function_from_signature(jit.signature, jit.params, BaseBackend)

    def key(*args, **kwargs) -> tuple:
        _, specialization, _ = bind(*args, **kwargs)
        return tuple(tuple(s) for s in specialization)  # (type or 'constexpr', value)

    return key


def _jit(kernel):
    from triton.runtime.jit import JITFunction

    return kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn, **kernel.kwargs)


class LaunchRecorder:
    """Stands in for a kernel: `rec[grid](*args, **kwargs)` records the launch's specialization
    and runs nothing. `index[name]`: where an argument sits in a recorded key."""

    def __init__(self, kernel):
        self.key = binder(kernel)
        self.index = {name: i for i, name in enumerate(_jit(kernel).arg_names)}
        self.keys: list[tuple] = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.keys.append(self.key(*args, **kwargs))
