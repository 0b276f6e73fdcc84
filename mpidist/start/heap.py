"""The C heap's limits: keep large freed blocks for reuse instead of handing them back to the kernel.

glibc's ``malloc`` serves a block larger than its mmap threshold with a fresh ``mmap`` and returns
it with ``munmap`` when freed, and hands the top of the heap back (``brk``) once more than its trim
threshold lies free there. Either way the next block of that size starts on pages the kernel must
fault in and zero again, 4 KiB at a time. The MPI library allocates a scratch buffer the size of
the message inside each large reduction (MPICH's ``MPI_Allreduce``), and torch frees and
reallocates gradients every step, so with glibc's defaults a DDP step faults in tens of MiB anew:
the 29 MiB bucket's ``MPI_Allreduce`` of a 10 M-parameter DDP step took 16–17 ms inside the step
against 9.5 ms alone, and 10.8–11.7 ms with these limits raised; the whole step fell from
99–105 ms to 83–86 ms (benchmarks/torch_backend.py, docs/benchmarks.md "The C heap").

At ``init_process_group`` mpidist therefore sets, through ``mallopt``, an mmap threshold of
:data:`MMAP_THRESHOLD` and a trim threshold of :data:`TRIM_THRESHOLD`. The price is that up to
:data:`TRIM_THRESHOLD` of freed memory at the heap's top stays with the process. They are left
alone where the user has chosen these limits (``MALLOC_*_`` variables or ``GLIBC_TUNABLES``),
where another allocator is preloaded, on a C library other than glibc, and with
``MPIDIST_MALLOC=0``.
"""

from __future__ import annotations

import ctypes
import os

from ..core import settings

#: Blocks up to this size come from the heap and are reused after ``free``.
MMAP_THRESHOLD = 64 << 20
#: Free memory at the top of the heap kept for reuse, up to this size.
TRIM_THRESHOLD = 256 << 20
#: glibc's ``mallopt`` parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Variables by which the user has chosen glibc's heap limits.
USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                  "MALLOC_MMAP_MAX_")

#: What :func:`tune` did in this process: ``None`` before it ran, else ``"set"`` or why not.
state: str | None = None


def reason_to_leave(env: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """Why the heap's limits are not mpidist's to set, or ``None`` when they are."""
    if not settings.flag("MPIDIST_MALLOC", env):
        return "off (MPIDIST_MALLOC=0)"
    chosen = [v for v in USER_VARIABLES if v in env]
    if "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
        chosen.append("GLIBC_TUNABLES")
    if chosen:
        return f"left as the user chose ({', '.join(chosen)})"
    if "malloc" in env.get("LD_PRELOAD", ""):
        return "left alone: another allocator is preloaded (LD_PRELOAD)"
    if not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"):
        return "left alone: the C library is not glibc"
    return None


def tune() -> str:
    """Raise glibc's mmap and trim thresholds once per process (``mallopt``); what was done."""
    global state
    if state is not None:
        return state
    why = reason_to_leave()
    if why is None:
        libc = ctypes.CDLL(None)
        if libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1 \
                or libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
            why = "left alone: glibc refused the limits"
    state = why or (f"set (mmap threshold {MMAP_THRESHOLD >> 20} MiB, "
                    f"trim threshold {TRIM_THRESHOLD >> 20} MiB)")
    return state


def describe() -> str:
    """What :func:`tune` did, or before it has run, what it will do (``python -m mpidist info``)."""
    if state is not None:
        return state
    return reason_to_leave() or "to be set at init_process_group"
