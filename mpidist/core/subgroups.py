"""Creating groups: ``new_group``, ``new_subgroups``, ``new_subgroups_by_enumeration``, ``split_group``.

Every group is created by all ranks of its parent, as in torch.distributed, but only the
members take part in MPI's creation call (:func:`mpidist.core.groups.create`,
``MPI_Comm_create_group``), so creating many small groups costs each rank only its own;
``split_group`` is one ``MPI_Comm_split``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Iterable, Sequence

from mpi4py import MPI

from . import errors
from .groups import (
    GroupMember,
    ProcessGroup,
    _as_rank,
    _new,
    _next_name,
    check_backend,
    create,
    registry,
    resolve,
    world,
)


def _check_ranks(ranks: Iterable[Any], size: int, call: str, what: str = "ranks",
                 sort: bool = True) -> list[int]:
    out = [_as_rank(r, call, what) for r in ranks]
    for r in out:
        if not 0 <= r < size:
            raise errors.value_error(call, f"{what} contains {r}, outside 0..{size - 1}")
    if len(set(out)) != len(out):
        dup = sorted({r for r in out if out.count(r) > 1})
        raise errors.value_error(call, f"{what} lists rank(s) {dup} more than once")
    return sorted(out) if sort else out


def new_group(ranks: Sequence[int] | None = None, timeout: timedelta | None = None,
              backend: Any = None, pg_options: Any = None, use_local_synchronization: bool = False,
              group_desc: str | None = None, device_id: Any = None,
              sort_ranks: bool = True) -> ProcessGroup | Any:
    """Create a group of the given global ranks (``MPI_Comm_create_group``).

    Every rank of the world calls it with the same ``ranks`` (as in torch; with
    ``use_local_synchronization=True`` only the members need to). Members get the new
    :class:`ProcessGroup`, group ranks in ascending global-rank order (with
    ``sort_ranks=False``, in the order of ``ranks``: group rank i is ``ranks[i]``); the others get
    ``GroupMember.NON_GROUP_MEMBER``. ``ranks=None`` (or empty) means every rank.

    Example: ``g = new_group([0, 2])`` on 4 ranks; rank 2 has ``g.rank() == 1``;
    ``new_group([2, 0], sort_ranks=False)`` gives rank 2 group rank 0.
    """
    call = "new_group"
    w = world(call)
    check_backend(backend, call)
    members = _check_ranks(ranks or range(w._size), w._size, call, sort=bool(sort_ranks))
    return create(w, members, group_desc, timeout or w.timeout, ordered=not sort_ranks)


def new_subgroups(group_size: int | None = None, group: ProcessGroup | None = None,  # noqa: A002
                  timeout: timedelta | None = None, backend: Any = None, pg_options: Any = None,
                  group_desc: str | None = None) -> tuple[ProcessGroup | None, list[Any]]:
    """Split the world into consecutive subgroups of ``group_size`` ranks.

    Returns ``(this rank's subgroup, every subgroup)``; the list holds
    ``NON_GROUP_MEMBER`` for groups this rank is not in. ``group_size`` defaults to the
    number of ranks on this node (``MPI_COMM_TYPE_SHARED``; every node must hold as many)
    and must divide the group size.
    """
    call = "new_subgroups"
    parent = resolve(group, call)
    size = parent._size
    if group_size is None:
        node = parent.comm.Split_type(MPI.COMM_TYPE_SHARED)
        sizes = set(parent.comm.allgather(node.Get_size()))
        group_size = node.Get_size()
        node.Free()
        if len(sizes) > 1:  # every rank raises, not only those whose node size does not divide
            raise errors.value_error(
                call, f"group_size defaults to the ranks per node, but the nodes hold {sorted(sizes)} ranks; "
                "pass group_size, or use new_subgroups_by_node() for one group per node"
            )
    group_size = _as_rank(group_size, call, "group_size")
    if group_size <= 0:
        raise errors.value_error(call, f"group_size must be positive, got {group_size}")
    if group_size > size or size % group_size:
        raise errors.value_error(
            call, f"group_size={group_size} must divide the group size {size}"
        )
    spans = [list(range(s, s + group_size)) for s in range(0, size, group_size)]
    return _subgroups(parent, spans, timeout, backend, group_desc, call)


def new_subgroups_by_enumeration(ranks_per_subgroup_list: Sequence[Sequence[int]],
                                 timeout: timedelta | None = None, backend: Any = None,
                                 pg_options: Any = None, group_desc: str | None = None
                                 ) -> tuple[ProcessGroup | None, list[Any]]:
    """Create one subgroup per list of global ranks; a rank may be in at most one.

    Returns ``(this rank's subgroup or None, every subgroup)``.
    """
    call = "new_subgroups_by_enumeration"
    w = world(call)
    if not ranks_per_subgroup_list:
        raise errors.value_error(call, "ranks_per_subgroup_list is empty")
    spans = [_check_ranks(r, w._size, call, "ranks_per_subgroup_list") for r in ranks_per_subgroup_list]
    return _subgroups(w, spans, timeout, backend, group_desc, call)


def _disjoint(spans: list[list[int]], call: str) -> None:
    seen: dict[int, int] = {}
    for i, span in enumerate(spans):
        for r in span:
            if r in seen:
                raise errors.value_error(
                    call, f"rank {r} appears in subgroup {seen[r]} and subgroup {i}"
                )
            seen[r] = i


def _subgroups(parent: ProcessGroup, spans: list[list[int]], timeout: timedelta | None,
               backend: Any, desc: str | None, call: str) -> tuple[Any, list[Any]]:
    check_backend(backend, call)
    _disjoint(spans, call)
    cur = None
    groups = []
    for span in spans:
        pg = create(parent, span, desc, timeout or parent.timeout)
        groups.append(pg)
        if pg is not GroupMember.NON_GROUP_MEMBER:
            cur = pg
    return cur, groups


def split_group(parent_pg: ProcessGroup | None = None, split_ranks: Sequence[Sequence[int]] | None = None,
                timeout: timedelta | None = None, pg_options: Any = None,
                group_desc: str | None = None, backend: Any = None) -> ProcessGroup | None:
    """Split ``parent_pg`` into disjoint groups with one ``MPI_Comm_split``.

    ``split_ranks`` lists *group ranks of the parent*, one list per new group (torch's
    rule). Every rank of the parent calls it; a rank in no list gets ``None``.
    """
    call = "split_group"
    check_backend(backend, call)
    parent = resolve(parent_pg, call)
    if not split_ranks:
        raise errors.value_error(call, "split_ranks must list at least one group of ranks")
    spans = [_check_ranks(r, parent._size, call, "split_ranks") for r in split_ranks]
    if not all(spans):
        raise errors.value_error(call, f"split_ranks={split_ranks!r} contains an empty group")
    _disjoint(spans, call)
    registry.made += 1
    color = next((i for i, s in enumerate(spans) if parent._rank in s), MPI.UNDEFINED)
    comm = parent.comm.Split(color, parent._rank)
    if comm == MPI.COMM_NULL:
        return None
    ranks = [parent.ranks[r] for r in spans[color]]
    return _new(comm, ranks, _next_name(ranks), group_desc, timeout or parent.timeout)
