"""Object collectives: all six calls, numpy arrays inside objects, large payloads (in 1 MiB units past
MPI's int counts), and errors."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import gathered, rank_data, still_works

from mpidist.calls import objects


def obj_of(r: int):
    """A rank's object: nested containers with numpy arrays."""
    return {"rank": r, "name": f"r{r}", "arr": rank_data(r, (3, 2), np.float32),
            "nested": [(r, np.arange(r + 1, dtype=np.int64))], "none": None}


def same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.mpi
def test_broadcast_object_list_every_src(dist, rank, size):
    for src in range(size):
        lst = [obj_of(rank), "x", rank] if rank == src else [None, None, None]
        kw = {"src": src} if src % 2 == 0 else {"group_src": src}
        assert dist.broadcast_object_list(lst, **kw) is None
        assert same(lst, [obj_of(src), "x", src])


@pytest.mark.mpi
def test_all_gather_object(dist, rank, size):
    out = [None] * size
    dist.all_gather_object(out, obj_of(rank))
    assert all(same(out[r], obj_of(r)) for r in range(size))


@pytest.mark.mpi
def test_gather_object_every_dst(dist, rank, size):
    for dst in range(size):
        out = [None] * size if rank == dst else None
        dist.gather_object(obj_of(rank), out, dst=dst)
        if rank == dst:
            assert all(same(out[r], obj_of(r)) for r in range(size))


@pytest.mark.mpi
def test_scatter_object_list_every_src(dist, rank, size):
    for src in range(size):
        inputs = [obj_of(r) for r in range(size)] if rank == src else None
        out = [None]
        dist.scatter_object_list(out, inputs, src=src)
        assert same(out[0], obj_of(rank))


@pytest.mark.mpi(min_size=2)
def test_send_recv_object_list(dist, rank, size):
    if rank != 0:
        dist.send_object_list([obj_of(rank), rank * 10], dst=0)
    else:
        senders = []
        for _ in range(size - 1):
            lst = [None, None]
            src = dist.recv_object_list(lst)  # any source
            senders.append(src)
            assert same(lst, [obj_of(src), src * 10])
        assert sorted(senders) == list(range(1, size))
    dist.barrier()  # the any-source loop must not see the next message
    # and from a named source
    if rank == size - 1:
        dist.send_object_list(["hi"], dst=0)
    elif rank == 0:
        lst = [None]
        assert dist.recv_object_list(lst, src=size - 1) == size - 1 and lst == ["hi"]


@pytest.mark.mpi(min_size=2)
def test_any_source_object_recv_skips_array_messages(dist, rank, size):
    if rank == 1:
        dist.send(np.array([3.0]), dst=0)  # an array message on the same communicator and tag 0
        dist.send_object_list([{"k": 1}], dst=0)
    elif rank == 0:
        lst = [None]
        assert dist.recv_object_list(lst) == 1 and lst == [{"k": 1}]
        t = np.zeros(1)
        assert dist.recv(t) == 1 and t[0] == 3.0
    still_works(dist, size)


@pytest.mark.mpi
def test_object_calls_on_subgroup(dist, rank, size):
    members = list(range(size - 1, -1, -2))  # odd sizes leave rank 0 in, even sizes leave it out
    pg = dist.new_group(members)
    members.sort()
    if rank in members:
        out = [None] * len(members)
        dist.all_gather_object(out, obj_of(rank), group=pg)
        assert all(same(out[i], obj_of(g)) for i, g in enumerate(members))
        lst = [obj_of(rank)]
        dist.broadcast_object_list(lst, src=members[-1], group=pg)
        assert same(lst, [obj_of(members[-1])])
        res = [None]
        dist.scatter_object_list(res, [obj_of(g) for g in members] if pg.rank() == 0 else None,
                                 group_src=0, group=pg)
        assert same(res[0], obj_of(rank))
    still_works(dist, size)


