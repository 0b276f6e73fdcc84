"""Collectives on the world group, blocking and async, checked against numpy on known inputs."""

from __future__ import annotations

import numpy as np
import pytest
from collective_cases import CALLS, run, run_all
from helpers import assert_all_ranks_ok, rank_data

from mpidist.calls.path import APART, INSIDE, OWN_SLOT, VECTOR_BYTES, spread, vector_list
from mpidist.core.buffers import as_buffer


@pytest.mark.mpi
@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_collective_on_world(dist, size, async_op, call):
    bad = run(dist, call, None, list(range(size)), async_op)
    assert_all_ranks_ok(dist, bad)


@pytest.mark.mpi
def test_every_collective_on_group_world_object(dist, size):
    """Every case back to back on one communicator, named by the ``group.WORLD`` object."""
    bad = run_all(dist, dist.group.WORLD, list(range(size)), False)
    assert dist.GroupMember.WORLD is dist.group.WORLD
    assert_all_ranks_ok(dist, bad)


@pytest.mark.mpi
@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 0, 3)], ids=["0d", "empty", "1d", "empty3d"])
def test_all_reduce_shapes(dist, rank, size, shape):
    t = rank_data(rank, shape, np.float64)
    dist.all_reduce(t)
    np.testing.assert_allclose(t, sum(rank_data(r, shape, np.float64) for r in range(size)))


@pytest.mark.mpi
def test_all_reduce_returns_same_object_and_keeps_shape(dist, rank, size):
    base = rank_data(rank, (3, 4), np.float32)
    t = base.copy()
    assert dist.all_reduce(t, dist.ReduceOp.MIN) is None
    assert t.shape == (3, 4) and t.dtype == np.float32
    np.testing.assert_array_equal(t, np.min([rank_data(r, (3, 4), np.float32) for r in range(size)], 0))


@pytest.mark.mpi
def test_broadcast_root_array_untouched_and_readonly_root_ok(dist, rank, size):
    src = size - 1
    t = rank_data(rank, (4,), np.int32)
    if rank == src:
        t.setflags(write=False)  # the root only reads
    dist.broadcast(t, src=src)
    np.testing.assert_array_equal(t, rank_data(src, (4,), np.int32))


@pytest.mark.mpi
def test_gather_into_chunks_and_in_place(dist, rank, size):
    dst = size // 2
    whole = np.zeros((size, 3), np.float32)
    mine = rank_data(rank, (3,), np.float32)
    lst = list(whole) if rank == dst else None
    if rank == dst:
        whole[rank] = mine
        dist.gather(whole[rank], lst, dst=dst)  # tensor is its own slot: MPI_IN_PLACE
    else:
        dist.gather(mine, lst, dst=dst)
    if rank == dst:
        np.testing.assert_array_equal(whole, np.stack([rank_data(r, (3,), np.float32) for r in range(size)]))


@pytest.mark.mpi
def test_scatter_in_place_and_from_chunks(dist, rank, size):
    src = 0
    full = np.stack([rank_data(r, (3,), np.float64, seed=4) for r in range(size)])
    if rank == src:
        buf = full.copy()
        dist.scatter(buf[src], list(buf), src=src)  # the root's output is its own slot
        np.testing.assert_array_equal(buf, full)
    else:
        t = np.zeros(3)
        dist.scatter(t, None, src=src)
        np.testing.assert_array_equal(t, full[rank])


