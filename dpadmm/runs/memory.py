"""Large temporaries without page faults: freed memory stays in the process (glibc's malloc).

An engine's round makes tensors as large as its state: on FEMNIST (P = 195 agents, 784 x 62
parameters each) every local step's gradient, noise and iterate is a 38 MB tensor. glibc serves an
allocation above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and gives it back with
``munmap`` when it is freed, so the kernel zero-fills each such tensor page by page when it is first
written. Measured on FEMNIST ObjPM (E = 10, float32, one thread): 2.4 million page faults in seven
rounds, and a fifth of a round's CPU time in the kernel.

:func:`keep_freed_memory` tells malloc to serve every allocation from its heap (``M_MMAP_MAX`` = 0),
to keep the freed top of the heap instead of returning it (``M_TRIM_THRESHOLD``) and to use one
arena for all threads (``M_ARENA_MAX`` = 1: a grid runs its cell in a thread of its own, and an
arena of another thread would still give its heaps back). A freed tensor's memory is then reused
by the next one, at the price of a process that keeps its peak memory until it ends. Processes
started by Ray get the same settings from :data:`WORKER_ENV` (glibc reads them at the process's
start). Only the processes that run engines ask for it: the ``dpadmm`` command's own process for
``train`` and ``reproduce``, and a grid's Ray workers; a Flower app, or a program that calls
``dpadmm.cli.main(argv)`` or an engine, keeps its malloc as it is unless it calls
:func:`keep_freed_memory` itself. Off glibc (macOS, musl) nothing changes.
"""

from __future__ import annotations

import ctypes
import platform

_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8  # mallopt's parameters (malloc.h)
_TRIM = 2**31 - 1  # mallopt takes an int: free tops up to 2 GiB stay in the heap

# The same settings as glibc's environment variables, for processes about to start (Ray's workers).
WORKER_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(_TRIM), "MALLOC_ARENA_MAX": "1"}


def keep_freed_memory() -> bool:
    """Keep freed memory in this process for reuse (see the module's docstring); whether malloc took the
    settings (False off glibc). Best called before the process starts its threads."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in
               ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _TRIM), (_M_ARENA_MAX, 1)))
