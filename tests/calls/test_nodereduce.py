"""The large all_reduce within a node (``mpidist.calls.nodereduce``), against numpy on gathered inputs.

Every rank of these jobs runs on one node, so each group of two or more ranks sums arrays of at
least ``MIN_BYTES`` in its shared segment. The sum is made in rank order, one part per rank, so it
must equal numpy's left fold of the gathered inputs bit for bit, on every rank.
"""

from __future__ import annotations

import hashlib
import os
import warnings

import numpy as np
import pytest
from helpers import gathered, rank_data

from mpidist import ReduceOp
from mpidist.calls import nodereduce
from mpidist.checks import signature
from mpidist.core import bell

#: Elements of float32 at the threshold, and a size of two and a half (larger) chunks and an odd tail.
AT = nodereduce.MIN_BYTES // 4
ODD = (5 * nodereduce.CHUNK_SHARED // 2) // 4 + 7


def _fold(inputs):
    """The sum in rank order, in the inputs' dtype: ((x0 + x1) + x2) + ..."""
    out = inputs[0].copy()
    for x in inputs[1:]:
        out = out + x
    return out


def _took_the_segment(pg) -> bool:
    return nodereduce._windows.get(pg) is not None


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "uint8", "complex128"])
@pytest.mark.parametrize("count", [AT, ODD, 3 * nodereduce.CHUNK_SHARED + 1])
def test_the_sum_is_numpys_fold_bit_for_bit_on_every_rank(dist, rank, size, dtype, count):
    count = max(count, -(-nodereduce.MIN_BYTES // np.dtype(dtype).itemsize))
    x = rank_data(rank, (count,), dtype, seed=count % 97)
    want = _fold([rank_data(r, (count,), dtype, seed=count % 97) for r in range(size)])
    y = x.copy()
    dist.all_reduce(y)
    np.testing.assert_array_equal(y, want)
    digests = gathered(dist, hashlib.sha256(y.tobytes()).hexdigest())
    assert len(set(digests)) == 1, digests
    assert _took_the_segment(dist.group.WORLD)


@pytest.mark.mpi(min_size=2)
def test_average_premul_sum_and_shapes(dist, rank, size):
    x = rank_data(rank, (1000, AT // 1000 + 3), "float64")
    inputs = [rank_data(r, x.shape, "float64") for r in range(size)]
    y = x.copy()
    dist.all_reduce(y, op=ReduceOp.AVG)
    np.testing.assert_allclose(y, _fold(inputs) / size, rtol=1e-12)
    y = x.copy()
    dist.all_reduce(y, op=dist._make_nccl_premul_sum(0.5))
    np.testing.assert_allclose(y, _fold([v * 0.5 for v in inputs]), rtol=1e-12)
    # MAX is not summed here: MPI's own reduction, the same answer
    y = x.copy()
    dist.all_reduce(y, op=ReduceOp.MAX)
    np.testing.assert_array_equal(y, np.maximum.reduce(inputs))


@pytest.mark.mpi(min_size=2)
def test_torch_tensors_are_summed_in_place(dist, rank, size):
    torch = pytest.importorskip("torch")
    t = torch.full((AT + 5,), float(rank + 1))
    before = t.data_ptr()
    dist.all_reduce(t)
    assert t.data_ptr() == before
    assert torch.all(t == size * (size + 1) / 2)


@pytest.mark.mpi(min_size=3)
def test_subgroups_have_segments_of_their_own(dist, rank, size):
    members = list(range(1, size))  # an odd or even subgroup, not starting at rank 0
    g = dist.new_group(members)
    x = np.full(AT, rank + 1, np.float32)
    if rank in members:
        dist.all_reduce(x, group=g)
        assert (x == sum(r + 1 for r in members)).all()
        assert _took_the_segment(g)
        # its chunk follows the node's ranks, which share its cores, not the subgroup's alone
        shared = bell.ranks_per_core(size) > 1
        assert nodereduce._windows[g].chunk == (nodereduce.CHUNK_SHARED if shared else nodereduce.CHUNK)
    y = np.full(AT, 1.0, np.float32)
    dist.all_reduce(y)
    assert (y == size).all()
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_the_chunk_is_smaller_where_each_rank_has_a_core(dist, rank, size):
    """1 MiB chunks where the group's ranks each have a core, 2 MiB where they share cores (fewer
    barriers to wait at for a peer that is not running); both sum the same."""
    x = np.full(AT + 5, rank + 1, np.float32)
    dist.all_reduce(x)
    assert (x == size * (size + 1) // 2).all()
    chunk = nodereduce._windows[dist.group.WORLD].chunk
    # the rule, and an independent reading of this machine's cores for the cases it decides
    assert bell.local_size == size  # every rank of these jobs runs on one node
    assert chunk == (nodereduce.CHUNK if bell.ranks_per_core(size) == 1 else nodereduce.CHUNK_SHARED)
    if len(os.sched_getaffinity(0)) == os.cpu_count():  # not bound by the launcher
        assert (chunk == nodereduce.CHUNK) == (size <= os.cpu_count())


@pytest.mark.mpi(min_size=2)
def test_ranks_that_read_their_cores_differently_agree_on_the_chunk(dist, rank, size, monkeypatch):
    """Each rank reads its own cores (a launcher may bind some and not others): rank 0 here
    believes the node crowded, the others not. The window's layout must still be one."""
    if rank == 0:
        monkeypatch.setattr(bell, "local_size", 64 * (os.cpu_count() or 1))
    g = dist.new_group(list(range(size)))
    x = rank_data(rank, (3 * nodereduce.CHUNK_SHARED // 4 + 11,), "float32")
    want = _fold([rank_data(r, x.shape, "float32") for r in range(size)])
    dist.all_reduce(x, group=g)
    np.testing.assert_array_equal(x, want)
    assert gathered(dist, nodereduce._windows[g].chunk) == [nodereduce.CHUNK_SHARED] * size
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("sampled", [False, True], ids=["segment-finds-it", "check-due"])
def test_ranks_that_pass_different_arrays_all_raise(dist, rank, size, sampled):
    world = dist.group.WORLD
    dist.all_reduce(np.ones(1))  # the world's record exists and has seen an all_reduce
    if not sampled:  # the sampled cross-rank check not due at the bad call: the segment's check finds it
        world.signatures.due = world.signatures.n + 10
    bad = np.ones(AT + rank, np.float32)
    errors = []
    try:
        dist.all_reduce(bad)
    except ValueError as exc:
        errors.append(str(exc))
    everyone = gathered(dist, errors)
    assert all(len(e) == 1 for e in everyone), everyone
    # the segment's check names every rank's array; the sampled signature check, when due, its count
    assert all("different sizes or dtypes" in e[0] or "'count'" in e[0] for e in everyone), everyone
    good = np.ones(AT, np.float32)
    dist.all_reduce(good)
    assert (good == size).all()
    if world.signatures.sigs:  # a check now does not report the bad call again
        signature.check(world, world.signatures)


@pytest.mark.mpi(min_size=2)
def test_off_leaves_every_sum_to_mpi(dist, rank, size, monkeypatch):
    monkeypatch.setattr(nodereduce, "ON", False)
    g = dist.new_group()
    x = np.full(AT, rank + 1.0, np.float32)
    dist.all_reduce(x, group=g)
    assert (x == size * (size + 1) / 2).all()
    assert g not in nodereduce._windows


@pytest.mark.mpi(min_size=2)
def test_below_the_threshold_mpi_sums(dist, rank, size):
    g = dist.new_group()
    x = np.full(AT - 1, rank + 1.0, np.float32)
    dist.all_reduce(x, group=g)
    assert (x == size * (size + 1) / 2).all()
    assert g not in nodereduce._windows


@pytest.mark.mpi(min_size=2)
def test_overflow_gives_inf_without_a_warning_as_mpi_does(dist, rank, size):
    x = np.full(AT, 3e38, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist.all_reduce(x)
    assert np.isinf(x).all() and (x > 0).all()