@pytest.mark.mpi
def test_large_object(dist, rank, size):
    n = 100 * 2**20  # ~100 MB
    src = size - 1
    payload = None
    if rank == src:
        payload = np.arange(n, dtype=np.uint8)
    lst = [{"big": payload, "tail": "end"}]
    dist.broadcast_object_list(lst, src=src)
    big = lst[0]["big"]
    ok = (big.shape == (n,) and big.dtype == np.uint8 and lst[0]["tail"] == "end"
          and int(big[::4096].astype(np.int64).sum()) == int((np.arange(0, n, 4096) % 256).sum())
          and big[-1] == (n - 1) % 256)
    del big, lst, payload
    assert all(gathered(dist, ok))


@pytest.fixture(params=["in the head", "apart"])
def small_counts(request, monkeypatch):
    """MPI's int limit as 3000 bytes, 256-byte units, 1000-byte pieces: the >2 GiB paths, on
    small payloads. "apart": arrays from 512 bytes on travel as messages of their own."""
    from mpidist.calls import pickles
    monkeypatch.setattr(pickles, "INT_MAX", 3000)
    monkeypatch.setattr(pickles, "UNIT", 256)
    monkeypatch.setattr(pickles, "PIECE", 1000)
    monkeypatch.setattr(objects, "APART", 512 if request.param == "apart" else pickles.INLINE)