#: Elements per entry on each side of the vector form's threshold (4 KiB of float32).
ENTRIES = [VECTOR_BYTES // 4 - 1, VECTOR_BYTES // 4, 3000]


def _scattered_rows(size: int, n: int, fill: float) -> tuple[np.ndarray, list[np.ndarray]]:
    """Rows of one buffer with a gap after each, listed last row first: not back to back, so
    the list is staged, or named where it lies by the vector form."""
    buf = np.full((size, n + 5), fill, np.float32)
    return buf, [buf[size - 1 - i, :n] for i in range(size)]


@pytest.mark.mpi
@pytest.mark.parametrize("n", ENTRIES)
def test_gather_into_entries_apart_leaves_the_gaps(dist, rank, size, n):
    dst = size - 1
    buf, lst = _scattered_rows(size, n, -1.0)
    dist.gather(rank_data(rank, (n,), np.float32), lst if rank == dst else None, dst=dst)
    ok = True
    if rank == dst:
        ok = all(np.array_equal(lst[r], rank_data(r, (n,), np.float32)) for r in range(size))
        ok = ok and bool(np.all(buf[:, n:] == -1.0))
    assert_all_ranks_ok(dist, [] if ok else [f"rank {rank}: gather into rows apart, n={n}"])


@pytest.mark.mpi
@pytest.mark.parametrize("n", ENTRIES)
def test_gather_whose_tensor_lies_in_another_entry(dist, rank, size, n):
    """The root's tensor is inside the list but not its own slot: MPI must not write over it
    while it still reads it."""
    dst = 0
    if rank == dst:
        buf, lst = _scattered_rows(size, n, -1.0)
        mine = lst[(dst + 1) % size]
        mine[:] = rank_data(rank, (n,), np.float32)
        dist.gather(mine, lst, dst=dst)
        ok = all(np.array_equal(lst[r], rank_data(r, (n,), np.float32)) for r in range(size))
    else:
        dist.gather(rank_data(rank, (n,), np.float32), None, dst=dst)
        ok = True
    assert_all_ranks_ok(dist, [] if ok else [f"rank {rank}: gather from inside the list, n={n}"])


@pytest.mark.mpi
@pytest.mark.parametrize("n", ENTRIES)
@pytest.mark.parametrize("where", ["apart", "own slot", "another entry"])
def test_scatter_from_entries_apart(dist, rank, size, n, where):
    src = size // 2
    full = [rank_data(r, (n,), np.float32, seed=5) for r in range(size)]
    if rank != src:
        t = np.zeros(n, np.float32)
        dist.scatter(t, None, src=src)
        ok = np.array_equal(t, full[rank])
    else:
        buf, lst = _scattered_rows(size, n, -1.0)
        for r in range(size):
            lst[r][:] = full[r]
        t = {"apart": np.zeros(n, np.float32), "own slot": lst[src],
             "another entry": lst[(src + 1) % size]}[where]
        dist.scatter(t, lst, src=src)
        ok = np.array_equal(t, full[src]) and bool(np.all(buf[:, n:] == -1.0))
        if where != "another entry":
            ok = ok and all(np.array_equal(lst[r], full[r]) for r in range(size))
    assert_all_ranks_ok(dist, [] if ok else [f"rank {rank}: scatter {where}, n={n}"])


def _a2a_count(i: int, j: int, n: int) -> int:
    """Elements rank i sends rank j: rank 0 exchanges n with everyone (its sizes are all equal),
    the others send themselves n + 1, so the ranks' own lists are equal on one rank only."""
    return n if (i == 0 or j == 0 or i != j) else n + 1


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3000])
@pytest.mark.parametrize("layout", ["apart", "one buffer", "same list"])
def test_all_to_all_lists_where_one_rank_has_equal_sizes(dist, rank, size, n, layout):
    """Every rank calls the same MPI routine whatever its own sizes; each entry is read and
    written where it lies, the gaps between entries stay as they were, and a list given as
    both input and output is read before it is written."""
    def value(i, j, k):
        return rank_data(i * 131 + j, (k,), np.float64, seed=6)

    sends = [value(rank, j, _a2a_count(rank, j, n)) for j in range(size)]
    expect = [value(j, rank, _a2a_count(j, rank, n)) for j in range(size)]
    if layout == "apart":
        outs = [np.full(_a2a_count(j, rank, n), -1.0) for j in range(size)]
        ins = sends
    elif layout == "one buffer":  # each list inside one buffer, entries in reverse order, gaps between
        k = max(len(e) for e in expect) + 3
        back = np.full((size, k), -1.0)
        outs = [back[size - 1 - j, :len(expect[j])] for j in range(size)]
        front = np.full((size, k), -2.0)
        ins = [front[size - 1 - j, :len(sends[j])] for j in range(size)]
        for j in range(size):
            ins[j][:] = sends[j]
    else:  # the same arrays in and out (the counts are symmetric: rank i sends j what j sends i)
        outs = ins = [s.copy() for s in sends]
    dist.all_to_all(outs, ins)
    ok = all(np.array_equal(outs[j], expect[j]) for j in range(size))
    if layout == "one buffer":
        ok = ok and all(bool(np.all(back[size - 1 - j, len(expect[j]):] == -1.0)) for j in range(size))
    assert_all_ranks_ok(dist, [] if ok else [f"rank {rank}: all_to_all {layout}, n={n}"])


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3000])
def test_all_to_all_single_splits_where_one_rank_has_equal_sizes(dist, rank, size, n):
    """Split sizes given on every rank, equal on rank 0 only; and an even split given as sizes
    on one side and left out on the other, against the call with none."""
    sends = [_a2a_count(rank, j, n) for j in range(size)]
    gets = [_a2a_count(j, rank, n) for j in range(size)]
    x = np.concatenate([rank_data(rank * 131 + j, (sends[j],), np.float64, seed=7) for j in range(size)])
    y = np.full(sum(gets), -1.0)
    dist.all_to_all_single(y, x, gets, sends)
    expect = np.concatenate([rank_data(j * 131 + rank, (gets[j],), np.float64, seed=7) for j in range(size)])
    ok = np.array_equal(y, expect)
    x = rank_data(rank, (size * 4, n), np.float32, seed=8)
    y, y_none = np.empty_like(x), np.empty_like(x)
    dist.all_to_all_single(y, x, None, np.array([4] * size))
    dist.all_to_all_single(y_none, x)
    ok = ok and np.array_equal(y, y_none)
    assert_all_ranks_ok(dist, [] if ok else [f"rank {rank}: all_to_all_single, n={n}"])


