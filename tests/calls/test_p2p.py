"""Point-to-point: send/recv with tags and any source, isend/irecv, P2POp batches, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import gathered, rank_data, still_works


@pytest.mark.mpi(min_size=2)
def test_ring_send_recv_with_tags(dist, rank, size):
    right, left = (rank + 1) % size, (rank - 1) % size
    w = dist.isend(rank_data(rank, (4,), np.float64), dst=right, tag=rank)
    t = np.zeros(4)
    sender = dist.recv(t, src=left, tag=left)
    w.wait()
    assert sender == left
    np.testing.assert_array_equal(t, rank_data(left, (4,), np.float64))


@pytest.mark.mpi(min_size=2)
def test_tags_select_messages_out_of_order(dist, rank, size):
    if rank == 0:
        dist.send(np.array([5], np.int64), dst=1, tag=5)
        dist.send(np.array([7], np.int64), dst=1, tag=7)
    elif rank == 1:
        a, b = np.zeros(1, np.int64), np.zeros(1, np.int64)
        assert dist.recv(b, src=0, tag=7) == 0  # eager: the tag-5 message waits
        assert dist.recv(a, src=0, tag=5) == 0
        assert (a[0], b[0]) == (5, 7)
    still_works(dist, size)


@pytest.mark.mpi(min_size=2)
def test_recv_any_source_returns_global_rank(dist, rank, size):
    if rank == 0:
        seen = {}
        for _ in range(size - 1):
            t = np.zeros(3, np.int32)
            src = dist.recv(t)
            seen[src] = t.copy()
        assert sorted(seen) == list(range(1, size))
        for src, t in seen.items():
            np.testing.assert_array_equal(t, rank_data(src, (3,), np.int32))
    else:
        dist.send(rank_data(rank, (3,), np.int32), dst=0)


@pytest.mark.mpi(min_size=3)
def test_subgroup_peers_group_and_global(dist, rank, size):
    # group = global ranks 1..n-1, so group rank g is global rank g + 1
    members = list(range(1, size))
    pg = dist.new_group(members)
    if rank == size - 1:
        dist.send(np.full(2, 9.0), group_dst=0, group=pg, tag=3)  # group rank 0 = global rank 1
        dist.send(np.full(2, 8.0), dst=1, group=pg, tag=4)  # global rank 1
    elif rank == 1:
        a, b = np.zeros(2), np.zeros(2)
        got = dist.recv(a, group=pg, tag=3)  # any source in the group
        assert got == size - 1  # the sender's GLOBAL rank
        assert dist.recv(b, group_src=pg.size() - 1, group=pg, tag=4) == size - 1
        np.testing.assert_array_equal(a, np.full(2, 9.0))
        np.testing.assert_array_equal(b, np.full(2, 8.0))
    if rank in members:
        with pytest.raises(ValueError, match="dst=0 is not a member"):
            dist.send(np.ones(1), dst=0, group=pg)
    still_works(dist, size)


@pytest.mark.mpi(min_size=2)
def test_isend_irecv_any_source(dist, rank, size):
    if rank == 0:
        bufs = [np.zeros(2, np.complex128) for _ in range(size - 1)]
        works = [dist.irecv(b, tag=11) for b in bufs]
        got = {}
        for w, b in zip(works, bufs):
            assert w.wait() is True and w.is_completed()
            got[w.source_rank()] = b.copy()
            assert w.result()[0] is b
        assert sorted(got) == list(range(1, size))
        for src, b in got.items():
            np.testing.assert_array_equal(b, rank_data(src, (2,), np.complex128))
    else:
        w = dist.isend(rank_data(rank, (2,), np.complex128), dst=0, tag=11)
        w.wait()
        assert w.is_completed()
    still_works(dist, size)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("by_group_peer", [False, True])
def test_batch_isend_irecv_ring(dist, rank, size, by_group_peer):
    right, left = (rank + 1) % size, (rank - 1) % size
    send_buf = rank_data(rank, (3, 2), np.float32)
    from_left, from_right = np.zeros((3, 2), np.float32), np.zeros((3, 2), np.float32)
    peer = "group_peer" if by_group_peer else "peer"
    ops = [dist.P2POp(dist.isend, send_buf, **{peer: right}, tag=1),
           dist.P2POp(dist.isend, send_buf, **{peer: left}, tag=2),
           dist.P2POp(dist.irecv, from_left, **{peer: left}, tag=1),
           dist.P2POp(dist.irecv, from_right, **{peer: right}, tag=2)]
    works = dist.batch_isend_irecv(ops)
    assert len(works) == 4
    for w in works:
        w.wait()
    np.testing.assert_array_equal(from_left, rank_data(left, (3, 2), np.float32))
    np.testing.assert_array_equal(from_right, rank_data(right, (3, 2), np.float32))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("sent,room", [(3, 5), (5, 3)], ids=["short", "long"])
def test_size_mismatch_is_value_error(dist, rank, size, sent, room):
    err = None
    if rank == 1:
        dist.send(np.arange(sent, dtype=np.float64), dst=0, tag=2)
    elif rank == 0:
        with pytest.raises(ValueError) as info:
            dist.recv(np.zeros(room), src=1, tag=2)
        err = str(info.value)
    errs = gathered(dist, err)
    assert errs[0].startswith("recv: rank 0: ")
    assert str(room) in errs[0]
    still_works(dist, size)


@pytest.mark.mpi(min_size=2)
def test_irecv_size_mismatch_raises_on_wait(dist, rank, size):
    if rank == 1:
        dist.send(np.arange(2, dtype=np.int32), dst=0, tag=6)
    elif rank == 0:
        w = dist.irecv(np.zeros(4, np.int32), src=1, tag=6)
        with pytest.raises(ValueError, match="received 2 elements from rank 1"):
            w.wait()
        assert isinstance(w.exception(), ValueError)
    still_works(dist, size)


P2P_ERRORS = {
    "send to self": (ValueError, "this rank itself", lambda d, r: d.send(np.ones(1), dst=r)),
    "recv from self": (ValueError, "this rank itself", lambda d, r: d.recv(np.ones(1), src=r)),
    "isend to self": (ValueError, "this rank itself", lambda d, r: d.isend(np.ones(1), dst=r)),
    "send no dst": (ValueError, "is required", lambda d, r: d.send(np.ones(1))),
    "send dst and group_dst": (ValueError, "not both", lambda d, r: d.send(np.ones(1), dst=0, group_dst=0)),
    "negative tag": (ValueError, "tag=-1", lambda d, r: d.recv(np.ones(1), tag=-1)),
    "float tag": (TypeError, "tag must be an int", lambda d, r: d.irecv(np.ones(1), tag=1.5)),
    "recv read-only": (ValueError, "read-only", lambda d, r: d.recv(_ro())),
    "send a list": (TypeError, "got list", lambda d, r: d.send([1.0], dst=r + 1)),
    "P2POp bad op": (ValueError, "op must be", lambda d, r: d.P2POp(d.send, np.ones(1), 0)),
    "batch empty": (ValueError, "non-empty", lambda d, r: d.batch_isend_irecv([])),
    "batch not P2POp": (TypeError, "must be a P2POp", lambda d, r: d.batch_isend_irecv([1])),
}


def _ro() -> np.ndarray:
    a = np.zeros(1)
    a.setflags(write=False)
    return a


@pytest.mark.mpi
@pytest.mark.parametrize("case", sorted(P2P_ERRORS))
def test_p2p_argument_errors(dist, rank, size, case):
    exc, text, fn = P2P_ERRORS[case]
    with pytest.raises(exc, match=f"rank {rank}: .*{text}"):
        fn(dist, rank)
    still_works(dist, size)


@pytest.mark.mpi(min_size=2)
def test_work_wait_timeout_then_completion(dist, rank, size):
    err = None
    if rank == 0:
        t = np.zeros(2)
        w = dist.irecv(t, src=1, tag=21)
        with pytest.raises(RuntimeError, match=r"irecv: rank 0: timed out after 0.05 s"):
            w.wait(timeout=0.05)  # nothing sent yet
        assert not w.is_completed() or t[0] == 4.0
    dist.barrier()
    if rank == 1:
        dist.send(np.full(2, 4.0), dst=0, tag=21)
    elif rank == 0:
        assert w.wait() is True  # the same request completes once the message arrives
        err = t.tolist()
    assert gathered(dist, err)[0] == [4.0, 4.0]
