"""The default cross-rank check (``MPIDIST_DEBUG`` unset): ranks that disagree raise, on every rank.

Each case runs on a fresh group, whose first calls are all checked (``checks/signature.py``), with
one rank passing another count, dtype, op, root or split sizes: every rank must raise the same
``ValueError`` and the group (and the world) must work afterwards. Agreeing calls give the same
bytes with the check on and off, and what numpy computes from every rank's inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import gathered, raised_everywhere, rank_data

from mpidist.calls.ops import ReduceOp
from mpidist.checks import signature


@pytest.fixture
def fresh(dist):
    """A new group over every rank (its first calls are checked); freed after the test."""
    assert signature.ON, "the default check must be on when MPIDIST_DEBUG is unset"
    g = dist.new_group(list(range(dist.get_world_size())))
    yield g
    dist.destroy_process_group(g)


def _still_works(dist, g, rank, size):
    """One all_reduce on the group and one on the world, against numpy."""
    every = [rank_data(r, (3,), np.float64, seed=7) for r in range(size)]
    x = every[rank].copy()
    dist.all_reduce(x, group=g)
    np.testing.assert_allclose(x, np.sum(every, axis=0))
    y = np.full(2, float(rank))
    dist.all_reduce(y)
    np.testing.assert_array_equal(y, np.full(2, float(sum(range(size)))))


def _f32(n):
    return np.ones(n, np.float32)


def _cases(dist, g, rank, size):
    """(name, call, what the message must contain) per disagreement; the last rank (or the root) differs."""
    last = size - 1
    bad = rank == last
    root_bad = rank == 0
    k = 3 if bad else 2  # elements per rank
    dst = 1 if bad else 0  # the root this rank names
    s, m = ReduceOp.SUM, ReduceOp.MAX
    return {
        "all_reduce count": (lambda: dist.all_reduce(_f32(5 if bad else 4), group=g),
                             ["all_reduce #", "'count'", f"rank {last} passed 5"]),
        "all_reduce dtype": (lambda: dist.all_reduce(np.ones(4, np.float64 if bad else np.float32), group=g),
                             ["'dtype'", f"rank {last} passed float64"]),
        "all_reduce op": (lambda: dist.all_reduce(np.ones(2), op=m if bad else s, group=g),
                          ["'op'", f"rank {last} passed MAX"]),
        "all_reduce async count": (lambda: dist.all_reduce(_f32(5 if bad else 4), group=g, async_op=True),
                                   ["all_reduce #", "'count'"]),
        "broadcast count, root differs": (lambda: dist.broadcast(_f32(3 if root_bad else 4), src=0, group=g),
                                          ["broadcast #", "'count'", "rank 0 passed 3"]),
        "broadcast src": (lambda: dist.broadcast(_f32(3), src=1 if bad else 0, group=g),
                          ["'src'", f"rank {last} passed 1"]),
        "reduce dst": (lambda: dist.reduce(_f32(3), dst=1 if bad else 0, group=g),
                       ["reduce #", "'dst'", f"rank {last} passed 1"]),
        "reduce op, root differs": (lambda: dist.reduce(_f32(3), dst=0, op=m if root_bad else s, group=g),
                                    ["'op'", "rank 0 passed MAX"]),
        "reduce_scatter_tensor count": (
            lambda: dist.reduce_scatter_tensor(_f32(k), _f32(k * size), group=g),
            ["reduce_scatter_tensor #", "'count'"]),
        "reduce_scatter dtype": (
            lambda: dist.reduce_scatter(np.ones(2, np.float64 if bad else np.float32),
                                        [np.ones(2, np.float64 if bad else np.float32)] * size, group=g),
            ["reduce_scatter #", "'dtype'"]),
        "all_gather_into_tensor count": (
            lambda: dist.all_gather_into_tensor(_f32(k * size), _f32(k), group=g),
            ["all_gather_into_tensor #", "'count'"]),
        "all_gather counts": (
            lambda: dist.all_gather([_f32(3 if bad and r == 0 else 2) for r in range(size)], _f32(2),
                                    group=g),
            ["all_gather #", "'counts'"]),
        "gather count, root differs": (
            lambda: dist.gather(_f32(3 if root_bad else 2),
                                [_f32(3) for _ in range(size)] if root_bad else None, dst=0, group=g),
            ["gather #", "'count'", "rank 0 passed 3"]),
        "gather dst": (
            lambda: dist.gather(_f32(2), [_f32(2) for _ in range(size)] if rank == dst else None, dst=dst,
                                group=g),
            ["'root'", f"rank {last} passed 1"]),
        "scatter count": (
            lambda: dist.scatter(_f32(3 if bad else 2), [_f32(2) for _ in range(size)] if rank == 0 else None,
                                 src=0, group=g),
            ["scatter #", "'count'"]),
        "all_to_all_single split sizes": (
            lambda: dist.all_to_all_single(_f32(size), _f32(size),
                                           input_split_sizes=[0, 2] + [1] * (size - 2) if root_bad else None,
                                           group=g),
            ["all_to_all_single #", "rank 0 sends 2 elements to rank 1, which expects 1"]),
        "all_to_all dtype": (
            lambda: dist.all_to_all([np.empty(1, np.float64 if bad else np.float32) for _ in range(size)],
                                    [np.ones(1, np.float64 if bad else np.float32) for _ in range(size)],
                                    group=g),
            ["all_to_all #", "'dtype'"]),
        "different collectives": (lambda: dist.barrier(group=g) if bad else dist.all_reduce(_f32(2), group=g),
                                  ["called different collectives", f"rank {last} called barrier #"]),
        "broadcast_object_list length": (
            lambda: dist.broadcast_object_list([rank] * (3 if bad else 2), src=0, group=g),
            ["broadcast_object_list #", "'length'", f"rank {last} passed 3"]),
        "gather_object dst": (
            lambda: dist.gather_object(rank, [None] * size if rank == (1 if bad else 0) else None,
                                       dst=1 if bad else 0, group=g),
            ["gather_object #", "'dst'"]),
        "scatter_object_list src": (
            lambda: dist.scatter_object_list([None], list(range(size)) if rank == (1 if bad else 0) else None,
                                             src=1 if bad else 0, group=g),
            ["scatter_object_list #", "'src'"]),
    }


CASES = list(_cases(None, None, 0, 2))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", CASES)
def test_disagreeing_rank_raises_on_every_rank_and_group_stays_usable(fresh, dist, rank, size, case):
    fn, wants = _cases(dist, fresh, rank, size)[case]
    text = raised_everywhere(dist, fn)
    for want in wants:
        assert want in text, (want, text)
    assert f"on group {fresh.group_name!r}" in text
    _still_works(dist, fresh, rank, size)


@pytest.mark.mpi(min_size=2)
def test_checked_call_leaves_the_data_untouched(fresh, dist, rank, size):
    x = rank_data(rank, (5 if rank == size - 1 else 4,), np.float32)
    before = x.copy()
    raised_everywhere(dist, lambda: dist.all_reduce(x, group=fresh))
    np.testing.assert_array_equal(x, before)  # no rank started the MPI routine


@pytest.mark.mpi(min_size=2)
def test_unchecked_mismatch_is_named_at_the_next_check(fresh, dist, rank, size):
    """Past the first calls only some calls are checked; a mismatch in between is named later."""
    for _ in range(signature.FIRST + 3):  # past the group's first calls
        dist.all_reduce(np.ones(2), group=fresh)
    bad_seq = fresh.seq + 1
    got = None
    try:
        dist.all_reduce(np.ones(3 if rank == size - 1 else 2), group=fresh)  # unchecked: returns
        for _ in range(signature.EVERY + 1):
            dist.all_reduce(np.ones(2), group=fresh)
    except ValueError as exc:
        got = str(exc)
    texts = gathered(dist, got)
    assert None not in texts and len(set(texts)) == 1, texts
    assert f"all_reduce #{bad_seq} on group" in texts[0] and "'count'" in texts[0]
    assert "found by the check at call #" in texts[0]
    _still_works(dist, fresh, rank, size)


@pytest.mark.mpi(min_size=2)
def test_every_call_checked_with_every_1(fresh, dist, rank, size):
    every = signature.EVERY
    signature.enable(True, every=1)
    try:
        for _ in range(signature.FIRST + 3):
            dist.all_reduce(np.ones(2), group=fresh)
        text = raised_everywhere(dist, lambda: dist.all_reduce(np.ones(3 if rank == 0 else 2), group=fresh))
        assert f"all_reduce #{fresh.seq} on group" in text and "found by" not in text
    finally:
        signature.enable(True, every=every)


def _agreeing(dist, g, rank, size):
    """Agreeing calls of every family, each result as bytes, and numpy's expectation."""
    xs = [rank_data(r, (6,), np.float32) for r in range(size)]
    got, want = [], []
    a = xs[rank].copy()
    dist.all_reduce(a, group=g)
    got.append(a)
    want.append(np.sum(xs, axis=0, dtype=np.float32))
    b = xs[rank].copy()
    dist.broadcast(b, src=size - 1, group=g)
    got.append(b)
    want.append(xs[size - 1])
    out = np.empty(6 * size, np.float32)
    dist.all_gather_into_tensor(out, xs[rank], group=g)
    got.append(out)
    want.append(np.concatenate(xs))
    rs = np.empty(6 // 2 if size == 2 else 6, np.float32)
    inp = np.tile(xs[rank], size)[:rs.size * size]
    dist.reduce_scatter_tensor(rs, inp, group=g)
    got.append(rs)
    want.append(np.sum([np.tile(x, size)[:rs.size * size] for x in xs], axis=0,
                       dtype=np.float32)[rank * rs.size:(rank + 1) * rs.size])
    a2a = np.empty(size, np.float32)
    dist.all_to_all_single(a2a, np.arange(size, dtype=np.float32) + 10 * rank, group=g)
    got.append(a2a)
    want.append(np.array([rank + 10 * r for r in range(size)], np.float32))
    return got, want


@pytest.mark.mpi(min_size=2)
def test_agreeing_calls_are_bit_identical_with_the_check_on_and_off(fresh, dist, rank, size):
    on, want = _agreeing(dist, fresh, rank, size)
    signature.enable(False)
    try:
        off, _ = _agreeing(dist, fresh, rank, size)
    finally:
        signature.enable(True)
    for a, b, w in zip(on, off, want):
        assert a.tobytes() == b.tobytes()
        np.testing.assert_allclose(a, w, rtol=1e-6)


@pytest.mark.mpi(min_size=2)
def test_off_turns_the_check_off(fresh, dist, rank, size):
    signature.enable(False)
    try:
        x = np.ones(2)
        dist.all_reduce(x, op=dist.ReduceOp.MAX if rank == 0 else dist.ReduceOp.SUM, group=fresh)
    finally:
        signature.enable(True)  # nothing raised: the ranks' results may now differ, unchecked
    assert fresh.signatures is None or not fresh.signatures.sigs
    _still_works(dist, fresh, rank, size)


def test_env_switches(monkeypatch):
    from mpidist.checks import debug

    monkeypatch.setenv("MPIDIST_DEBUG", "OFF")
    debug.set_debug_level_from_env()
    assert not signature.ON and debug.LEVEL == 0
    monkeypatch.delenv("MPIDIST_DEBUG")
    debug.set_debug_level_from_env()
    assert signature.ON and debug.LEVEL == 0
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    debug.set_debug_level_from_torch_env()
    assert debug.get_debug_level() is debug.DebugLevel.DETAIL
    debug.set_debug_level("OFF")
    monkeypatch.setenv("MPIDIST_DEBUG", "INFO")  # mpidist's own switch wins
    debug.set_debug_level_from_torch_env()
    assert debug.get_debug_level() is debug.DebugLevel.OFF
    monkeypatch.delenv("MPIDIST_DEBUG")
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "OFF")
    debug.set_debug_level_from_torch_env()
    assert debug.get_debug_level() is debug.DebugLevel.OFF and signature.ON


