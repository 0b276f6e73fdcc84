"""Threads and groups: a group serves one thread at a time, and threads with groups of their own run
side by side.

MPI matches a communicator's collectives by the order each rank makes them, so two threads that
share a group would pair calls in an order no rank controls; mpidist raises
:class:`mpidist.ConcurrentCallError` in the thread that comes second instead. MPI tests:
``mpiexec -n 2 python -m pytest --with-mpi tests/stress/test_group_threads.py``.
"""

from __future__ import annotations

import sys
import threading
from datetime import timedelta

import numpy as np
import pytest
from helpers import assert_all_ranks_ok, gathered
from mpi4py import MPI

#: Bounds every wait of these tests: a group's calls raise past it, and a thread not done by then
#: is reported instead of waited for. Generous: nothing here waits on time when it works.
GROUP_TIMEOUT = timedelta(seconds=30)
JOIN = 90.0
#: The tag of the message that lets rank 1 join the first thread's call.
GO = 77

def _barrier(dist, g, rank):
    dist.barrier(group=g)


def _all_reduce(dist, g, rank):
    x = np.full(4, float(rank + 1))
    dist.all_reduce(x, group=g)
    return x


FIRST = {"barrier": _barrier, "all_reduce": _all_reduce}  # the call the main thread is in, on g
SECOND = {  # the call the second thread enters on the same group: another call, so both names show
    "barrier": ("all_reduce", lambda dist, g: dist.all_reduce(np.ones(4), group=g)),
    "all_reduce": ("broadcast", lambda dist, g: dist.broadcast(np.ones(4), src=0, group=g)),
}


def _needs_threads():
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        pytest.skip("MPI was not initialised with MPI_THREAD_MULTIPLE")


def _signal_inside(public, reached: threading.Event):
    """A profile function for the main thread: sets ``reached`` when the main thread enters the
    body of the call ``public`` (mpidist's declared calls keep it as ``__wrapped__``; the wrapper
    around it takes the group before it runs the body).

    This is how the second thread knows, without a timing, that the main thread is inside its call
    rather than about to enter it. (Not at the MPI routine itself: mpi4py's methods are Cython
    functions, which raise no profile events.)
    """
    body = getattr(public, "__wrapped__", public).__code__

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is body:
            reached.set()
    return profile


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("first", sorted(FIRST))
def test_a_second_thread_on_a_busy_group_raises_concurrent_call_error(dist, rank, size, first):
    """Rank 0's main thread is in ``first`` on group g, which cannot complete: rank 1 joins only
    when rank 0's second thread has tried its own call on g. That call raises
    ConcurrentCallError (a RuntimeError) in the second thread at once, naming both calls and the
    group, and without touching MPI: the main thread's call then completes with the right result
    on every rank, and g goes on working."""
    _needs_threads()
    g = dist.new_group(timeout=GROUP_TIMEOUT)
    second_name, second_call = SECOND[first]
    got: dict[str, object] = {}
    bad: list[str] = []
    if rank == 0:
        reached = threading.Event()

        def second():
            try:
                if not reached.wait(JOIN):
                    got["exc"] = f"the main thread never entered {first}'s body"
                    return
                try:
                    second_call(dist, g)
                    got["exc"] = None
                except BaseException as exc:  # whatever it is, the main thread reports it
                    got["exc"] = exc
            finally:
                # rank 1 may now join the main thread's call (a message on the world, not on g)
                dist.send(np.ones(1), dst=1, tag=GO)

        t = threading.Thread(target=second, name="second-caller", daemon=True)
        t.start()
        sys.setprofile(_signal_inside(getattr(dist, first), reached))
        try:
            result = FIRST[first](dist, g, rank)
        finally:
            sys.setprofile(None)
        t.join(JOIN)
        if t.is_alive():
            bad.append(f"the second thread's {second_name} did not return")
        exc = got.get("exc")
        if not isinstance(exc, dist.ConcurrentCallError):
            bad.append(f"the second thread got {exc!r}, not ConcurrentCallError")
        else:
            text = str(exc)
            assert isinstance(exc, RuntimeError)
            for want in (second_name, first, repr(g.group_name)):
                if want not in text:
                    bad.append(f"{want} not in the ConcurrentCallError: {text}")
    else:
        if rank == 1:  # late, on purpose: until rank 0's second thread has made its call
            dist.recv(np.zeros(1), src=0, tag=GO)
        result = FIRST[first](dist, g, rank)
    if first == "all_reduce" and not np.all(result == size * (size + 1) / 2):
        bad.append(f"the first thread's all_reduce gave {result}")
    # the main thread's call completed on every rank; g still works, and gives numpy's sum
    x = np.arange(3, dtype=np.float64) + rank
    dist.all_reduce(x, group=g)
    want = size * np.arange(3) + size * (size - 1) / 2
    if not np.array_equal(x, want):
        bad.append(f"all_reduce on g after the error: {x} != {want}")
    assert_all_ranks_ok(dist, bad)


def _rounds(dist, g, rank, size, offset, rounds, bad):
    """``rounds`` all_reduce and broadcast calls on ``g``, each checked against numpy."""
    try:
        base = np.arange(5, dtype=np.float64)
        for i in range(rounds):
            x = base + rank * 3 + i + offset
            dist.all_reduce(x, group=g)
            want = size * (base + i + offset) + 3 * size * (size - 1) / 2
            if not np.array_equal(x, want):
                bad.append(f"offset {offset} round {i}: all_reduce gave {x}, not {want}")
            b = np.full(2, float(rank + offset))
            dist.broadcast(b, src=i % size, group=g)
            if not np.all(b == i % size + offset):
                bad.append(f"offset {offset} round {i}: broadcast gave {b}")
    except BaseException as exc:  # reported with the mismatches
        bad.append(f"offset {offset}: {exc!r}")


@pytest.mark.mpi(min_size=2)
def test_two_threads_each_on_its_own_group_run_side_by_side(dist, rank, size):
    """The fix ConcurrentCallError names: two groups over the same ranks (``new_group`` twice), the
    main thread calling on one while a second thread calls on the other, 100 rounds each at the
    same time. Every result on both threads equals numpy's, on every rank."""
    _needs_threads()
    mine, theirs = dist.new_group(timeout=GROUP_TIMEOUT), dist.new_group(timeout=GROUP_TIMEOUT)
    bad: list[str] = []
    start = threading.Barrier(2, timeout=JOIN)  # both threads begin together, so their calls overlap

    def second():
        start.wait()
        _rounds(dist, theirs, rank, size, 1000, 100, bad)

    t = threading.Thread(target=second, name="own-group", daemon=True)
    t.start()
    start.wait()
    _rounds(dist, mine, rank, size, 0, 100, bad)
    t.join(JOIN)
    if t.is_alive():
        bad.append("the second thread did not finish its rounds")
    # neither group is broken or left in a call: each still sums with the other's thread gone
    for g in (mine, theirs):
        x = np.ones(2)
        dist.all_reduce(x, group=g)
        if not np.all(x == size):
            bad.append(f"all_reduce on {g.group_name!r} after the threads: {x}")
    assert_all_ranks_ok(dist, bad)
    assert gathered(dist, len(bad)) == [0] * size