@pytest.mark.mpi
@pytest.mark.parametrize("call", ["all_to_all", "scatter", "gather", "scatter chunks",
                                  "reduce_scatter chunks"])
def test_async_list_calls_keep_their_lists_alive(dist, rank, size, call):
    """MPI names the entries of a list by address only: the Work must keep them alive, so a list
    the caller drops before ``wait()`` (and memory taken again at once) changes nothing."""
    import gc

    m = 1 << 17  # 1 MiB of float64 per entry: past MPI's eager sizes
    def fill(i, j):
        return np.full(m, i * 100 + j, np.float64)

    if call == "all_to_all":
        outs = [np.zeros(m) for _ in range(size)]
        work = dist.all_to_all(outs, [fill(rank, j) for j in range(size)], async_op=True)
        expect = [fill(j, rank) for j in range(size)]
    elif call == "scatter":
        outs = [np.zeros(m)]
        work = dist.scatter(outs[0], [fill(0, j) for j in range(size)] if rank == 0 else None, src=0,
                            async_op=True)
        expect = [fill(0, rank)]
    elif call == "scatter chunks":  # small entries, back to back: MPI_Scatter over a view of them
        outs = [np.zeros(100)]
        lst = list(np.arange(size * 100, dtype=np.float64).reshape(size, 100)) if rank == 0 else None
        work = dist.scatter(outs[0], lst, src=0, async_op=True)
        del lst
        expect = [np.arange(rank * 100, rank * 100 + 100, dtype=np.float64)]
    elif call == "reduce_scatter chunks":
        outs = [np.zeros(m)]
        chunks = list(np.stack([fill(rank, j) for j in range(size)]))
        work = dist.reduce_scatter(outs[0], chunks, async_op=True)
        del chunks
        expect = [sum(fill(i, rank) for i in range(size))]
    else:
        lst = [np.zeros(m) for _ in range(size)] if rank == 0 else None
        outs = lst or []
        work = dist.gather(fill(rank, 0), lst, dst=0, async_op=True)
        del lst
        expect = [fill(j, 0) for j in range(size)] if rank == 0 else []
    gc.collect()
    taken = [np.full(m, -1.0) for _ in range(2 * size)]  # would reuse freed memory
    work.wait()
    ok = all(np.array_equal(o, e) for o, e in zip(outs, expect))
    ok = ok and all(bool(np.all(t == -1.0)) for t in taken)
    assert_all_ranks_ok(dist, [] if ok else [f"rank {rank}: async {call} after its list was dropped"])


