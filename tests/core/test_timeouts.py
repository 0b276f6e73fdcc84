"""Group timeouts raise on every waiting rank, name the ranks not heard from, and break the group."""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import pytest
from helpers import gathered, still_works

from mpidist import GroupTimeoutError

LIMIT = 1.0
# the deadline plus the grace period for peers' notices, with room for an oversubscribed machine
END_BY = LIMIT + 15.0


def _short_group(dist):
    """A group of every rank whose calls time out after LIMIT seconds."""
    return dist.new_group(timeout=timedelta(seconds=LIMIT))


def _timed(fn):
    t0 = time.monotonic()
    try:
        fn()
    except RuntimeError as exc:
        return exc, time.monotonic() - t0
    return None, time.monotonic() - t0


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("how", ["all_reduce", "broadcast", "barrier", "all_gather_into_tensor",
                                 "async_all_reduce", "fp16_all_reduce", "fp16_all_reduce_large",
                                 "fp16_reduce_scatter"])
def test_a_missing_rank_makes_every_waiting_rank_raise(dist, rank, size, how):
    g = _short_group(dist)
    late = size - 1
    t = np.ones(4)

    def call():
        if how == "all_reduce":
            dist.all_reduce(t, group=g)
        elif how == "broadcast":
            dist.broadcast(t, src=late, group=g)  # the root may finish without its receivers
        elif how == "barrier":
            dist.barrier(group=g)
        elif how == "all_gather_into_tensor":
            dist.all_gather_into_tensor(np.zeros(4 * size), t, group=g)
        elif how == "fp16_all_reduce":  # the 16-bit reductions' own steps are bounded too
            dist.all_reduce(t.astype(np.float16), group=g)
        elif how == "fp16_all_reduce_large":  # past the gather path: halves or slices
            dist.all_reduce(np.ones(1 << 16, np.float16), group=g)
        elif how == "fp16_reduce_scatter":
            dist.reduce_scatter_tensor(np.zeros(4, np.float16), np.ones(4 * size, np.float16), group=g)
        else:
            dist.all_reduce(t, group=g, async_op=True).wait()

    report = None
    if rank != late:
        exc, took = _timed(call)
        assert isinstance(exc, dist.GroupTimeoutError), exc
        text = str(exc)
        name = {"async_all_reduce": "all_reduce", "fp16_all_reduce": "all_reduce",
                "fp16_all_reduce_large": "all_reduce", "fp16_reduce_scatter": "reduce_scatter_tensor"
                }.get(how, how)
        assert text.startswith(f"{name}: rank {rank}: ")
        assert f"{name} #1 on group {g.group_name!r}" in text
        assert " Timed out " in text or text.count("Timed out") == 1
        assert f"not heard from rank {late} (" in text, text
        assert LIMIT - 0.1 <= took < END_BY, took
        # the group is broken: the next call raises at once, without waiting
        exc2, took2 = _timed(lambda: dist.barrier(group=g))
        assert "is broken" in str(exc2) and took2 < LIMIT
        report = text
    reports = gathered(dist, report)
    # every waiting rank raised, and each names the same missing rank
    assert all(f"not heard from rank {late} (" in r for r in reports[:late])
    still_works(dist, size)  # the world and other groups keep working


