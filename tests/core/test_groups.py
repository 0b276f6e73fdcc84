"""Process groups: creation by every form torch has, rank translation, and every collective on them."""

from __future__ import annotations

import numpy as np
import pytest
from collective_cases import CALLS, run, run_all
from helpers import assert_all_ranks_ok, gathered
from mpi4py import MPI


def make_group(dist, kind: str, made: list):
    """Create a group of ``kind`` on every rank; return (this rank's group or sentinel, its members).

    ``members`` are global ranks in group-rank order, or ``None`` when this rank is outside.
    Every group this rank gets is appended to ``made``, for the ``made`` fixture to destroy.
    """
    n, me = dist.get_world_size(), dist.get_rank()
    if kind == "new_group_even":
        ranks = list(range(0, n, 2))
        pg = dist.new_group(ranks)
        made.append(pg)
        return pg, (ranks if me in ranks else None)
    if kind == "new_group_unsorted_tail":
        ranks = list(range(n // 2, n))
        pg = dist.new_group(list(reversed(ranks)))  # torch orders members by global rank
        made.append(pg)
        return pg, (ranks if me in ranks else None)
    if kind == "new_subgroups":
        g = 2 if n % 2 == 0 else n
        cur, allg = dist.new_subgroups(group_size=g)
        made.append(cur)
        assert len(allg) == n // g
        return cur, list(range(me - me % g, me - me % g + g))
    if kind == "enumeration":
        spans = [list(range(0, (n + 1) // 2)), list(range((n + 1) // 2, n))]
        spans = [s for s in spans if s]
        cur, allg = dist.new_subgroups_by_enumeration(spans)
        made.append(cur)
        assert len(allg) == len(spans)
        return cur, next(s for s in spans if me in s)
    if kind == "split_world":
        spans = [s for s in ([r for r in range(n) if r % 2], [r for r in range(n) if not r % 2]) if s]
        pg = dist.split_group(None, spans)
        made.append(pg)
        return pg, next(s for s in spans if me in s)
    if kind == "split_of_subgroup":
        # parent = global ranks [1..n-1] (world if n == 1); split by *group* ranks of the parent,
        # and leave parent group rank 0 out of every split
        parent_ranks = list(range(1, n)) if n > 1 else [0]
        parent = dist.new_group(parent_ranks)
        made.append(parent)
        if me not in parent_ranks:
            return parent, None
        if len(parent_ranks) == 1:
            spans = [[0]]
        else:
            spans = [list(range(len(parent_ranks) - 1, 0, -1))]  # unsorted on purpose
        pg = dist.split_group(parent, spans)
        made.append(pg)
        members = [parent_ranks[i] for i in sorted(spans[0])]
        return pg, (members if me in members else None)
    raise AssertionError(kind)


KINDS = ["new_group_even", "new_group_unsorted_tail", "new_subgroups", "enumeration", "split_world",
         "split_of_subgroup"]
#: (kind, async_op) pairs the collectives run on: every kind blocking, three of them async too.
KIND_MODES = [(k, False) for k in KINDS] + [("new_group_even", True), ("enumeration", True),
                                            ("split_of_subgroup", True)]
MODE_IDS = [f"{k}-{'async' if a else 'blocking'}" for k, a in KIND_MODES]


@pytest.fixture
def made(dist):
    """The groups a test makes, destroyed (newest first) when it ends.

    The per-call tests make a few hundred groups in one process; left alive they would eat into
    MPI's pool of communicator context ids.
    """
    groups: list = []
    yield groups
    for g in reversed(groups):
        if g and g is not dist.group.WORLD:  # NON_GROUP_MEMBER and None are falsy
            dist.destroy_process_group(g)


@pytest.mark.mpi
@pytest.mark.parametrize("kind", KINDS)
def test_group_rank_translation(dist, rank, size, made, kind):
    pg, members = make_group(dist, kind, made)
    bad = []
    if members is None:
        if pg is not None and pg is not dist.GroupMember.NON_GROUP_MEMBER:
            bad.append(f"non-member got {pg!r}")
        nm = pg is dist.GroupMember.NON_GROUP_MEMBER
        if nm and (dist.get_rank(pg), dist.get_world_size(pg)) != (-1, -1):
            bad.append("get_rank/get_world_size of NON_GROUP_MEMBER is not -1")
    else:
        gi = members.index(rank)
        facts = {
            "rank()": (pg.rank(), gi), "size()": (pg.size(), len(members)),
            "ranks": (list(pg.ranks), members), "get_rank": (dist.get_rank(pg), gi),
            "get_world_size": (dist.get_world_size(pg), len(members)),
            "get_process_group_ranks": (dist.get_process_group_ranks(pg), members),
            "global ranks": ([dist.get_global_rank(pg, i) for i in range(len(members))], members),
            "group ranks": ([dist.get_group_rank(pg, g) for g in members], list(range(len(members)))),
            "comm rank": (pg.comm.Get_rank(), gi), "comm size": (pg.comm.Get_size(), len(members)),
            "backend": (dist.get_backend(pg), "mpi"),
        }
        bad += [f"{k}: got {g}, expected {w}" for k, (g, w) in facts.items() if g != w]
    assert_all_ranks_ok(dist, bad)


@pytest.mark.mpi
@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("kind,async_op", KIND_MODES, ids=MODE_IDS)
def test_collective_on_group(dist, made, kind, async_op, call):
    pg, members = make_group(dist, kind, made)
    bad = run(dist, call, pg, members, async_op) if members is not None else []
    assert_all_ranks_ok(dist, bad)


@pytest.mark.mpi
@pytest.mark.parametrize("kind,async_op", KIND_MODES, ids=MODE_IDS)
def test_every_collective_back_to_back_on_group(dist, made, kind, async_op):
    """Every case in turn on one group: a call must not disturb the next one on the same communicator."""
    pg, members = make_group(dist, kind, made)
    bad = run_all(dist, pg, members, async_op) if members is not None else []
    assert_all_ranks_ok(dist, bad)


@pytest.mark.mpi
def test_world_is_a_duplicate_of_comm_world(dist, size):
    w = dist.group.WORLD
    assert w is dist.GroupMember.WORLD and w.comm is not MPI.COMM_WORLD
    assert MPI.Comm.Compare(w.comm, MPI.COMM_WORLD) == MPI.CONGRUENT
    assert dist.get_process_group_ranks(None) == list(range(size))
    assert dist.get_process_group_ranks(w) == list(range(size))
    assert dist.new_group() is not dist.GroupMember.NON_GROUP_MEMBER  # None means every rank


@pytest.mark.mpi
def test_calls_on_a_group_this_rank_is_not_in(dist, rank, size):
    pg = dist.new_group([0])
    if rank != 0:
        assert pg is dist.GroupMember.NON_GROUP_MEMBER and not pg
        t = np.full(2, 7.0)
        # torch's rule: every call that names a group warns and returns without communicating
        # (recv and recv_object_list return -1); the arrays are left as they were
        calls = {
            "all_reduce": lambda: dist.all_reduce(t, group=pg, async_op=True),
            "broadcast": lambda: dist.broadcast(t, src=0, group=pg),
            "reduce": lambda: dist.reduce(t, dst=0, group=pg),
            "reduce_scatter": lambda: dist.reduce_scatter(t, [t] * size, group=pg),
            "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(t, np.zeros(2 * size), group=pg),
            "barrier": lambda: dist.barrier(group=pg),
            "monitored_barrier": lambda: dist.monitored_barrier(group=pg),
            "all_gather": lambda: dist.all_gather([t] * size, t, group=pg),
            "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(np.zeros(2 * size), t, group=pg),
            "gather": lambda: dist.gather(t, None, dst=0, group=pg),
            "scatter": lambda: dist.scatter(t, None, src=0, group=pg),
            "all_to_all": lambda: dist.all_to_all([t] * size, [t] * size, group=pg),
            "all_to_all_single": lambda: dist.all_to_all_single(t, t.copy(), group=pg),
            "send": lambda: dist.send(t, dst=0, group=pg),
            "recv": lambda: dist.recv(t, src=0, group=pg),
            "isend": lambda: dist.isend(t, dst=0, group=pg),
            "irecv": lambda: dist.irecv(t, src=0, group=pg),
            "broadcast_object_list": lambda: dist.broadcast_object_list([None], src=0, group=pg),
            "all_gather_object": lambda: dist.all_gather_object([None], 1, group=pg),
            "gather_object": lambda: dist.gather_object(1, None, dst=0, group=pg),
            "scatter_object_list": lambda: dist.scatter_object_list([None], None, src=0, group=pg),
            "send_object_list": lambda: dist.send_object_list([1], dst=0, group=pg),
            "recv_object_list": lambda: dist.recv_object_list([None], src=0, group=pg),
        }
        from mpidist.core.registry import REGISTRY
        naming_a_group = {c.name for c in REGISTRY.values() if c.group_arg}
        assert naming_a_group <= set(calls), naming_a_group - set(calls)
        for name, fn in calls.items():
            with pytest.warns(UserWarning, match=f"Running {name} on global rank {rank} which does not "
                                                 "belong to the given group"):
                got = fn()
            assert got == (-1 if name.startswith("recv") else None), (name, got)
            np.testing.assert_array_equal(t, np.full(2, 7.0))
        with pytest.raises(ValueError, match=f"rank {rank}: this rank is not a member"):
            dist.get_backend(pg)
    else:
        t = np.full(2, 5.0)
        dist.all_reduce(t, group=pg)
        np.testing.assert_array_equal(t, np.full(2, 5.0))
        if size > 1:
            with pytest.raises(ValueError, match="src=1 is not a member"):
                dist.broadcast(t, src=1, group=pg)
            with pytest.raises(ValueError, match="global rank 1 is not part of group"):
                dist.get_group_rank(pg, 1)
        with pytest.raises(ValueError, match="out of range"):
            dist.get_global_rank(pg, 1)
    t = np.ones(1)
    dist.all_reduce(t)
    assert t[0] == size


@pytest.mark.mpi
def test_destroyed_subgroup_refuses_calls(dist, rank, size):
    pg = dist.new_group(list(range(size)))
    dist.destroy_process_group(pg)
    with pytest.raises(RuntimeError, match="was destroyed"):
        dist.all_reduce(np.ones(1), group=pg)
    dist.destroy_process_group(dist.GroupMember.NON_GROUP_MEMBER)  # a no-op, as in torch
    t = np.ones(1)
    dist.all_reduce(t)
    assert t[0] == size


@pytest.mark.mpi
def test_many_groups_and_names_agree(dist, rank, size):
    groups = [dist.new_group([r]) for r in range(size)] + [dist.new_group(list(range(size)))]
    mine = groups[rank]
    assert mine.ranks == (rank,) and mine.size() == 1
    names = gathered(dist, groups[-1].group_name)
    assert len(set(names)) == 1  # every rank names the group the same
    for g in groups:
        if g:
            dist.destroy_process_group(g)


@pytest.mark.mpi
def test_new_subgroups_default_size_is_node(dist, rank, size):
    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    local = node.Get_size()
    node.Free()
    if size % local:
        pytest.skip("ranks are spread unevenly over nodes")
    cur, allg = dist.new_subgroups()
    assert cur.size() == local and len(allg) == size // local


@pytest.mark.mpi
def test_enumeration_rank_in_no_subgroup_gets_none(dist, rank, size):
    cur, allg = dist.new_subgroups_by_enumeration([[0]])
    if rank == 0:
        assert cur is allg[0] and cur.ranks == (0,)
    else:
        assert cur is None and allg == [dist.GroupMember.NON_GROUP_MEMBER]


@pytest.mark.mpi
def test_split_group_rank_outside_every_split_gets_none(dist, rank, size):
    pg = dist.split_group(split_ranks=[[0]])
    if rank == 0:
        assert pg.ranks == (0,)
    else:
        assert pg is None


GROUP_ERRORS = {
    "new_group duplicate": (ValueError, "more than once", lambda d, n: d.new_group([0, 0])),
    "new_group out of range": (ValueError, "outside 0..", lambda d, n: d.new_group([n])),
    "new_group negative": (ValueError, "contains -1", lambda d, n: d.new_group([-1])),
    "new_group not int": (TypeError, "int rank", lambda d, n: d.new_group(["0"])),
    "new_group backend": (ValueError, "not supported", lambda d, n: d.new_group(backend="nccl")),
    "new_subgroups zero": (ValueError, "positive", lambda d, n: d.new_subgroups(0)),
    "new_subgroups too big": (ValueError, "must divide", lambda d, n: d.new_subgroups(n + 1)),
    "enumeration empty": (ValueError, "empty", lambda d, n: d.new_subgroups_by_enumeration([])),
    "enumeration overlap": (ValueError, "appears in subgroup 0 and subgroup 1",
                            lambda d, n: d.new_subgroups_by_enumeration([[0], [0]])),
    "split none": (ValueError, "at least one", lambda d, n: d.split_group(None, [])),
    "split overlap": (ValueError, "appears in", lambda d, n: d.split_group(None, [[0], [0]])),
    "split empty group": (ValueError, "empty group", lambda d, n: d.split_group(None, [[0], []])),
    "split out of range": (ValueError, "outside", lambda d, n: d.split_group(None, [[n]])),
    "get_group_rank not member": (ValueError, "not part of", lambda d, n: d.get_group_rank(None, n)),
    "get_global_rank range": (ValueError, "out of range", lambda d, n: d.get_global_rank(None, n)),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", sorted(GROUP_ERRORS))
def test_group_argument_errors(dist, rank, size, case):
    exc, text, fn = GROUP_ERRORS[case]
    with pytest.raises(exc, match=rf"rank {rank}: .*{text}"):
        fn(dist, size)
    # no half-made communicator is left behind: the next group works on every rank
    pg = dist.new_group(list(range(size)))
    t = np.ones(1)
    dist.all_reduce(t, group=pg)
    assert t[0] == size
    dist.destroy_process_group(pg)