@pytest.mark.mpi
def test_a_list_is_named_where_it_lies_unless_it_cannot_be(dist):
    """The vector form's buffer over a list: entries in any order are used where they lie;
    overlapping entries, an entry part of an element off, or a list with no bytes are staged.
    The root's own array is told apart: its own slot, inside another entry, or elsewhere."""
    d = as_buffer(np.zeros(1, np.float32), None, "t", False, [])[1]
    buf = np.zeros(40, np.float32)
    elsewhere = np.zeros(10, np.float32)

    def pairs(*arrays):
        return [(a, d) for a in arrays]

    lst = pairs(buf[30:40], buf[0:10], buf[12:22])
    spec, post, where = vector_list(lst, d, True, elsewhere, 0)
    assert post is None and spec[1] == ([10, 10, 10], [30, 0, 12]) and where == APART
    assert vector_list(lst, d, True, buf[30:40], 0)[2] == OWN_SLOT
    assert vector_list(lst, d, True, buf[30:40], 1)[2] == INSIDE
    assert vector_list(lst, d, False, buf[20:25], 1)[2] == INSIDE
    assert vector_list(lst, d, False, buf[22:30], 1)[2] == APART  # in the span, in a gap
    assert spread(pairs(buf[0:10], buf[10:20]), d)[2] == [0, 10]
    assert spread(pairs(buf[0:10], buf[5:15]), d) is None
    assert spread(pairs(buf[0:0], buf[0:0]), d) is None
    raw = np.zeros(100, np.uint8)
    assert spread(pairs(raw[0:40].view(np.float32), raw[41:81].view(np.float32)), d) is None
    spec, post, where = vector_list(pairs(buf[0:10], buf[5:15]), d, True, elsewhere, 0)
    assert post is not None and spec[1] == ([10, 10], [0, 10]) and spec[0].size == 20
    whole = buf[0:20]
    spec, post, where = vector_list(pairs(whole[0:10], whole[5:15]), d, False, buf[3:5], 0)
    assert where == APART and spec[0].size == 20  # the list was copied: the root's array is apart


@pytest.mark.mpi
def test_reduce_scatter_tensor_output_inside_input(dist, rank, size):
    inp = np.concatenate([rank_data(rank, (2,), np.float64, seed=j) for j in range(size)])
    want = sum(rank_data(r, (2,), np.float64, seed=rank) for r in range(size))
    out = inp[2 * rank:2 * rank + 2]  # overlapping send/recv: staged internally
    dist.reduce_scatter_tensor(out, inp)
    np.testing.assert_allclose(out, want)


@pytest.mark.mpi
def test_reduce_scatter_chunked_input_and_premul(dist, rank, size):
    factor = 0.5
    whole = np.stack([rank_data(rank, (3,), np.float32, seed=j) for j in range(size)])
    out = np.zeros(3, np.float32)
    dist.reduce_scatter(out, list(whole), op=dist.make_premul_sum(factor))
    want = sum(factor * rank_data(r, (3,), np.float32, seed=rank) for r in range(size))
    np.testing.assert_allclose(out, want, rtol=1e-5)
    # the caller's inputs are not scaled in place
    np.testing.assert_array_equal(whole[0], rank_data(rank, (3,), np.float32, seed=0))


@pytest.mark.mpi
def test_all_to_all_single_1d_default_splits_async(dist, rank, size):
    inp = np.arange(size * 2, dtype=np.int64) + 100 * rank
    out = np.empty_like(inp)
    w = dist.all_to_all_single(out, inp, async_op=True)
    assert w.wait()
    want = np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 100 * j for j in range(size)])
    np.testing.assert_array_equal(out, want)