OBJECT_CALLS = {
    "all_gather_object": lambda d, g, late, n: d.all_gather_object([None] * n, {"a": 1}, group=g),
    "broadcast_object_list": lambda d, g, late, n: d.broadcast_object_list([None], src=late, group=g),
    "gather_object": lambda d, g, late, n: d.gather_object(1, [None] * n if d.get_rank() == 0 else None,
                                                           dst=0, group=g),
    "scatter_object_list": lambda d, g, late, n: d.scatter_object_list([None], None, src=late, group=g),
    "recv_object_list": lambda d, g, late, n: d.recv_object_list([None], src=late, group=g),
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("how", sorted(OBJECT_CALLS))
def test_object_calls_raise_past_the_group_timeout(dist, rank, size, how):
    """Pickles travel by nonblocking MPI calls too: a missing rank makes every waiting rank raise."""
    g = _short_group(dist)
    late = size - 1
    report = None
    if rank != late and (how != "recv_object_list" or rank == 0):
        exc, took = _timed(lambda: OBJECT_CALLS[how](dist, g, late, size))
        assert isinstance(exc, dist.GroupTimeoutError), exc
        number = "(point to point, after call #0)" if how == "recv_object_list" else "#1"
        assert str(exc).startswith(f"{how}: rank {rank}: ") and f"{how} {number} on group" in str(exc)
        assert LIMIT - 0.1 <= took < END_BY, took
        report = str(exc)
    reports = gathered(dist, report)
    if how != "recv_object_list":  # every waiting rank names the missing one
        assert all(f"not heard from rank {late} (" in r for r in reports[:late]), reports
    still_works(dist, size)


@pytest.mark.mpi(min_size=2)
def test_a_late_rank_learns_at_once_that_its_peers_gave_up(dist, rank, size):
    g = _short_group(dist)
    late = size - 1
    if rank != late:
        exc, _ = _timed(lambda: dist.all_reduce(np.ones(2), group=g))
        assert isinstance(exc, dist.GroupTimeoutError)
    dist.barrier()  # the late rank arrives after the others have given up
    if rank == late:
        # its first call may still match the collective its peers abandoned (MPI cannot cancel
        # a collective): then it completes with their data; the next call on the group must
        # raise at once, since the peers left it
        t = np.ones(2)
        exc, took = _timed(lambda: dist.all_reduce(t, group=g))
        if exc is None:
            np.testing.assert_array_equal(t, np.full(2, float(size)))
            exc, took = _timed(lambda: dist.all_reduce(t, group=g))
        assert isinstance(exc, dist.GroupTimeoutError), exc
        assert "gave up on all_reduce #1" in str(exc) and took < LIMIT, (str(exc), took)
    still_works(dist, size)


@pytest.mark.mpi(min_size=2)
def test_a_blocking_recv_with_no_sender_raises(dist, rank, size):
    g = _short_group(dist)
    if rank == 0:
        exc, took = _timed(lambda: dist.recv(np.zeros(3), src=1, group=g, tag=5))
        assert isinstance(exc, dist.GroupTimeoutError)
        assert "recv (point to point, after call #0) on group" in str(exc) and took >= LIMIT - 0.1
    still_works(dist, size)


@pytest.mark.mpi(min_size=2)
def test_calls_that_complete_in_time_are_unaffected(dist, rank, size):
    g = _short_group(dist)
    for i in range(20):
        t = np.full(3, float(rank + i))
        dist.all_reduce(t, group=g)
        expect = sum(r + i for r in range(size))
        np.testing.assert_array_equal(t, np.full(3, float(expect)))
    assert g.seq == 20 and g.broken is None
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_torch_backend_raises_past_the_group_timeout(tw, rank, size):
    """torch's own test asks for ' (Timed out|closed|timeout) ' in the message, raised on time."""
    g = tw.new_group(timeout=timedelta(seconds=LIMIT))
    late = size - 1
    if rank != late:
        exc, took = _timed(lambda: tw.barrier(group=g))
        assert exc is not None and " Timed out " in f" {exc} ", exc
        assert LIMIT - 0.1 <= took < END_BY
    tw.barrier()


@pytest.mark.mpi(min_size=2)
def test_abort_hooks_run_once_when_a_call_times_out(tw, rank, size):
    """torch 2.14's ``register_abort_hook``: hooks run before the group goes, once each, in
    registration order; an unregistered one does not, and one that raises is a warning."""
    g = tw.new_group(timeout=timedelta(seconds=LIMIT))
    ran: list[str] = []
    g.register_abort_hook(1, lambda: ran.append("first"))
    g.register_abort_hook(2, lambda: ran.append("gone"))
    g.register_abort_hook(3, lambda: 1 / 0)
    g.register_abort_hook(4, lambda: ran.append("last"))
    g.unregister_abort_hook(2)
    g.unregister_abort_hook(99)  # unknown: nothing happens
    late = size - 1
    if rank != late:
        with pytest.warns(RuntimeWarning, match="abort hook 3 .* raised ZeroDivisionError"):
            exc, _ = _timed(lambda: tw.barrier(group=g))
        assert exc is not None and ran == ["first", "last"]
        _timed(lambda: tw.barrier(group=g))  # broken: raises at once, the hooks do not run again
        assert ran == ["first", "last"]
    else:
        assert ran == []
    tw.barrier()


@pytest.mark.mpi(min_size=2)
def test_torch_barriers_own_timeout_is_kept(tw, rank, size):
    g = tw.new_group()  # the default timeout: only the barrier's own can end the wait
    tw.barrier(group=g, timeout=timedelta(seconds=30))
    late = size - 1
    if rank != late:
        exc, took = _timed(lambda: tw.barrier(group=g, timeout=timedelta(seconds=LIMIT)))
        assert exc is not None and " Timed out " in f" {exc} ", exc
        assert LIMIT - 0.1 <= took < END_BY, took
    tw.barrier()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("explicit", [False, True])
def test_torch_async_work_raises_past_the_group_timeout(tw, rank, size, explicit, monkeypatch):
    """DDP's kind of call: async_op=True, completed by the progress thread, then wait()."""
    import torch

    from mpidist.checks import signature
    from mpidist.torch import backend
    monkeypatch.setattr(backend, "SYNC_BYTES", 0)  # every async call nonblocking, even on one node
    # a group's first calls are checked across ranks before they start, async ones too: that
    # check would time out in the call itself; here the work's own wait is under test
    monkeypatch.setattr(signature, "ON", False)
    g = tw.new_group(timeout=timedelta(seconds=LIMIT))
    late = size - 1
    report = None
    if rank != late:
        work = tw.all_reduce(torch.ones(4), group=g, async_op=True)
        if explicit:  # this rank's own limit: a RuntimeError here only, the work stays waitable
            exc, took = _timed(lambda: work.wait(timeout=timedelta(seconds=0.3)))
            assert exc is not None and "timed out after 0.3 s" in str(exc), exc
            assert not isinstance(exc, GroupTimeoutError) and took < LIMIT
        # explicit: wait(); else the future, as DDP waits from C++ (nobody calls wait())
        exc, took = _timed(work.wait if explicit else lambda: work.get_future().wait())
        assert isinstance(exc, GroupTimeoutError) or "GroupTimeoutError" in str(exc), exc
        assert "all_reduce #1 on group" in str(exc) and f"not heard from rank {late} (" in str(exc)
        assert LIMIT - 0.1 <= took < END_BY, took
        exc2, took2 = _timed(lambda: tw.barrier(group=g))  # the group is broken: at once
        assert exc2 is not None and "is broken" in str(exc2) and took2 < LIMIT, exc2
        report = str(exc)
    reports = gathered_torch(tw, report, size)
    assert all(f"not heard from rank {late} (" in r for r in reports[:late]), reports
    tw.barrier()


def gathered_torch(tw, obj, size):
    out = [None] * size
    tw.all_gather_object(out, obj)
    return out


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("sync_bytes", [0, None])
def test_ddp_raises_when_a_rank_stops_stepping(tw, rank, size, sync_bytes, monkeypatch):
    """DDP waits on its buckets' futures from C++: past the group's timeout backward raises, as
    under gloo. ``sync_bytes=0``: every bucket nonblocking; ``None``: this node's choice."""
    import torch

    from mpidist.torch import backend
    if sync_bytes is not None:
        monkeypatch.setattr(backend, "SYNC_BYTES", sync_bytes)
    g = tw.new_group(timeout=timedelta(seconds=LIMIT))
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4), process_group=g)
    model(torch.ones(2, 8)).sum().backward()  # one step together
    late = size - 1
    report = None
    if rank != late:
        exc, took = _timed(lambda: model(torch.ones(2, 8)).sum().backward())
        assert exc is not None and "Timed out" in str(exc) and "not heard from rank" in str(exc), exc
        assert LIMIT - 0.1 <= took < END_BY, took
        report = str(exc)
    reports = gathered_torch(tw, report, size)
    assert all(f"not heard from rank {late} (" in r for r in reports[:late]), reports
    tw.barrier()


