"""The node's bell (mpidist/core/bell.py): masks, the futex ring across processes, and waits
that sleep instead of spinning while a member of the group is not in the call yet.

Every rank of these jobs runs on one node, so the world's mask has a bit per rank. Results are
checked against numpy on every rank's inputs; nothing here times MPI's speed.
"""

from __future__ import annotations

import glob
import time

import numpy as np
import pytest
from helpers import assert_all_ranks_ok, gathered, rank_data

from mpidist.calls import native
from mpidist.checks import signature
from mpidist.core import bell, timeouts, waiting

pytestmark = pytest.mark.skipif(bell._impl is None or not bell.ALLOWED,
                                reason="no bell: the C module is not built, or MPIDIST_BELL=0")


@pytest.mark.mpi(min_size=2)
def test_the_world_and_its_groups_get_a_bit_per_member(dist, rank, size):
    assert bell.on(), bell.why_not
    assert dist.group.WORLD.bell == (1 << size) - 1
    odd = dist.new_group([r for r in range(size) if r % 2])
    bad = []
    if rank % 2:
        want = sum(1 << r for r in range(1, size, 2))
        if odd.bell != (want if size > 3 else 0):  # a group of one rank waits on nobody
            bad.append(f"odd ranks' mask {odd.bell:b}, expected {want:b}")
    assert_all_ranks_ok(dist, bad)


@pytest.mark.mpi(min_size=2)
def test_no_page_is_left_in_dev_shm(dist):
    assert not glob.glob("/dev/shm/mpidist-bell-*")


@pytest.mark.mpi(min_size=2)
def test_a_ring_wakes_a_sleeper_in_another_process(dist, rank, size):
    """Rank 0 sleeps on the bell for up to 20 s; rank 1 starts a wait, which rings it."""
    impl = bell._impl
    if rank == 0:
        seen = impl.bell_arm()
    dist.barrier()
    bad = []
    if rank == 0:
        t0 = time.monotonic()
        rang = impl.bell_sleep(seen, 20.0)
        took = time.monotonic() - t0
        if not rang or took > 10.0:
            bad.append(f"rang={rang} after {took:.3f} s")
    elif rank == 1:
        time.sleep(0.05)
        bell.enter()  # starting a wait rings the bell where a rank sleeps on it
        bell.leave()
    assert_all_ranks_ok(dist, bad)


@pytest.mark.mpi(min_size=2)
def test_a_sleep_with_no_ring_ends_on_time(dist, rank):
    impl = bell._impl
    dist.barrier()
    bad = []
    if rank == 0:  # the others are out of the barrier and call nothing for a second: no ring
        time.sleep(0.3)
        t0 = time.monotonic()
        rang = impl.bell_sleep(impl.bell_arm(), 0.05)
        took = time.monotonic() - t0
        stale = impl.bell_sleep(impl.bell_arm() + 1, 5.0)  # the count moved on: returns at once
        if rang or not 0.04 < took < 0.5 or not stale or time.monotonic() - t0 > 2.0:
            bad.append(f"rang={rang} after {took:.3f} s, stale={stale}")
    else:
        time.sleep(1.0)
    assert_all_ranks_ok(dist, bad)
    # the same page on every rank: whoever enters is seen by the others
    mask = dist.group.WORLD.bell
    if rank == 0:
        bell.enter()
    dist.barrier()
    time.sleep(0.3)  # every rank is out of the barrier's own wait
    mine = [bell.all_in(mask), bell.all_in(1)]
    time.sleep(0.3)  # and nobody in the next call's wait before every rank has looked
    seen = gathered(dist, mine)
    if rank == 0:
        bell.leave()
    dist.barrier()
    time.sleep(0.3)
    assert all(s == [False, True] for s in seen), seen
    assert not bell.all_in(1)


@pytest.fixture
def long_spin(monkeypatch):
    """A spin of 0.25 s before a wait sleeps, in Python and in the C calls: where the bell did
    not hold the spin back, a wait for a rank 0.3 s late would burn most of that on the CPU."""
    monkeypatch.setattr(waiting, "SPIN_LEAST", 0.25)
    monkeypatch.setattr(waiting, "SPIN", 0.25)
    native.enable(native.ALLOWED)
    yield
    monkeypatch.undo()
    native.enable(native.ALLOWED)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("call", ["all_reduce", "reduce", "broadcast", "all_gather_into_tensor"])
def test_a_wait_for_a_late_rank_sleeps_instead_of_spinning(dist, rank, size, call, monkeypatch, long_spin):
    """The last rank computes for 0.3 s first: the others' waits (the C path or the Python one)
    spin for at most :data:`~mpidist.core.bell.alone` at a time while it is away (never the
    0.25 s spin), they sleep on the bell, and the result is right."""
    spins = []
    real = waiting.spin_on

    def counted(done, end, *more):
        t0 = time.time()  # one clock for every process of the node
        try:
            return real(done, end, *more)
        finally:
            spins.append((t0, time.time() - t0))

    monkeypatch.setattr(timeouts, "spin_on", counted)
    monkeypatch.setattr(waiting, "spin_on", counted)
    x = rank_data(rank, (5,), np.float64)
    if rank == size - 1:
        time.sleep(0.3)
    arrived = time.time()
    t0 = time.process_time()
    if call == "all_reduce":
        dist.all_reduce(x)
        want = sum(rank_data(r, (5,), np.float64) for r in range(size))
    elif call == "reduce":
        dist.reduce(x, dst=0)
        want = sum(rank_data(r, (5,), np.float64) for r in range(size)) if rank == 0 else x
    elif call == "broadcast":
        dist.broadcast(x, src=size - 1)
        want = rank_data(size - 1, (5,), np.float64)
    else:
        out = np.empty(5 * size)
        dist.all_gather_into_tensor(out, x)
        x, want = out, np.concatenate([rank_data(r, (5,), np.float64) for r in range(size)])
    cpu = time.process_time() - t0
    bad = [] if np.allclose(x, want) else [f"{call}: {x} != {want}"]
    late = gathered(dist, arrived)[-1]
    early = sum(took for t, took in spins if t < late)  # the short spins while a member is away
    if rank != size - 1 and early > 0.05:
        bad.append(f"spun {early:.3f} s before the last rank arrived")
    if rank != size - 1 and cpu > 0.08:  # the 0.25 s spin would take most of it
        bad.append(f"{cpu:.3f} s of CPU while waiting 0.3 s")
    assert_all_ranks_ok(dist, bad)


