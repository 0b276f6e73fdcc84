"""Process groups as MPI communicators: creation, resolution and rank translation.

A :class:`ProcessGroup` is one MPI intracommunicator plus the global ranks of its
members, in group-rank order. Every group is created by all ranks of its parent,
as in torch.distributed, but only the members take part in MPI's creation call
(``MPI_Comm_create_group``), so creating many small groups costs each rank only its own.
"""

from __future__ import annotations

import hashlib
import operator
from datetime import timedelta
from typing import Any, Iterable, Sequence

from mpi4py import MPI

from . import errors


class ProcessGroup:
    """One MPI communicator and the global ranks of its members.

    ``comm`` is the raw ``mpi4py`` communicator (use it for anything mpidist lacks);
    ``ranks`` lists the members' global ranks, indexed by group rank.
    """

    __slots__ = ("comm", "ranks", "_rank", "_size", "_to_group", "group_name", "group_desc",
                 "timeout", "__weakref__")

    def __init__(self, comm: MPI.Intracomm, ranks: Sequence[int], name: str, desc: str,
                 timeout: timedelta | None) -> None:
        self.comm = comm
        self.ranks = tuple(ranks)
        self._rank = comm.Get_rank()
        self._size = comm.Get_size()
        self._to_group = {g: i for i, g in enumerate(self.ranks)}
        self.group_name = name
        self.group_desc = desc
        self.timeout = timeout

    def rank(self) -> int:
        """This process's rank in the group."""
        return self._rank

    def size(self) -> int:
        """Number of ranks in the group."""
        return self._size

    def name(self) -> str:
        """The backend name, as torch's ``ProcessGroup.name()``."""
        return "mpi"

    @property
    def bound_device_id(self) -> None:
        return None

    def __repr__(self) -> str:
        state = "destroyed" if self.comm is None else f"rank {self._rank}/{self._size}"
        return f"<mpidist.ProcessGroup {self.group_name!r} ranks={list(self.ranks)} {state}>"


class _NonGroupMember:
    """What a rank outside a group gets from ``new_group``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "GroupMember.NON_GROUP_MEMBER"

    def __bool__(self) -> bool:
        return False


class GroupMember:
    """torch's sentinels: ``WORLD`` is the default group once initialised."""

    WORLD: ProcessGroup | None = None
    NON_GROUP_MEMBER = _NonGroupMember()


class group:  # noqa: N801 - torch spells it ``dist.group.WORLD``
    """``group.WORLD`` is the default process group (``None`` before init)."""

    WORLD: ProcessGroup | None = None


class _Registry:
    """The live groups of this process. ``world`` is ``None`` outside init/destroy."""

    world: ProcessGroup | None = None
    live: dict[int, ProcessGroup] = {}
    names: dict[tuple[int, ...], int] = {}
    was_destroyed = False


registry = _Registry()


def _not_initialized(call: str) -> RuntimeError:
    if registry.was_destroyed:
        fix = "the default process group was destroyed; call init_process_group() again first"
    else:
        fix = "the default process group is not initialized; call init_process_group() first"
    return errors.runtime_error(call, fix)


def world(call: str) -> ProcessGroup:
    """The default group, or ``RuntimeError`` saying how to create it."""
    pg = registry.world
    if pg is None:
        raise _not_initialized(call)
    return pg


def resolve(grp: Any, call: str) -> ProcessGroup:
    """The group a call runs on: ``None`` is the default group; non-members are refused."""
    if grp is None:
        pg = registry.world
        if pg is None:
            raise _not_initialized(call)
        return pg
    if type(grp) is ProcessGroup:
        if grp.comm is None:
            if registry.world is None:
                raise _not_initialized(call)
            raise errors.runtime_error(call, f"process group {grp.group_name!r} was destroyed")
        return grp
    if grp is GroupMember.NON_GROUP_MEMBER:
        world(call)
        raise errors.value_error(
            call, "this rank is not a member of the group (new_group returned NON_GROUP_MEMBER)"
        )
    raise errors.type_error(call, f"group must be a ProcessGroup or None, got {grp!r}")