def test_the_spin_before_sleeping_grows_with_the_bytes_a_call_moves():
    from mpi4py import MPI

    from mpidist.core.waiting import SPIN_LEAST, SPIN_MOST, SPIN_PER_BYTE, nbytes_of, spin_for

    a, b = np.ones(7000, np.float32), np.ones(3, np.int64)
    # the shapes a wait's ``keep`` takes: an array, an in-place all_reduce's arguments, a list
    assert nbytes_of(a) == a.nbytes
    assert nbytes_of((MPI.IN_PLACE, [a, MPI.FLOAT], MPI.SUM)) == a.nbytes
    assert nbytes_of(([a, b], memoryview(b))) == a.nbytes + 2 * b.nbytes
    assert nbytes_of(None) == 0
    assert spin_for(0) == SPIN_LEAST < spin_for(a.nbytes) < spin_for(1 << 20) < spin_for(16 << 20)
    assert spin_for(16 << 20) == pytest.approx(SPIN_LEAST + (16 << 20) * SPIN_PER_BYTE)  # the bytes' time
    assert spin_for(1 << 40) == SPIN_MOST


@pytest.mark.mpi(min_size=3)
def test_a_large_gather_moves_while_the_senders_go_on(dist, rank, size):
    """16 MiB from every rank to rank 0; each rank that sent goes on at once and computes for
    1.5 s (here: sleeps), out of any wait. What is left of the gather (the root taking the last
    sends, or a rank of MPI's tree passing 32 MiB on) moves only while its ranks test, so their
    waits must keep testing for as long as their bytes take, though a member is away: when they
    slept instead, rank 0's gather took 3-4 s at 4 ranks on 2 cores (mpi4py: 27 ms).

    The root finishes before any sender comes back from its sleep (so it never needed one to
    test again), and within 1 s (so no rank of the tree crawled). The buffers are written and a
    first gather runs before the one measured: memory a process touches for the first time can
    cost 0.3 s per 48 MiB on a virtual machine, in MPI's copy as anywhere, and a fresh receive
    buffer made a gather of raw mpi4py take up to 0.75 s here."""
    n = 16 << 20
    x = np.full(n, rank % 251, np.uint8)
    into = list(np.zeros((size, n), np.uint8) + 255) if rank == 0 else None
    dist.gather(x, into, dst=0)
    if rank == 0:
        for a in into:
            a.fill(255)
    dist.barrier()
    t0 = time.monotonic()
    dist.gather(x, into, dst=0)
    done = time.monotonic()
    back = None
    if rank != 0:
        time.sleep(1.5)
        back = time.monotonic()
    ok = rank != 0 or all(bool(np.all(a == r % 251)) for r, a in enumerate(into))
    got = gathered(dist, (ok, round(done - t0, 3), done, back))
    root_done = got[0][2]
    first_back = min(b for *_, b in got[1:])
    assert all(o for o, *_ in got), got
    assert root_done < first_back, [(o, took) for o, took, *_ in got]
    assert got[0][1] < 1.0, [(o, took) for o, took, *_ in got]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("async_op", [False, True])
