"""``shrink_group``: the group without some of its ranks, for the survivors of a failure.

torch's signature and rules (``torch.distributed.shrink_group``): ``ranks_to_exclude`` are group
ranks of ``group``; only the ranks that stay call it; they get a new group, ranks renumbered in
order. The communicator comes from :func:`mpidist.core.faults.shrink`: ``MPI_Comm_create_group``
over the ranks that stay while every member is alive, ``MPI_Comm_shrink`` (ULFM) once one died.

Shrinking the default group makes the result the default group: ranks are renumbered
(``get_rank()`` is the new rank, and the ranks later calls take are ranks of the new world), and,
as in torch, every other group is destroyed, since its global ranks no longer mean the same
processes. The exit watch and the roll call move to the new world. Shrinking another group
destroys that group and leaves the rest alone.
"""

from __future__ import annotations

from typing import Any

from ..checks import failure, rollcall
from ..core import errors, faults, groups
from ..core.groups import GroupMember, ProcessGroup

#: torch's ``shrink_flags``: the default, and "abort pending operations first" (MPI's revoke).
SHRINK_DEFAULT, SHRINK_ABORT = 0, 1


def _excluded(ranks_to_exclude: Any, pg: ProcessGroup, call: str) -> list[int]:
    if not isinstance(ranks_to_exclude, list):
        raise errors.type_error(call, f"ranks_to_exclude must be a list of group ranks, got "
                                      f"{type(ranks_to_exclude).__name__}")
    if not ranks_to_exclude:
        raise errors.value_error(call, "ranks_to_exclude is empty: name at least one group rank to leave out")
    if pg._size < 2:
        raise errors.value_error(call, f"group {pg.group_name!r} has {pg._size} rank: nothing to shrink")
    out: list[int] = []
    for r in ranks_to_exclude:
        if isinstance(r, bool) or not isinstance(r, int):
            raise errors.type_error(call, f"ranks_to_exclude holds {r!r}; group ranks are ints")
        if not 0 <= r < pg._size:
            raise errors.value_error(call, f"rank {r} in ranks_to_exclude is outside 0..{pg._size - 1}")
        if r in out:
            raise errors.value_error(call, f"rank {r} is listed twice in ranks_to_exclude")
        out.append(r)
    if len(out) == pg._size:
        raise errors.value_error(call, f"ranks_to_exclude leaves none of the {pg._size} ranks")
    if pg._rank in out:
        raise errors.runtime_error(call, f"this rank (group rank {pg._rank}) is in ranks_to_exclude: only "
                                         "the ranks that stay call shrink_group")
    return out


def _target(group: Any, call: str) -> ProcessGroup:
    """The group to shrink: also a broken one (the survivors' case), never a destroyed one."""
    if group is None or group is GroupMember.WORLD:
        pg = groups.world(call)
    elif type(group) is ProcessGroup:
        pg = group
    else:
        return groups.resolve(group, call)  # raises the usual errors
    if pg.comm is None and pg.broken is None:
        raise errors.runtime_error(call, f"process group {pg.group_name!r} was destroyed")
    return pg


def shrink_group(ranks_to_exclude: list[int], group: ProcessGroup | None = None,
                 shrink_flags: int = SHRINK_DEFAULT, pg_options: Any = None, *,
                 _failed: bool = False) -> ProcessGroup:
    """The group without ``ranks_to_exclude`` (group ranks of ``group``, default the world).

    Called by the ranks that stay, never by the excluded. While every member is alive this is
    ``MPI_Comm_create_group`` over the ranks that stay; once one died (under ULFM) it is
    ``MPI_Comm_shrink``, which every live member of the group calls, so exclude exactly the dead
    (``ProcessFailureError.failed_ranks`` as group ranks; for the world they are the same).
    Shrinking the default group makes the result the default group, ranks renumbered, and
    destroys every other group (torch's rule). ``shrink_flags=SHRINK_ABORT`` revokes the group's
    communicator first, ending any call still pending on it.

    Example, after ``ProcessFailureError`` on the world::

        world = dist.shrink_group(err.failed_ranks)   # every survivor, same list
        dist.get_rank(), dist.get_world_size()        # renumbered, one fewer
    """
    call = "shrink_group"
    if shrink_flags not in (SHRINK_DEFAULT, SHRINK_ABORT):
        raise errors.value_error(call, f"shrink_flags must be SHRINK_DEFAULT (0) or SHRINK_ABORT (1), "
                                       f"got {shrink_flags!r}")
    pg = _target(group, call)
    out = _excluded(ranks_to_exclude, pg, call)
    keep = [r for r in range(pg._size) if r not in out]
    if shrink_flags == SHRINK_ABORT and pg.comm is not None and faults.ENABLED:
        pg.comm.Revoke()
    comm = faults.shrink(pg, keep, call, _failed)
    is_world = pg is groups.registry.world
    if not is_world:
        new = groups._new(comm, [pg.ranks[r] for r in keep], groups._next_name([pg.ranks[r] for r in keep]),
                          f"{pg.group_desc}:shrunk", pg.timeout)
        _retire(pg)
        return new
    reg = groups.registry
    hosts = [reg.hosts[pg.ranks[r]] if pg.ranks[r] < len(reg.hosts) else "?" for r in keep]
    for other in list(reg.live.values()):
        if other is not pg:
            _retire(other)
    new = groups._new(comm, range(len(keep)), pg.group_name, "default:shrunken", pg.timeout)
    _retire(pg)
    reg.names = {}
    reg.hosts = hosts
    reg.world = GroupMember.WORLD = groups.group.WORLD = new
    errors.WORLD_RANK = new._rank
    groups.learn_local_rank(comm)
    if failure.installed():
        failure.restart(new.comm)
    rollcall.start(new.comm)
    return new


def _retire(pg: ProcessGroup) -> None:
    groups.free(pg)
    faults.forget(pg)
