"""Node topology: the ranks of each node, groups built from them, and how many nodes a group spans.

A node is what MPI says shares memory (``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)``),
never what a launcher's variables claim. Nodes are numbered in order of their lowest rank,
as :func:`mpidist.init_distributed_mode` numbers them (``node_rank``).

Typical hybrid layouts::

    import mpidist as dist

    dist.init_process_group("mpi")
    node_group = dist.new_node_group()              # this node's ranks (tensor parallel)
    peers = dist.new_local_rank_group()             # same local rank on every node (data parallel)
    cur, per_node = dist.new_subgroups_by_node()    # torch's new_subgroups shape: (mine, all)
    dist.node_ranks()                               # e.g. [[0, 1], [2], [3, 4]]

Every function here is collective over ``group`` (default: the world).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from mpi4py import MPI

from . import errors
from .groups import GroupMember, ProcessGroup, resolve
from .subgroups import split_group


def node_ranks(group: Any = None) -> list[list[int]]:
    """The global ranks of ``group`` on each node, nodes in order of their lowest rank.

    Becomes ``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`` on the group's communicator,
    an ``MPI_Allreduce`` (MIN) within each node and an ``MPI_Allgather`` of the result.

    Example: 5 ranks placed 2 + 1 + 2 on three nodes give ``[[0, 1], [2], [3, 4]]``.
    """
    pg = resolve(group, "node_ranks")
    return [[pg.ranks[r] for r in span] for span in _spans(pg)]


def _spans(pg: ProcessGroup) -> list[list[int]]:
    """Group ranks of ``pg`` per node, nodes ordered by their lowest group rank."""
    node = pg.comm.Split_type(MPI.COMM_TYPE_SHARED, key=pg.comm.Get_rank())
    try:
        leader = node.allreduce(pg.comm.Get_rank(), op=MPI.MIN)
    finally:
        node.Free()
    leaders = pg.comm.allgather(leader)
    by_node: dict[int, list[int]] = {}
    for r, lead in enumerate(leaders):
        by_node.setdefault(lead, []).append(r)
    return [by_node[lead] for lead in sorted(by_node)]


def _by_local_rank(spans: list[list[int]]) -> list[list[int]]:
    """Column ``j``: the ``j``-th rank of every node that has one."""
    width = max(len(s) for s in spans)
    return [[s[j] for s in spans if j < len(s)] for j in range(width)]


def _split(pg: ProcessGroup, spans: list[list[int]], timeout: timedelta | None,
           group_desc: str | None) -> tuple[ProcessGroup, list[Any]]:
    mine = next(i for i, s in enumerate(spans) if pg._rank in s)
    cur = split_group(pg, spans, timeout=timeout, group_desc=group_desc)
    return cur, [cur if i == mine else GroupMember.NON_GROUP_MEMBER for i in range(len(spans))]


def new_subgroups_by_node(group: Any = None, timeout: timedelta | None = None,
                          group_desc: str | None = None) -> tuple[ProcessGroup, list[Any]]:
    """One subgroup per node: ``(this node's group, every node's group)``.

    Like :func:`mpidist.new_subgroups`, the list holds ``NON_GROUP_MEMBER`` for the
    groups of other nodes. Nodes may hold different numbers of ranks. Becomes
    ``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`` (to learn the nodes) and one
    ``MPI_Comm_split`` of ``group``'s communicator.

    Example: ranks placed 2 + 1 on two nodes; rank 2 gets
    ``(group of [2], [NON_GROUP_MEMBER, group of [2]])``.
    """
    pg = resolve(group, "new_subgroups_by_node")
    return _split(pg, _spans(pg), timeout, group_desc or "node")


def new_node_group(group: Any = None, timeout: timedelta | None = None,
                   group_desc: str | None = None) -> ProcessGroup:
    """The group of this node's ranks (of ``group``); see :func:`new_subgroups_by_node`."""
    return new_subgroups_by_node(group, timeout, group_desc)[0]


def new_subgroups_by_local_rank(group: Any = None, timeout: timedelta | None = None,
                                group_desc: str | None = None) -> tuple[ProcessGroup, list[Any]]:
    """One subgroup per local rank: the ``j``-th rank of every node, for each ``j``.

    Returns ``(this rank's group, every such group)``. Where nodes hold different numbers
    of ranks, group ``j`` has only the nodes with more than ``j`` ranks. Becomes
    ``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`` and one ``MPI_Comm_split``.

    Example: ranks placed 2 + 2 on two nodes give the groups ``[0, 2]`` and ``[1, 3]``.
    """
    pg = resolve(group, "new_subgroups_by_local_rank")
    return _split(pg, _by_local_rank(_spans(pg)), timeout, group_desc or "local_rank")


def new_local_rank_group(group: Any = None, timeout: timedelta | None = None,
                         group_desc: str | None = None) -> ProcessGroup:
    """The ranks with this rank's local rank, one per node; see :func:`new_subgroups_by_local_rank`."""
    return new_subgroups_by_local_rank(group, timeout, group_desc)[0]


def node_mesh(group: Any = None) -> list[list[int]]:
    """The global ranks as a 2-D grid whose rows are nodes, for a ``DeviceMesh``.

    Raises ``ValueError`` on every rank when the nodes hold different numbers of ranks
    (a grid needs equal rows). ``torch.distributed.device_mesh.DeviceMesh("cpu", node_mesh())``
    gives a mesh whose dimension 1 runs within a node and dimension 0 across nodes,
    wherever the launcher placed the ranks.
    """
    call = "node_mesh"
    rows = node_ranks(group)
    if len({len(r) for r in rows}) != 1:
        raise errors.value_error(
            call, f"nodes hold different numbers of ranks ({[len(r) for r in rows]}: {rows}); "
            "a 2-D mesh needs the same number on every node"
        )
    return rows


# How many nodes a communicator spans: asked of MPI once (MPI_Comm_split_type, then an
# MPI_Allreduce counting the node leaders) and kept as an attribute of the communicator
# (MPI_Comm_set_attr), so it lives and dies with it. Collective the first time: call it where
# every rank makes the same call (the first reduction on it, the first collective of a torch group).
_node_count_key: int | None = None


def node_count(comm: MPI.Comm) -> int:
    """The number of nodes (shared-memory domains) ``comm``'s ranks run on; collective the first time."""
    global _node_count_key
    if _node_count_key is None:
        _node_count_key = MPI.Comm.Create_keyval()
    n = comm.Get_attr(_node_count_key)
    if n is None:
        if comm.Get_size() == 1:
            n = 1
        else:
            node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
            try:
                n = comm.allreduce(int(node.Get_rank() == 0), op=MPI.SUM)
            finally:
                node.Free()
        comm.Set_attr(_node_count_key, n)
    return n
