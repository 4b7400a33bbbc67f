"""A process that holds request plaintext makes itself undumpable at start (`traceless node`,
`traceless serve`).

A crash (of the native kernels, say) would otherwise have the kernel write a core file with the
process's memory (prompts, KV, keys) wherever the host's core_pattern points, which may be a file,
a crash collector or another machine. RLIMIT_CORE = 0 asks for no core at all; PR_SET_DUMPABLE = 0
also refuses one (whatever a later rlimit says) and keeps other processes of the same user from
attaching with ptrace or reading /proc/PID/mem (root with CAP_SYS_PTRACE still can: the residue
audit runs so). A failure is an error, never skipped.
"""

from __future__ import annotations

import ctypes
import resource

PR_SET_DUMPABLE, PR_GET_DUMPABLE = 4, 3  # <linux/prctl.h>


def make_undumpable() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def is_dumpable() -> bool:
    return bool(ctypes.CDLL(None, use_errno=True).prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))