def _as_rank(value: Any, call: str, what: str) -> int:
    if isinstance(value, bool):
        raise errors.type_error(call, f"{what} must be an int rank, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise errors.type_error(call, f"{what} must be an int rank, got {value!r}") from None


def group_rank_of(pg: ProcessGroup, global_rank: Any, grp_rank: Any, call: str, what: str) -> int:
    """The group rank meant by ``what=global_rank`` or ``group_<what>=grp_rank``.

    torch's rule: exactly one of the two is given; global ranks must be members.
    """
    if grp_rank is not None:
        if global_rank is not None:
            raise errors.value_error(
                call, f"pass {what} (global rank) or group_{what} (group rank), not both"
            )
        r = _as_rank(grp_rank, call, f"group_{what}")
        if not 0 <= r < pg._size:
            raise errors.value_error(
                call, f"group_{what}={r} is out of range for a group of size {pg._size}"
            )
        return r
    if global_rank is None:
        raise errors.value_error(
            call, f"{what} (a global rank) or group_{what} (a group rank) is required"
        )
    g = _as_rank(global_rank, call, what)
    r = pg._to_group.get(g)
    if r is None:
        raise errors.value_error(
            call, f"{what}={g} is not a member of the group (global ranks {list(pg.ranks)})"
        )
    return r


def _next_name(ranks: Sequence[int]) -> str:
    """A name every member agrees on: a hash of the members' global ranks and a count.

    The count is how many groups of exactly these ranks this rank made before; members
    always create their groups together, so their counts agree even when other ranks
    (non-members, or ranks outside a subgroup being split) take no part.
    """
    key = tuple(ranks)
    count = registry.names.get(key, 0)
    registry.names[key] = count + 1
    return f"{hashlib.blake2b(repr(key).encode(), digest_size=4).hexdigest()}.{count}"


def _new(comm: MPI.Intracomm, ranks: Sequence[int], name: str, desc: str | None,
         timeout: timedelta | None) -> ProcessGroup:
    pg = ProcessGroup(comm, ranks, name, desc or "undefined", timeout)
    registry.live[id(pg)] = pg
    return pg


def make_world(timeout: timedelta | None, name: str) -> ProcessGroup:
    """The default group: a duplicate of ``MPI_COMM_WORLD`` (never the user's own handle)."""
    registry.names = {}
    comm = MPI.COMM_WORLD.Dup()
    return _new(comm, range(comm.Get_size()), name or "default_pg", "default_pg", timeout)


def free(pg: ProcessGroup) -> None:
    """Release the communicator of ``pg``; the group object stays, marked destroyed."""
    comm, pg.comm = pg.comm, None
    registry.live.pop(id(pg), None)
    if comm is not None and not MPI.Is_finalized():
        comm.Free()


def _check_backend(backend: Any, call: str) -> None:
    if backend is not None and str(backend).lower() != "mpi":
        raise errors.value_error(
            call, f"backend {backend!r} is not supported; mpidist supports backend='mpi'"
        )


def _check_ranks(ranks: Iterable[Any], size: int, call: str, what: str = "ranks") -> list[int]:
    out = [_as_rank(r, call, what) for r in ranks]
    for r in out:
        if not 0 <= r < size:
            raise errors.value_error(call, f"{what} contains {r}, outside 0..{size - 1}")
    if len(set(out)) != len(out):
        dup = sorted({r for r in out if out.count(r) > 1})
        raise errors.value_error(call, f"{what} lists rank(s) {dup} more than once")
    return sorted(out)


def _create(parent: ProcessGroup, members: list[int], desc: str | None,
            timeout: timedelta | None) -> ProcessGroup | _NonGroupMember:
    """Group of ``members`` (group ranks of ``parent``); only members take part in MPI."""
    if parent._rank not in members:
        return GroupMember.NON_GROUP_MEMBER
    name = _next_name([parent.ranks[r] for r in members])
    parent_group = parent.comm.Get_group()
    sub = parent_group.Incl(members)
    try:
        # A fixed tag: only the members call, so no counter is sure to agree among them
        # (split_group on a subgroup advances only its members'); calls are sequential per rank.
        comm = parent.comm.Create_group(sub, tag=0)
    finally:
        sub.Free()
        parent_group.Free()
    return _new(comm, [parent.ranks[r] for r in members], name, desc, timeout)


def new_group(ranks: Sequence[int] | None = None, timeout: timedelta | None = None,
              backend: Any = None, pg_options: Any = None, use_local_synchronization: bool = False,
              group_desc: str | None = None, device_id: Any = None) -> ProcessGroup | Any:
    """Create a group of the given global ranks (``MPI_Comm_create_group``).

    Every rank of the world calls it with the same ``ranks`` (as in torch; with
    ``use_local_synchronization=True`` only the members need to). Members get the new
    :class:`ProcessGroup`, group ranks in ascending global-rank order; the others get
    ``GroupMember.NON_GROUP_MEMBER``. ``ranks=None`` (or empty) means every rank.

    Example: ``g = new_group([0, 2])`` on 4 ranks; rank 2 has ``g.rank() == 1``.
    """
    call = "new_group"
    w = world(call)
    _check_backend(backend, call)
    members = _check_ranks(ranks or range(w._size), w._size, call)
    return _create(w, members, group_desc, timeout or w.timeout)


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
    _check_backend(backend, call)
    _disjoint(spans, call)
    cur = None
    groups = []
    for span in spans:
        pg = _create(parent, span, desc, timeout or parent.timeout)
        groups.append(pg)
        if pg is not GroupMember.NON_GROUP_MEMBER:
            cur = pg
    return cur, groups


def split_group(parent_pg: ProcessGroup | None = None, split_ranks: Sequence[Sequence[int]] | None = None,
                timeout: timedelta | None = None, pg_options: Any = None,
                group_desc: str | None = None) -> ProcessGroup | None:
    """Split ``parent_pg`` into disjoint groups with one ``MPI_Comm_split``.

    ``split_ranks`` lists *group ranks of the parent*, one list per new group (torch's
    rule). Every rank of the parent calls it; a rank in no list gets ``None``.
    """
    call = "split_group"
    parent = resolve(parent_pg, call)
    if not split_ranks:
        raise errors.value_error(call, "split_ranks must list at least one group of ranks")
    spans = [_check_ranks(r, parent._size, call, "split_ranks") for r in split_ranks]
    if not all(spans):
        raise errors.value_error(call, f"split_ranks={split_ranks!r} contains an empty group")
    _disjoint(spans, call)
    color = next((i for i, s in enumerate(spans) if parent._rank in s), MPI.UNDEFINED)
    comm = parent.comm.Split(color, parent._rank)
    if comm == MPI.COMM_NULL:
        return None
    ranks = [parent.ranks[r] for r in spans[color]]
    return _new(comm, ranks, _next_name(ranks), group_desc, timeout or parent.timeout)


def _member(grp: Any, call: str) -> ProcessGroup:
    if grp is None or grp is GroupMember.WORLD:
        return world(call)
    return resolve(grp, call)


def get_group_rank(group: Any, global_rank: int) -> int:  # noqa: A002
    """The group rank of ``global_rank`` in ``group``; ``ValueError`` if not a member."""
    call = "get_group_rank"
    pg = _member(group, call)
    g = _as_rank(global_rank, call, "global_rank")
    r = pg._to_group.get(g)
    if r is None:
        raise errors.value_error(call, f"global rank {g} is not part of group {pg.group_name!r}")
    return r


def get_global_rank(group: Any, group_rank: int) -> int:  # noqa: A002
    """The global rank of ``group_rank`` in ``group``."""
    call = "get_global_rank"
    pg = _member(group, call)
    r = _as_rank(group_rank, call, "group_rank")
    if not 0 <= r < pg._size:
        raise errors.value_error(
            call, f"group rank {r} is out of range for group {pg.group_name!r} of size {pg._size}"
        )
    return pg.ranks[r]


def get_process_group_ranks(group: Any) -> list[int]:  # noqa: A002
    """The global ranks of ``group``'s members, in group-rank order."""
    return list(_member(group, "get_process_group_ranks").ranks)