@pytest.mark.mpi
def test_all_to_all_equal_separate_lists(dist, rank, size):
    ins = [np.full((2, 2), 10 * rank + j, np.uint8) for j in range(size)]
    outs = [np.zeros((2, 2), np.uint8) for _ in range(size)]
    dist.all_to_all(outs, ins)
    for j in range(size):
        np.testing.assert_array_equal(outs[j], np.full((2, 2), 10 * j + rank, np.uint8))


# -- Work / Future ---------------------------------------------------------------------------


@pytest.mark.mpi
def test_work_api_all_reduce(dist, rank, size):
    t = np.full(3, rank + 1.0)
    w = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
    assert isinstance(w, dist.Work)
    assert isinstance(w.is_completed(), bool)
    fut = w.get_future()
    value = fut.wait()
    assert value[0] is t  # the future's value is the output tensor list, as in torch
    want = np.full(3, sum(range(1, size + 1)) / size)
    np.testing.assert_allclose(t, want)  # AVG's divide ran on completion
    assert w.is_completed() and w.is_success() and w.exception() is None
    assert w.wait() is True  # waiting twice is harmless
    assert w.result()[0] is t
    np.testing.assert_allclose(t, want)  # ... and does not divide again
    assert fut.done()
    chained = fut.then(lambda f: f.value()[0].sum())
    assert chained.wait() == pytest.approx(want.sum())


@pytest.mark.mpi
def test_work_wait_with_timeout_argument(dist, rank, size):
    t = np.ones(2)
    w = dist.all_reduce(t, async_op=True)
    assert w.wait(timeout=60) is True
    w2 = dist.barrier(async_op=True)
    from datetime import timedelta
    assert w2.wait(timeout=timedelta(seconds=60)) is True
    np.testing.assert_array_equal(t, np.full(2, float(size)))


@pytest.mark.mpi
def test_several_async_ops_in_flight(dist, rank, size):
    a = np.full(4, float(rank))
    b = np.zeros(4)
    if rank == 0:
        b[:] = 7
    wa = dist.all_reduce(a, async_op=True)
    wb = dist.broadcast(b, src=0, async_op=True)
    wc = dist.barrier(async_op=True)
    for w in (wc, wb, wa):  # completion order differs from start order
        w.wait()
    np.testing.assert_array_equal(a, np.full(4, float(sum(range(size)))))
    np.testing.assert_array_equal(b, np.full(4, 7.0))


# -- bad arguments: raised locally, same on every rank, and the runtime keeps working --------


def _still_works(dist, size):
    t = np.ones(2)
    dist.all_reduce(t)
    np.testing.assert_array_equal(t, np.full(2, float(size)))