@pytest.mark.mpi(min_size=2)
def test_many_calls_with_late_ranks_in_turn_stay_right(dist, rank, size):
    """Each round a different rank is late by a few milliseconds: rings and sleeps interleave
    with the spins; every result is checked against numpy, and nothing hangs."""
    sub = dist.new_group(list(range(size - 1, -1, -1)))
    bad = []
    for i in range(40):
        if rank == i % size:
            time.sleep(0.002 * (1 + i % 3))
        x = rank_data(rank, (3 + i % 4,), np.float32, seed=i)
        g = sub if i % 2 else None
        dist.all_reduce(x, group=g)
        want = sum(rank_data(r, x.shape, np.float32, seed=i) for r in range(size))
        if not np.allclose(x, want, rtol=1e-5):
            bad.append(f"round {i}: {x} != {want}")
        if i % 5 == 0:
            dist.barrier()
    assert_all_ranks_ok(dist, bad)


def _raw_barrier() -> None:
    """A barrier that is no wait of mpidist's: it leaves the bell as it is."""
    from mpi4py import MPI
    MPI.COMM_WORLD.Barrier()


@pytest.mark.mpi(min_size=2)
def test_a_member_in_its_last_call_is_late_for_this_one_and_one_done_with_it_is_not(dist, rank, size):
    """Rank 0 waits for call 1000 of a group; the others are in call 999 first, then leave it:
    they are late (rank 0's spin stops after :data:`~mpidist.core.bell.alone` and it may sleep
    until they ring), though rank 0 saw them in a wait. Then they reach call 1000, do their part
    and go on: no longer late, and rank 0 spins on for ``gone`` seconds. The ticket's group is
    made up, so no real call matches it."""
    mask = dist.group.WORLD.bell
    tag = mask ^ (1 << 62)
    this, before = bell.ticket(tag, 1000), bell.ticket(tag, 999)
    gone = 0.2
    seen = []
    if rank == 0:
        bell.enter(this)
    else:
        bell._impl.bell_enter(1, before)
    _raw_barrier()
    if rank == 0:
        state = bell.watch()
        seen.append(bell.look(state, mask, this, gone))  # all in: spin
    _raw_barrier()
    if rank:
        bell.leave()
    _raw_barrier()
    if rank == 0:
        time.sleep(bell.alone + 0.02)
        seen.append(bell.look(state, mask, this, gone))  # they went back to computing: late
    _raw_barrier()
    if rank:
        bell.arrive(tag, 1000)  # done with call 1000, out of any wait
    _raw_barrier()
    if rank == 0:
        state = bell.watch()
        seen.append(bell.look(state, mask, this, gone))  # done: spin on for gone seconds
        time.sleep(gone + 0.05)
        seen.append(bell.look(state, mask, this, gone))  # and then stop
        bell.leave()
    _raw_barrier()  # the others in no wait of mpidist's until then
    want = [0, bell.LATE | bell.STOP, 0, bell.STOP]
    assert gathered(dist, seen)[0] == want


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("call", ["all_reduce", "broadcast", "all_gather_into_tensor", "async all_reduce",
                                  "check in C", "check in Python"])
def test_every_collective_publishes_its_ticket(dist, rank, size, call, monkeypatch):
    """Once every rank has made a call (the C path, the Python one, or ``async_op`` and
    ``wait()``), a wait for that call sees every member arrived, and one for the next call sees
    them late; point-to-point waits publish nothing. The cross-rank check's exchange, which
    names its call by a string, publishes the ticket of the call it checks."""
    world = dist.group.WORLD
    x = rank_data(rank, (4,), np.float64)
    if call.startswith("check"):
        if call == "check in Python":
            monkeypatch.setattr(signature, "IN_C", None)
        elif signature.IN_C is None:
            pytest.skip("the C path is not built")
        dist.all_reduce(x)
        bell.arrive(world.bell, world.seq - 1)  # as if this rank's last call were the one before
        assert signature.agreed(world, "all_reduce", 12345)
    elif call == "all_reduce":
        dist.all_reduce(x)
    elif call == "broadcast":
        dist.broadcast(x, src=size - 1)
    elif call == "all_gather_into_tensor":
        dist.all_gather_into_tensor(np.empty(4 * size), x)
    else:
        dist.all_reduce(x, async_op=True).wait()
    if size > 1:  # a send and a receive on the same group change no ticket
        if rank == 0:
            dist.send(x, dst=1)
        elif rank == 1:
            dist.recv(x, src=0)
    _raw_barrier()
    mask, seq = world.bell, world.seq
    looks = [bell.look(bell.watch(), mask, bell.ticket(mask, s), 1.0) & bell.LATE for s in (seq, seq + 1)]
    _raw_barrier()
    assert looks == [0, bell.LATE], (seq, looks)
