"""Small blocking calls through persistent requests: results against numpy, reuse, eviction, off."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import gathered, rank_data

from mpidist.calls import persistent


@pytest.fixture(autouse=True)
def persistent_on():
    """Persistent requests are off by default (they turn a disagreement into a wait): on here."""
    was = persistent.ON
    persistent.enable(True)
    yield
    persistent.enable(was)


@pytest.fixture
def g(dist):
    """A group of every rank, destroyed (its requests freed) however the test ends."""
    group = dist.new_group()
    yield group
    if group.comm is not None:
        dist.destroy_process_group(group)


def _inputs(size, shape, dtype, seed):
    return [rank_data(r, shape, dtype, seed) for r in range(size)]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int32, np.int64, np.uint8])
def test_repeated_small_all_reduce_reuses_one_request_and_stays_right(dist, g, rank, size, dtype):
    for step in range(5):  # new data every call through the same request
        t = rank_data(rank, (3,), dtype, seed=step)
        dist.all_reduce(t, group=g)
        want = np.sum(_inputs(size, (3,), dtype, step), axis=0, dtype=dtype)
        np.testing.assert_allclose(t, want, rtol=1e-6)  # MPI's order of the sum is its own
    reqs = [k for k in g.persistent if k != "barrier" and k[0] != "broadcast"]
    assert reqs == [((3,), np.dtype(dtype).name, "SUM")]


@pytest.mark.mpi(min_size=2)
def test_every_op_and_avg_through_persistent_requests(dist, g, rank, size):
    ops = {"SUM": np.sum, "PRODUCT": np.prod, "MIN": np.min, "MAX": np.max}
    for name, fn in ops.items():
        for _ in range(2):
            t = rank_data(rank, (2, 2), np.float64)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, name), group=g)
            np.testing.assert_allclose(t, fn(_inputs(size, (2, 2), np.float64, 0), axis=0))
    for _ in range(2):
        t = rank_data(rank, (4,), np.float32)
        dist.all_reduce(t, op=dist.ReduceOp.AVG, group=g)
        np.testing.assert_allclose(t, np.mean(_inputs(size, (4,), np.float32, 0), axis=0), rtol=1e-6)
    for bits in ("BAND", "BOR", "BXOR"):
        t = rank_data(rank, (5,), np.int32)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, bits), group=g)
        want = _inputs(size, (5,), np.int32, 0)
        fold = {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[bits]
        np.testing.assert_array_equal(t, fold.reduce(want, axis=0))
    # a premultiplied sum keeps the nonblocking routine (its factor is not part of the request)
    for factor in (2.0, 3.0):
        t = rank_data(rank, (3,), np.float64)
        dist.all_reduce(t, op=dist.make_premul_sum(factor), group=g)
        np.testing.assert_allclose(t, factor * np.sum(_inputs(size, (3,), np.float64, 0), axis=0))
    assert not any(k[2] == "PREMUL_SUM" for k in g.persistent if isinstance(k, tuple) and len(k) == 3)


@pytest.mark.mpi(min_size=2)
def test_more_shapes_than_the_cache_holds_evict_the_oldest_alike_on_every_rank(dist, g, rank, size):
    n = persistent.MOST + 5
    for _ in range(2):
        for k in range(1, n + 1):
            t = np.full(k, rank + 1.0)
            dist.all_reduce(t, group=g)
            assert np.all(t == size * (size + 1) / 2), (k, t)
        assert len(g.persistent) <= persistent.MOST
    keys = gathered(dist, sorted(map(repr, g.persistent)))
    assert all(k == keys[0] for k in keys)  # the same requests kept on every rank


@pytest.mark.mpi(min_size=2)
def test_small_broadcast_and_barrier_through_persistent_requests(dist, g, rank, size):
    for src in [size - 1, 0, size - 1]:
        t = rank_data(rank, (6,), np.int64, seed=src)
        dist.broadcast(t, src=src, group=g)
        np.testing.assert_array_equal(t, rank_data(src, (6,), np.int64, seed=src))
        dist.barrier(group=g)
    assert "barrier" in g.persistent
    assert ("broadcast", (6,), "int64", size - 1) in g.persistent
    dist.destroy_process_group(g)
    assert g.persistent is None  # freed with the communicator


@pytest.mark.mpi(min_size=2)
def test_large_calls_keep_the_nonblocking_routine(dist, g, rank, size):
    t = np.full(persistent.SMALL // 8 + 1, float(rank))
    dist.all_reduce(t, group=g)
    assert np.all(t == size * (size - 1) / 2)
    assert not g.persistent  # nothing made for a call above SMALL bytes


@pytest.mark.mpi(min_size=2)
def test_turned_off_the_calls_go_on_without_persistent_requests(dist, g, rank, size):
    t = np.ones(2)
    dist.all_reduce(t, group=g)
    assert g.persistent
    persistent.enable(False)
    try:
        assert g.persistent is None  # freed on every rank
        for _ in range(3):
            t = np.full(2, float(rank))
            dist.all_reduce(t, group=g)
            assert np.all(t == size * (size - 1) / 2)
        assert not g.persistent
    finally:
        persistent.enable(True)
    t = np.full(2, float(rank))
    dist.all_reduce(t, group=g)
    assert np.all(t == size * (size - 1) / 2) and g.persistent