BAD_CALLS = {
    "all_gather wrong list length": (
        ValueError, "has {n1} entries",
        lambda d, r, n: d.all_gather([np.zeros(2)] * (n + 1), np.zeros(2))),
    "all_gather own slot size": (
        ValueError, "tensor_list[",
        lambda d, r, n: d.all_gather([np.zeros(3) for _ in range(n)], np.zeros(2))),
    "all_gather dtype mix": (
        TypeError, "expected float64",
        lambda d, r, n: d.all_gather([np.zeros(2, np.float32) for _ in range(n)], np.zeros(2))),
    "all_gather not a list": (
        TypeError, "must be a list",
        lambda d, r, n: d.all_gather(np.zeros((n, 2)), np.zeros(2))),
    "all_gather_into_tensor size": (
        ValueError, "world_size * input_tensor.numel()",
        lambda d, r, n: d.all_gather_into_tensor(np.zeros(2 * n + 1), np.zeros(2))),
    "all_gather_into_tensor dtype": (
        TypeError, "output_tensor is float32",
        lambda d, r, n: d.all_gather_into_tensor(np.zeros(2 * n, np.float32), np.zeros(2))),
    "broadcast src out of range": (
        ValueError, "src={n}",
        lambda d, r, n: d.broadcast(np.zeros(2), src=n)),
    "broadcast no src": (
        ValueError, "is required",
        lambda d, r, n: d.broadcast(np.zeros(2))),
    "broadcast src and group_src": (
        ValueError, "not both",
        lambda d, r, n: d.broadcast(np.zeros(2), src=0, group_src=0)),
    "broadcast group_src out of range": (
        ValueError, "group_src=-1",
        lambda d, r, n: d.broadcast(np.zeros(2), group_src=-1)),
    "broadcast float src": (
        TypeError, "int rank",
        lambda d, r, n: d.broadcast(np.zeros(2), src=0.0)),
    "reduce dst out of range": (
        ValueError, "dst={n}",
        lambda d, r, n: d.reduce(np.zeros(2), dst=n)),
    "gather list on non-dst": (
        ValueError, ("only on the destination", "gather_list' is required"),
        lambda d, r, n: d.gather(np.zeros(2), [np.zeros(2)] * n if n > 1 else None, dst=(r + 1) % n)),
    "gather missing list": (
        ValueError, "gather_list",
        lambda d, r, n: d.gather(np.zeros(2), None, dst=r)),
    "gather wrong entry size": (
        ValueError, "gather_list[",
        lambda d, r, n: d.gather(np.zeros(2), [np.zeros(3) for _ in range(n)], dst=r)),
    "scatter missing list": (
        ValueError, "scatter_list",
        lambda d, r, n: d.scatter(np.zeros(2), None, src=r)),
    "scatter wrong entry size": (
        ValueError, "scatter_list[",
        lambda d, r, n: d.scatter(np.zeros(2), [np.zeros(1) for _ in range(n)], src=r)),
    "reduce_scatter entry size": (
        ValueError, "input_list[",
        lambda d, r, n: d.reduce_scatter(np.zeros(2), [np.zeros(3) for _ in range(n)])),
    "reduce_scatter_tensor size": (
        ValueError, "world_size * output.numel()",
        lambda d, r, n: d.reduce_scatter_tensor(np.zeros(2), np.zeros(2 * n + 1))),
    "all_to_all wrong list length": (
        ValueError, "entries",
        lambda d, r, n: d.all_to_all([np.zeros(1)] * (n + 1), [np.zeros(1)] * (n + 1))),
    "all_to_all dtype mix": (
        TypeError, "dtype",
        lambda d, r, n: d.all_to_all([np.zeros(1, np.int32) for _ in range(n)],
                                     [np.zeros(1) for _ in range(n)])),
    "all_to_all_single splits sum": (
        ValueError, "sum to the first dimension",
        lambda d, r, n: d.all_to_all_single(np.zeros(n), np.zeros(n), None, [n + 1] + [0] * (n - 1))),
    "all_to_all_single splits length": (
        ValueError, "entries",
        lambda d, r, n: d.all_to_all_single(np.zeros(n), np.zeros(n), [1] * (n + 1), None)),
    "all_to_all_single not divisible": (
        ValueError, ("not divisible", "sum to the first dimension"),
        lambda d, r, n: d.all_to_all_single(np.zeros(n + 1), np.zeros(n + 1)) if n > 1
        else d.all_to_all_single(np.zeros(2), np.zeros(2), [3], None)),
    "all_to_all_single row width": (
        ValueError, "rows",
        lambda d, r, n: d.all_to_all_single(np.zeros((n, 2)), np.zeros((n, 3)))),
    "all_to_all_single dtype": (
        TypeError, "input is",
        lambda d, r, n: d.all_to_all_single(np.zeros(n), np.zeros(n, np.float32))),
    "all_reduce bad op": (
        TypeError, "op must be",
        lambda d, r, n: d.all_reduce(np.zeros(2), op="sum")),
    "all_reduce bad group": (
        TypeError, "group must be",
        lambda d, r, n: d.all_reduce(np.zeros(2), group="world")),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_arguments_raise_locally(dist, rank, size, case):
    exc, texts, fn = BAD_CALLS[case]
    texts = (texts,) if isinstance(texts, str) else texts
    with pytest.raises(exc) as info:
        fn(dist, rank, size)
    msg = str(info.value)
    assert msg.startswith(f"{msg.split(':')[0]}: rank {rank}: "), msg
    assert any(t.format(n=size, n1=size + 1) in msg for t in texts), msg
    _still_works(dist, size)