def sized(r: int, n: int) -> dict:
    """An object whose pickle is about ``n`` bytes, different on every rank."""
    return {"rank": r, "data": rank_data(r, (n // 8,), np.float64)}


@pytest.mark.mpi
def test_every_object_call_past_int_counts(dist, rank, size, small_counts):
    """Pickles over the (lowered) int limit travel as padded units; every result is exact."""
    # uneven: padding differs per rank; rank 0's fits the first exchange's slot, the others' not
    objs = [sized(r, 8 if r == 0 else 1000 + 700 * r) for r in range(size)]
    got = [None] * size
    dist.all_gather_object(got, objs[rank])
    assert same(got, objs)
    for root in range(size):
        lst = [objs[root], rank] if rank == root else [None, None]
        dist.broadcast_object_list(lst, src=root)
        assert same(lst, [objs[root], root])
        into = [None] * size if rank == root else None
        dist.gather_object(objs[rank], into, dst=root)
        if rank == root:
            assert same(into, objs)
        out = [None]
        dist.scatter_object_list(out, [sized(root + r, 3100) for r in range(size)] if rank == root else None,
                                 src=root)
        assert same(out[0], sized(root + rank, 3100))
    if size > 1:  # one message of 4 KB: units on the wire, the exact size back
        if rank == 0:
            dist.send_object_list([sized(7, 4000)], dst=size - 1)
        elif rank == size - 1:
            lst = [None]
            assert dist.recv_object_list(lst) == 0
            assert same(lst[0], sized(7, 4000))
    still_works(dist, size)


OBJ_ERRORS = {
    "all_gather_object length": (ValueError, "entries",
                                 lambda d, r, n: d.all_gather_object([None] * (n + 1), 1)),
    "all_gather_object not list": (TypeError, "must be a list, got tuple",
                                   lambda d, r, n: d.all_gather_object((None,) * n, 1)),
    "broadcast not list": (TypeError, "must be a list",
                           lambda d, r, n: d.broadcast_object_list("ab", src=0)),
    "broadcast no src": (ValueError, "required", lambda d, r, n: d.broadcast_object_list([1])),
    "gather list on non-dst": (ValueError, "only on the destination|required",
                               lambda d, r, n: d.gather_object(1, [None] * n if n > 1 else None,
                                                               dst=(r + 1) % n)),
    "gather wrong length": (ValueError, "entries", lambda d, r, n: d.gather_object(1, [None], dst=r)
                            if n > 1 else d.gather_object(1, [None, None], dst=r)),
    "scatter empty output": (ValueError, "at least one",
                             lambda d, r, n: d.scatter_object_list([], None, src=0)),
    "scatter missing input": (ValueError, "required",
                              lambda d, r, n: d.scatter_object_list([None], None, src=r)),
    "send to self": (ValueError, "this rank itself", lambda d, r, n: d.send_object_list([1], dst=r)),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", sorted(OBJ_ERRORS))
def test_object_argument_errors(dist, rank, size, case):
    exc, text, fn = OBJ_ERRORS[case]
    with pytest.raises(exc, match=f"rank {rank}: .*({text})"):
        fn(dist, rank, size)
    still_works(dist, size)


@pytest.mark.mpi(min_size=2)
def test_recv_object_list_length_mismatch(dist, rank, size):
    err = None
    if rank == 1:
        dist.send_object_list([1, 2, 3], dst=0)
    elif rank == 0:
        with pytest.raises(ValueError) as info:
            dist.recv_object_list([None], src=1)
        err = str(info.value)
    errs = gathered(dist, err)
    assert "rank 1 sent 3 objects" in errs[0]
    still_works(dist, size)


def odd_arrays(r: int) -> list:
    """Arrays pickle hands out of band and in band: odd sizes, a strided view, empty, 0-d, records."""
    base = rank_data(r, (7, 5), np.float64)
    rec = np.zeros(3, dtype=[("a", np.int8), ("b", np.float64)])
    rec["a"], rec["b"] = r, r / 3
    return [rank_data(r, (13,), np.float32), base[:, 1::2], np.zeros(0), np.array(r + 0.5), rec,
            bytearray(b"x" * (r + 1)), np.arange(r + 3, dtype=np.int16)]


@pytest.mark.mpi
@pytest.mark.parametrize("call", ["all_gather_object", "broadcast_object_list", "send_object_list"])
@pytest.mark.parametrize("apart", [8, 1 << 62])
def test_arrays_arrive_whole_aligned_and_writable(dist, rank, size, call, apart, monkeypatch):
    monkeypatch.setattr(objects, "APART", apart)  # 8: every buffer of 8 bytes on apart
    got = [None] * size
    if call == "all_gather_object":
        dist.all_gather_object(got, odd_arrays(rank))
    elif call == "broadcast_object_list":
        for src in range(size):
            lst = [odd_arrays(rank) if rank == src else None]
            dist.broadcast_object_list(lst, src=src)
            got[src] = lst[0]
    else:  # a ring: each rank sends its arrays to the next (even ranks first, odd ones after receiving)
        if size == 1:
            pytest.skip("send_object_list needs a peer")
        nxt, prev, lst = (rank + 1) % size, (rank - 1) % size, [None]
        if rank % 2 == 0:
            dist.send_object_list([odd_arrays(rank)], dst=nxt)
        assert dist.recv_object_list(lst, src=prev) == prev
        if rank % 2:
            dist.send_object_list([odd_arrays(rank)], dst=nxt)
        got = [odd_arrays(r) for r in range(size)]
        got[prev] = lst[0]
    for r, objs in enumerate(got):
        assert same(objs[:5] + objs[6:], (odd_arrays(r)[:5] + odd_arrays(r)[6:])), r
        assert objs[5] == odd_arrays(r)[5]
        for a in objs:
            if isinstance(a, np.ndarray) and a.size:
                assert a.flags.aligned and a.flags.writeable, (r, a.dtype)
                a[...] = a  # writable views of the received message
    still_works(dist, size)


@pytest.mark.mpi
@pytest.mark.parametrize("apart", [8, 1 << 62])
def test_scatter_object_list_by_point_to_point(dist, rank, size, apart, monkeypatch):
    """Past SCATTER_APART bytes (lowered to 0 here) each rank gets its pickle by MPI_Isend, its
    buffers sent apart (8: every buffer of 8 bytes on) or in the head; the source keeps a copy."""
    monkeypatch.setattr(objects, "SCATTER_APART", 0)
    monkeypatch.setattr(objects, "APART", apart)
    for src in range(size):
        inputs = [odd_arrays(r) for r in range(size)] if rank == src else None
        out = [None]
        dist.scatter_object_list(out, inputs, src=src)
        got, want = out[0], odd_arrays(rank)
        assert same(got[:5] + got[6:], want[:5] + want[6:]) and got[5] == want[5], src
        for a in got:
            if isinstance(a, np.ndarray) and a.size:
                assert a.flags.aligned and a.flags.writeable, (src, a.dtype)
        if rank == src:  # a copy, as every other rank gets: writing it leaves the input alone
            got[0][...] = -1
            assert same(inputs[rank], odd_arrays(rank))
    still_works(dist, size)


@pytest.mark.mpi
def test_scatter_object_list_of_large_arrays(dist, rank, size):
    """2 MiB to every rank (by point to point at the default threshold), checked on every rank."""
    n = 2 << 20
    src = size - 1
    inputs = [np.full(n, r % 251, np.uint8) for r in range(size)] if rank == src else None
    out = [None]
    dist.scatter_object_list(out, inputs, src=src)
    ok = out[0].shape == (n,) and bool(np.all(out[0] == rank % 251))
    assert all(gathered(dist, ok))


UNPICKLABLE = {
    "all_gather_object": lambda d, bad, r, n: d.all_gather_object([None] * n, bad if r == n - 1 else r),
    "gather_object": lambda d, bad, r, n: d.gather_object(bad if r == n - 1 else r,
                                                          [None] * n if r == 0 else None, dst=0),
    "broadcast_object_list": lambda d, bad, r, n: d.broadcast_object_list([bad if r == n - 1 else None],
                                                                          src=n - 1),
    "scatter_object_list": lambda d, bad, r, n: d.scatter_object_list(
        [None], [bad] * n if r == n - 1 else None, src=n - 1),
}


@pytest.mark.mpi
@pytest.mark.parametrize("call", sorted(UNPICKLABLE))
def test_an_object_that_cannot_be_pickled_raises_on_every_rank(dist, rank, size, call):
    """The last rank's object is a lambda: pickle's error there, a ValueError naming it elsewhere."""
    with pytest.raises(Exception) as info:
        UNPICKLABLE[call](dist, lambda: None, rank, size)
    if rank == size - 1:
        assert not isinstance(info.value, ValueError) or "pickle" in str(info.value), info.value
        assert "lambda" in str(info.value) or "pickle" in str(info.value).lower(), info.value
    else:
        assert isinstance(info.value, ValueError), info.value
        assert f"{call}: rank {rank}: rank {size - 1} could not pickle" in str(info.value)
    still_works(dist, size)


@pytest.mark.mpi
def test_point_to_point_object_calls_leave_the_call_number_alone(dist, rank, size, monkeypatch):
    """``ProcessGroup.seq`` numbers the group's collectives alike on every member (timeout
    reports and notices go by it): ``send_object_list`` and
    ``recv_object_list``, which only some ranks make, and the point-to-point path of
    ``scatter_object_list`` must not count on some ranks only."""
    monkeypatch.setattr(objects, "SCATTER_APART", 0)
    world = dist.group.WORLD
    before = world.seq
    for _ in range(3):
        if size > 1 and rank == 0:
            dist.send_object_list([{"n": 1}, np.arange(5)], dst=1)
        elif size > 1 and rank == 1:
            got = [None, None]
            dist.recv_object_list(got, src=0)
            assert got[0] == {"n": 1} and np.array_equal(got[1], np.arange(5))
    out = [None]
    dist.scatter_object_list(out, [r * 10 for r in range(size)] if rank == 0 else None, src=0)
    assert out[0] == rank * 10
    seqs = gathered(dist, (before, world.seq))
    assert len(set(seqs)) == 1 and seqs[0][1] == before + 1, seqs
