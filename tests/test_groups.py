"""Process groups: creation by every form torch has, rank translation, and every collective on them."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from collective_cases import run_all
from helpers import gathered
from launcher import run_mpi
from mpi4py import MPI


def make_group(dist, kind: str):
    """Create a group of ``kind`` on every rank; return (this rank's group or sentinel, its members).

    ``members`` are global ranks in group-rank order, or ``None`` when this rank is outside.
    """
    n, me = dist.get_world_size(), dist.get_rank()
    if kind == "new_group_even":
        ranks = list(range(0, n, 2))
        return dist.new_group(ranks), (ranks if me in ranks else None)
    if kind == "new_group_unsorted_tail":
        ranks = list(range(n // 2, n))
        pg = dist.new_group(list(reversed(ranks)))  # torch orders members by global rank
        return pg, (ranks if me in ranks else None)
    if kind == "new_subgroups":
        g = 2 if n % 2 == 0 else n
        cur, allg = dist.new_subgroups(group_size=g)
        assert len(allg) == n // g
        return cur, list(range(me - me % g, me - me % g + g))
    if kind == "enumeration":
        spans = [list(range(0, (n + 1) // 2)), list(range((n + 1) // 2, n))]
        spans = [s for s in spans if s]
        cur, allg = dist.new_subgroups_by_enumeration(spans)
        assert len(allg) == len(spans)
        return cur, next(s for s in spans if me in s)
    if kind == "split_world":
        spans = [s for s in ([r for r in range(n) if r % 2], [r for r in range(n) if not r % 2]) if s]
        pg = dist.split_group(None, spans)
        return pg, next(s for s in spans if me in s)
    if kind == "split_of_subgroup":
        # parent = global ranks [1..n-1] (world if n == 1); split by *group* ranks of the parent,
        # and leave parent group rank 0 out of every split
        parent_ranks = list(range(1, n)) if n > 1 else [0]
        parent = dist.new_group(parent_ranks)
        if me not in parent_ranks:
            return parent, None
        if len(parent_ranks) == 1:
            spans = [[0]]
        else:
            spans = [list(range(len(parent_ranks) - 1, 0, -1))]  # unsorted on purpose
        pg = dist.split_group(parent, spans)
        members = [parent_ranks[i] for i in sorted(spans[0])]
        return pg, (members if me in members else None)
    raise AssertionError(kind)


KINDS = ["new_group_even", "new_group_unsorted_tail", "new_subgroups", "enumeration", "split_world",
         "split_of_subgroup"]


def assert_all_ranks_ok(dist, bad):
    everyone = gathered(dist, bad)
    assert not any(everyone), {r: b for r, b in enumerate(everyone) if b}


@pytest.mark.mpi
@pytest.mark.parametrize("kind", KINDS)
def test_group_rank_translation(dist, rank, size, kind):
    pg, members = make_group(dist, kind)
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
@pytest.mark.parametrize("kind,async_op", [(k, False) for k in KINDS] + [
    ("new_group_even", True), ("enumeration", True), ("split_of_subgroup", True)])
def test_every_collective_on_group(dist, rank, size, kind, async_op):
    pg, members = make_group(dist, kind)
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
        for fn in (lambda: dist.all_reduce(np.ones(1), group=pg),
                   lambda: dist.broadcast(np.ones(1), src=0, group=pg),
                   lambda: dist.barrier(group=pg),
                   lambda: dist.all_gather_object([None], 1, group=pg),
                   lambda: dist.get_backend(pg)):
            with pytest.raises(ValueError, match=f"rank {rank}: this rank is not a member"):
                fn()
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


# A regression that hung: ``split_group`` on a subgroup is called only by the subgroup's
# members; a later world-wide ``new_group`` must still agree among all ranks. Run as its own
# job, under a timeout, because the failure mode is a deadlock.
SUBGROUP_THEN_WORLD = textwrap.dedent("""
    import numpy as np
    import mpidist as dist
    dist.init_process_group(abort_on_error=False)
    n, me = dist.get_world_size(), dist.get_rank()
    tail = dist.new_group(list(range(1, n)))
    if me != 0:
        dist.split_group(tail, [[0]])
        dist.new_subgroups(1, group=tail)
    dist.new_group(list(range(1, n)), use_local_synchronization=True) if me != 0 else None
    pg = dist.new_group(list(range(n)))
    t = np.ones(1)
    dist.all_reduce(t, group=pg)
    print("SUM", int(t[0]), flush=True)
    dist.destroy_process_group()
""")


def test_groups_made_by_some_ranks_do_not_desync_later_groups():
    proc = run_mpi(3, ["-c", SUBGROUP_THEN_WORLD], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUM 3") == 3, proc.stdout + proc.stderr
