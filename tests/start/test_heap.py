"""The C heap's limits set at ``init_process_group`` (``mpidist.start.heap``).

The serial cases start a fresh interpreter each (``mallopt`` acts on the whole process) and ask
glibc itself where a block came from: a chunk served by ``mmap`` carries glibc's ``IS_MMAPPED``
bit in its size word, and ``mallinfo2().arena`` is the heap's size, which ``free`` shrinks only
when it trims the heap's top.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

from mpidist.start import heap

pytestmark = pytest.mark.skipif(
    not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"), reason="the heap limits are glibc's")

#: Run in a fresh interpreter: set the limits as init does, then allocate and free 3 blocks of
#: 48 MiB (above glibc's largest default mmap threshold, 32 MiB, below mpidist's 64 MiB).
_CHILD = r"""
import ctypes, json
from mpidist.start import heap

class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = Mallinfo2
state = heap.tune()
blocks = [libc.malloc(48 << 20) for _ in range(3)]
mmapped = [bool(ctypes.c_size_t.from_address(b - ctypes.sizeof(ctypes.c_size_t)).value & 2)
           for b in blocks]
held = libc.mallinfo2().arena
for b in reversed(blocks):
    libc.free(b)
print(json.dumps({"state": state, "mmapped": mmapped, "held": held,
                  "after_free": libc.mallinfo2().arena}))
"""


def _child(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if k not in heap.USER_VARIABLES + ("GLIBC_TUNABLES", "MPIDIST_MALLOC", "LD_PRELOAD")}
    out = subprocess.run([sys.executable, "-c", _CHILD], env={**clean, **env}, capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_large_blocks_come_from_the_heap_and_stay_after_free():
    got = _child()
    assert got["state"].startswith("set"), got
    assert got["mmapped"] == [False, False, False], got
    assert got["held"] >= 3 * (48 << 20), got
    assert got["after_free"] >= 3 * (48 << 20), got  # the top was not handed back


def test_off_leaves_glibcs_defaults():
    got = _child(MPIDIST_MALLOC="0")
    assert got["state"] == "off (MPIDIST_MALLOC=0)"
    assert got["mmapped"] == [True, True, True], got  # glibc: mmap above 32 MiB, whatever it saw


@pytest.mark.parametrize("env, named", [
    ({"MALLOC_TRIM_THRESHOLD_": str(1 << 20)}, "MALLOC_TRIM_THRESHOLD_"),
    ({"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}, "MALLOC_MMAP_THRESHOLD_"),
    ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1048576"}, "GLIBC_TUNABLES"),
])
def test_limits_the_user_chose_are_kept(env, named):
    got = _child(**env)
    assert got["state"] == f"left as the user chose ({named})"
    assert got["mmapped"] == [True, True, True], got  # the user's 1 MiB threshold, not mpidist's


def test_a_preloaded_allocator_is_left_alone():
    assert heap.reason_to_leave({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}) == (
        "left alone: another allocator is preloaded (LD_PRELOAD)")
    assert heap.reason_to_leave({"LD_PRELOAD": "/usr/lib/libfaketime.so"}) is None
    assert heap.reason_to_leave({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"}) is None


@pytest.mark.mpi
def test_init_process_group_sets_the_limits(dist):
    assert heap.state is not None, "init_process_group did not run heap.tune()"
    assert heap.describe() == heap.state
    if heap.reason_to_leave() is None:
        assert heap.state.startswith("set (mmap threshold 64 MiB, trim threshold 256 MiB)")
