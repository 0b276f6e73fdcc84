"""MPIDIST_DEBUG: DETAIL catches mismatched collectives on every rank, INFO logs each call.

The job started with ``MPIDIST_DEBUG`` set is in ``test_debug_jobs.py``.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from helpers import gathered, rank_data

from mpidist.checks import debug


@pytest.fixture
def detail(dist):
    debug.set_debug_level("DETAIL")
    yield dist
    debug.set_debug_level("OFF")


def same_error_everywhere(dist, exc_info, kind=ValueError) -> str:
    """The error text, after checking every rank raised the same type and text."""
    assert exc_info.type is kind
    texts = gathered(dist, str(exc_info.value))
    assert len(set(texts)) == 1, texts
    return texts[0]


def test_levels_parse_and_round_trip():
    for value, want in (("detail", debug.DebugLevel.DETAIL), ("INFO", debug.DebugLevel.INFO),
                        (0, debug.DebugLevel.OFF), (debug.DebugLevel.DETAIL, debug.DebugLevel.DETAIL)):
        debug.set_debug_level(value)
        assert debug.get_debug_level() is want
        assert debug.LEVEL == int(want)
    debug.set_debug_level("OFF")
    for bad in ("LOUD", 3, True, None):
        with pytest.raises(ValueError, match="OFF, INFO or DETAIL"):
            debug.set_debug_level(bad)
    assert debug.get_debug_level() is debug.DebugLevel.OFF


def test_env_variable_sets_level(monkeypatch):
    monkeypatch.setenv("MPIDIST_DEBUG", "INFO")
    debug.set_debug_level_from_env()
    assert debug.get_debug_level() is debug.DebugLevel.INFO
    monkeypatch.setenv("MPIDIST_DEBUG", "chatty")
    with pytest.raises(ValueError, match="MPIDIST_DEBUG='chatty'"):
        debug.set_debug_level_from_env()
    debug.set_debug_level("OFF")


@pytest.mark.mpi
def test_detail_leaves_results_unchanged(detail, rank, size):
    dist = detail
    x = rank_data(rank, (5,), np.float32)
    every = [rank_data(r, (5,), np.float32) for r in range(size)]
    dist.all_reduce(x)
    np.testing.assert_allclose(x, np.sum(every, axis=0), rtol=1e-6)
    b = rank_data(rank, (3,), np.int64, seed=1)
    dist.broadcast(b, src=0)
    np.testing.assert_array_equal(b, rank_data(0, (3,), np.int64, seed=1))
    out = np.empty(2 * size, np.int32)
    dist.all_gather_into_tensor(out, np.full(2, rank, np.int32))
    np.testing.assert_array_equal(out, np.repeat(np.arange(size), 2))
    inp = np.arange(size * 2, dtype=np.float64) + rank
    res = np.empty(size * 2, np.float64)
    work = dist.all_to_all_single(res, inp, async_op=True)
    work.wait()
    want = np.concatenate([np.arange(size * 2.0)[2 * rank:2 * rank + 2] + r for r in range(size)])
    np.testing.assert_array_equal(res, want)
    dist.barrier()


@pytest.mark.mpi
def test_sequence_numbers_count_calls_per_group(detail, rank, size):
    dist = detail
    pg = dist.group.WORLD
    before = debug.last_seq(pg) or 0
    for _ in range(3):
        dist.barrier()
    assert debug.last_seq(pg) == before + 3
    assert gathered(dist, debug.last_seq(pg)) == [before + 3] * size


@pytest.mark.mpi(min_size=2)
def test_wrong_shape_raises_on_every_rank(detail, rank, size):
    dist = detail
    last = size - 1
    x = np.ones(5 if rank == last else 4, np.float32)
    with pytest.raises(ValueError) as info:
        dist.all_reduce(x)
    text = same_error_everywhere(dist, info)
    others = "rank 0" if size == 2 else f"ranks 0–{last - 1}"  # a run of ranks reads as a range
    assert text.startswith("all_reduce #")
    assert f"{others} passed float32 (4,), rank {last} passed float32 (5,)" in text
    np.testing.assert_array_equal(x, np.ones_like(x))  # no MPI call ran: data untouched
    y = np.full(3, rank + 1.0)
    dist.all_reduce(y)  # the runtime stays usable
    np.testing.assert_array_equal(y, np.full(3, size * (size + 1) / 2))


@pytest.mark.mpi(min_size=2)
def test_wrong_dtype_raises_on_every_rank(detail, rank, size):
    dist = detail
    x = np.ones(4, np.float64 if rank == 1 else np.float32)
    with pytest.raises(ValueError) as info:
        dist.reduce(x, dst=0)
    text = same_error_everywhere(dist, info)
    assert "reduce #" in text and "rank 1 passed float64 (4,)" in text and "float32 (4,)" in text


@pytest.mark.mpi(min_size=2)
def test_wrong_root_raises_on_every_rank(detail, rank, size):
    dist = detail
    src = 1 if rank == size - 1 else 0
    with pytest.raises(ValueError) as info:
        dist.broadcast(np.zeros(2), src=src)
    text = same_error_everywhere(dist, info)
    assert "broadcast #" in text and "'src'" in text and f"rank {size - 1} passed 1" in text


@pytest.mark.mpi(min_size=2)
def test_wrong_op_raises_on_every_rank(detail, rank, size):
    dist = detail
    op = dist.ReduceOp.MAX if rank == 0 else dist.ReduceOp.SUM
    with pytest.raises(ValueError) as info:
        dist.all_reduce(np.ones(2), op=op)
    assert "'op': rank 0 passed MAX" in same_error_everywhere(dist, info)


@pytest.mark.mpi(min_size=2)
def test_wrong_typed_argument_fails_every_rank_not_just_its_own(detail, rank, size):
    dist = detail
    tensor = [1.0, 2.0] if rank == 1 else np.ones(2)
    with pytest.raises(TypeError) as info:
        dist.all_reduce(tensor)
    text = same_error_everywhere(dist, info, TypeError)
    assert "rank 1 passed [float, float]" in text
    assert "rank 1 raised TypeError" in text and "must be a numpy array" in text


@pytest.mark.mpi(min_size=2)
def test_local_error_on_the_root_only_reaches_every_rank(detail, rank, size):
    dist = detail
    with pytest.raises(ValueError) as info:
        dist.gather(np.ones(2), gather_list=None, dst=0)  # the root forgot its gather_list
    text = same_error_everywhere(dist, info)
    assert "rank 0 raised ValueError" in text and "gather_list" in text


@pytest.mark.mpi(min_size=2)
def test_different_collectives_are_named(detail, rank, size):
    dist = detail
    with pytest.raises(ValueError) as info:
        if rank == 0:
            dist.all_reduce(np.ones(2))
        else:
            dist.barrier()
    text = same_error_everywhere(dist, info)
    assert "called different collectives" in text
    assert "rank 0 called all_reduce #" in text and "called barrier #" in text


@pytest.mark.mpi(min_size=2)
def test_all_to_all_counts_checked_pairwise(detail, rank, size):
    dist = detail
    splits = [1] * size
    if rank == 0:
        splits[1], splits[0] = 2, 0  # rank 0 sends 2 rows to rank 1, which expects 1
    inp = np.ones(size, np.float32)
    with pytest.raises(ValueError) as info:
        dist.all_to_all_single(np.empty(size, np.float32), inp, input_split_sizes=splits)
    text = same_error_everywhere(dist, info)
    assert "rank 0 sends 2 elements to rank 1, which expects 1" in text


@pytest.mark.mpi(min_size=2)
def test_mismatch_inside_a_subgroup_names_global_ranks(detail, rank, size):
    dist = detail
    members = [0, size - 1]
    g = dist.new_group(members)
    if rank in members:
        with pytest.raises(ValueError) as info:
            dist.all_reduce(np.ones(3 if rank == size - 1 else 2), group=g)
        assert f"rank {size - 1} passed float64 (3,)" in str(info.value)
        dist.destroy_process_group(g)
    dist.barrier()


@pytest.mark.mpi
def test_info_logs_each_call_with_its_sequence_number(dist, rank, caplog):
    debug.set_debug_level("INFO")
    try:
        with caplog.at_level(logging.INFO, logger="mpidist"):
            dist.all_reduce(np.ones(2))
            dist.barrier()
    finally:
        debug.set_debug_level("OFF")
    lines = [r.getMessage() for r in caplog.records if r.name == "mpidist"]
    assert any(f"rank {rank}: all_reduce #" in m and " us" in m for m in lines), lines
    assert any("barrier #" in m for m in lines), lines


def test_detail_overhead_is_not_on_the_fast_path_when_off():
    # OFF: a declared collective's only debug cost is its entry reading one attribute
    from mpidist.core import registry

    assert debug.LEVEL == 0 and registry.hook() is None
    hooked = [c for c in registry.REGISTRY.values() if c.fingerprint is not None]
    assert len(hooked) >= 16
    for c in hooked:
        assert c.function.__wrapped__.call is c and "_hook" in c.function.__code__.co_names


@pytest.mark.mpi
def test_detail_checks_object_collectives_and_keeps_results(detail, rank, size):
    dist = detail
    objs = [{"r": rank}, [rank] * 2] if rank == size - 1 else [None, None]
    dist.broadcast_object_list(objs, src=size - 1)
    assert objs == [{"r": size - 1}, [size - 1] * 2]
    every = [None] * size
    dist.all_gather_object(every, ("x", rank))
    assert every == [("x", r) for r in range(size)]
    got = [None] * size if rank == 0 else None
    dist.gather_object(rank * 10, got, dst=0)
    if rank == 0:
        assert got == [r * 10 for r in range(size)]
    out = [None]
    dist.scatter_object_list(out, [f"to {r}" for r in range(size)] if rank == 0 else None, src=0)
    assert out == [f"to {rank}"]


@pytest.mark.mpi(min_size=2)
def test_detail_names_mismatched_object_broadcast_root(detail, rank, size):
    dist = detail
    objs = [rank, rank]
    src = 1 if rank == 1 else 0  # rank 1 alone thinks it is the source
    with pytest.raises(ValueError) as exc_info:
        dist.broadcast_object_list(objs, src=src)
    text = same_error_everywhere(dist, exc_info)
    assert text.startswith("broadcast_object_list #") and "src" in text and "rank 1" in text, text
    assert objs == [rank, rank]  # nothing was sent
    lengths = [None] * size
    dist.all_gather_object(lengths, len(objs))  # the runtime still works
    assert lengths == [2] * size