def test_a_barriers_timeout_takes_the_place_of_the_groups(dist, rank, size, async_op):
    g = dist.new_group()  # the default timeout, 30 minutes: only the barrier's own can end the wait
    dist.barrier(group=g, timeout=timedelta(seconds=30))  # every rank arrives: it returns
    late = size - 1
    if rank != late:
        def call():
            work = dist.barrier(group=g, async_op=async_op, timeout=timedelta(seconds=LIMIT))
            if async_op:
                work.wait()

        exc, took = _timed(call)
        assert isinstance(exc, dist.GroupTimeoutError), exc
        assert f"not heard from rank {late} (" in str(exc), str(exc)
        assert LIMIT - 0.1 <= took < END_BY, took
        exc2, took2 = _timed(lambda: dist.barrier(group=g))
        assert "is broken" in str(exc2) and took2 < LIMIT
    with pytest.raises(ValueError, match=rf"^barrier: rank {rank}: timeout must be positive"):
        dist.barrier(timeout=timedelta(0))
    with pytest.raises(TypeError, match=rf"^barrier: rank {rank}: timeout must be a timedelta or seconds"):
        dist.barrier(timeout="5 s")
    still_works(dist, size)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("made", [False, True], ids=["first-call", "after-one"])
def test_a_missing_rank_in_a_large_sum_within_a_node(dist, rank, size, made):
    """A 4 MiB sum, which MPI moves in many steps, is a bounded wait like any other."""
    g = _short_group(dist)
    x = np.ones(1 << 20, np.float32)
    if made:
        dist.all_reduce(x, group=g)
    late = size - 1
    error = None
    if rank != late:
        t0 = time.monotonic()
        with pytest.raises(GroupTimeoutError) as info:
            dist.all_reduce(x, group=g)
        assert LIMIT - 0.1 <= time.monotonic() - t0 < END_BY
        error = str(info.value)
        assert f"not heard from rank {late} (" in error, error
    errors = gathered(dist, error)
    assert all(e and e.startswith(f"all_reduce: rank {r}: ") for r, e in enumerate(errors[:late])), errors
    still_works(dist, size)