@pytest.mark.mpi(min_size=2)
def test_mpi_error_becomes_an_mpidist_error_naming_call_group_and_rank(dist, rank, size):
    """With the check off, a broadcast whose ranks pass different counts fails inside MPI."""
    from mpi4py import MPI

    from mpidist.core import errors

    g = dist.new_group([0, 1])
    got = None
    if rank in (0, 1):
        signature.enable(False)
        try:
            dist.broadcast(np.ones(3 if rank == 0 else 4), src=0, group=g)
        except Exception as exc:  # noqa: BLE001 - its type is what is tested
            got = (type(exc).__name__, str(exc), isinstance(exc, MPI.Exception),
                   isinstance(exc, (ValueError, errors.MPICallError)))
        finally:
            signature.enable(True)
    every = gathered(dist, got)
    group_name = gathered(dist, g.group_name if rank in (0, 1) else None)[0]
    raised = [e for e in every if e is not None]
    assert raised, "MPICH reports the receiver's short message as an error"
    for name, text, raw, ours in raised:
        assert not raw and ours, (name, text)
        assert text.startswith("broadcast: rank ") and f"on group {group_name!r}" in text, text
    if rank in (0, 1):
        y = np.ones(2)
        dist.all_reduce(y, group=g)
        assert y[0] == 2
        dist.destroy_process_group(g)
