"""torch 2.14's reconfigure contract on the ``"mpidist"`` backend: a group's members chosen anew.

torch's ``_get_reconfigure_handle(group)`` names a process; ``_reconfigure(uuid, handles, group)``,
called by exactly the processes listed, gives ``group`` those members (a list assigns group ranks by
position, a set by ascending handle), on the same group object. Here a handle names a process of
``MPI_COMM_WORLD`` (:func:`handle`: ``mpi:world:<rank>``, stable for the job's life, also after
other processes died). The listed processes meet within the call's timeout
(:func:`mpidist.torch.handshake.handshake`), then make the communicator with
``MPI_Comm_create_from_group`` over their group in ``MPI_COMM_WORLD``, tagged by the uuid
(:func:`communicator`), and :func:`regroup` puts it under the torch group; for the default group,
mpidist's world follows (:func:`adopt_world`), as it does for ``shrink_group``.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import torch.distributed as tdist
import torch.distributed.distributed_c10d as c10d
from mpi4py import MPI

from ..checks import failure, rollcall
from ..core import errors, faults, groups, job
from ..core.groups import GroupMember, ProcessGroup
from ..core.waiting import seconds
from .handshake import handshake

#: torch's name for the call, in every error.
CALL = "_reconfigure"
#: Every handle starts so; the kind follows (``world``: a rank of ``MPI_COMM_WORLD``).
PREFIX = "mpi:"
WORLD = "world"
#: Handle kinds that name processes mpidist cannot reach yet, and why.
NOT_YET = {"port": "a process started apart (MPI_Comm_connect to a port name) cannot yet join a group"}
#: The uuids this process has reconfigured with (a uuid names one configuration, once).
_used: set[int] = set()


def handle() -> str:
    """This process's handle: ``mpi:world:<its rank in MPI_COMM_WORLD>``."""
    return f"{PREFIX}{WORLD}:{MPI.COMM_WORLD.Get_rank()}"


def world_rank(text: Any, call: str = CALL) -> int:
    """The ``MPI_COMM_WORLD`` rank a handle names; ``ValueError`` for one that names none,
    ``RuntimeError`` for a kind mpidist does not support yet."""
    if not isinstance(text, str) or not text.startswith(PREFIX):
        raise errors.value_error(call, f"handle {text!r} is not an mpidist handle: handles come from "
                                       f"_get_reconfigure_handle() on the 'mpidist' backend ({PREFIX}"
                                       f"{WORLD}:<rank in MPI_COMM_WORLD>)")
    kind, _, rest = text[len(PREFIX):].partition(":")
    if kind in NOT_YET:
        raise errors.runtime_error(call, f"handle {text!r}: {NOT_YET[kind]}; list processes of this job "
                                         f"({PREFIX}{WORLD}:<rank>)")
    if kind != WORLD:
        raise errors.value_error(call, f"handle {text!r} is of kind {kind!r}; the kinds are {WORLD!r}")
    n = MPI.COMM_WORLD.Get_size()
    if not (rest.isascii() and rest.isdigit()) or int(rest) >= n:
        raise errors.value_error(call, f"handle {text!r} names no process: MPI_COMM_WORLD has ranks "
                                       f"0..{n - 1}")
    return int(rest)


def members(handles: Any, call: str = CALL) -> list[int]:
    """The ``MPI_COMM_WORLD`` ranks of ``handles`` in new group-rank order: a list's order, a set's
    ascending (every member then sees the same order). This process must be among them."""
    if isinstance(handles, (str, bytes)) or not isinstance(handles, Iterable):
        raise errors.type_error(call, f"handles must be a list or set of handles, got {handles!r}")
    listed = list(handles)
    ranks = [world_rank(h, call) for h in listed]
    if not ranks:
        raise errors.value_error(call, "handles is empty: list the handle of every member of the new group")
    seen: dict[int, Any] = {}
    for h, r in zip(listed, ranks):
        if r in seen:
            raise errors.value_error(call, f"handle {h!r} is listed twice")
        seen[r] = h
    me = MPI.COMM_WORLD.Get_rank()
    if me not in seen:
        raise errors.runtime_error(call, f"this process ({handle()}) is not in handles {listed!r}: only the "
                                         "processes listed call _reconfigure")
    return sorted(ranks) if isinstance(handles, (set, frozenset)) else ranks


def names(ranks: Iterable[int]) -> list[str]:
    """The handles of ``MPI_COMM_WORLD`` ranks."""
    return [f"{PREFIX}{WORLD}:{r}" for r in ranks]


def claim(uuid: Any, call: str = CALL) -> int:
    """Record ``uuid`` as used by this process; ``RuntimeError`` ("already used") if it was."""
    if isinstance(uuid, bool) or not isinstance(uuid, (int, np.integer)):
        raise errors.type_error(call, f"uuid must be an int, got {uuid!r}")
    uuid = int(uuid)
    if uuid in _used:
        raise errors.runtime_error(call, f"uuid {uuid} was already used by this process; each reconfigure "
                                         "takes a fresh uuid")
    _used.add(uuid)
    return uuid


def comm_of(pg: ProcessGroup) -> MPI.Intracomm | None:
    """``pg``'s communicator, or the one it had before it broke (``None`` once destroyed)."""
    if pg.comm is not None:
        return pg.comm
    return next((c for c, _ in reversed(pg._abandoned) if c is not None), None)


def global_ranks(ranks: list[int], call: str = CALL) -> list[int]:
    """The default group's ranks of ``MPI_COMM_WORLD``'s processes ``ranks``: what torch calls their
    global ranks; ``ValueError`` for a process outside the default group."""
    comm = comm_of(groups.world(call))
    if comm is None:
        raise errors.runtime_error(call, "the default group was destroyed")
    out = job.translate(ranks, comm)
    outside = [r for r, g in zip(ranks, out) if g == MPI.UNDEFINED]
    if outside:
        raise errors.value_error(call, f"handles {names(outside)} are not in the default group: a group "
                                       "other than the default one takes members of the default group "
                                       "(reconfigure the default group first)")
    return out


def retire(pg: ProcessGroup) -> None:
    """Free ``pg``'s communicator (one that broke keeps it set aside) and its failure state."""
    groups.free(pg)
    faults.forget(pg)


def adopt_world(comm: MPI.Intracomm) -> ProcessGroup:
    """mpidist's world on ``comm`` (the reconfigured default group's members, renumbered): every
    other group of this process is retired, as for ``shrink_group`` of the world. Collective over
    ``comm``: the hosts (``MPI_Allgather``), the node split, and the exit watch and roll call,
    which move to the new world (``MPI_Comm_dup`` each)."""
    reg = groups.registry
    old = reg.world
    for other in list(reg.live.values()):
        retire(other)
    if old is not None:
        retire(old)
    name = old.group_name if old is not None else "default_pg"
    new = groups._new(comm, range(comm.Get_size()), name, "default:reconfigured",
                      old.timeout if old is not None else None)
    reg.names = {}
    reg.hosts = comm.allgather(MPI.Get_processor_name())
    reg.world = GroupMember.WORLD = groups.group.WORLD = new
    errors.WORLD_RANK = new._rank
    groups.learn_local_rank(comm)
    if failure.installed():
        failure.restart(comm)
    rollcall.start(comm)
    return new


def timeout_of(opts: Any, pg: ProcessGroup) -> float | None:
    """The call's timeout in seconds: ``opts.timeout``, else the group's (``None``: no limit)."""
    own = getattr(opts, "timeout", None)
    return seconds(own if own is not None else pg.timeout)


def regroup(group: Any, opts: Any, is_default: bool) -> ProcessGroup:
    """The mpidist group under torch group ``group`` (its ``mpi_group``) after torch's
    ``ReconfigureOptions`` ``opts``: the checks, the handshake, :func:`communicator`; then
    torch's map of the group's global ranks to group ranks is set anew. ``is_default``: torch's
    default group, whose reconfigure moves mpidist's world (:func:`adopt_world`, ranks renumbered)
    and destroys every other torch group; another group's members must be in the default group."""
    call, g = CALL, group.mpi_group
    ranks = members(opts.handles, call)
    renumbered = list(range(len(ranks))) if is_default else global_ranks(ranks, call)
    uuid = claim(opts.uuid, call)
    handshake(ranks, uuid, timeout_of(opts, g), call, dict(zip(ranks, names(ranks))))
    try:
        comm = job.join(ranks, f"mpidist:reconfigure:{uuid}")
    except MPI.Exception as exc:
        raise errors.runtime_error(call, f"MPI_Comm_create_from_group failed: {exc.Get_error_string()}"
                                   ) from None
    if is_default:
        for other in list(c10d._world.pg_map):
            if other is not group:
                tdist.destroy_process_group(other)
        world = adopt_world(comm)  # retires g with every other mpidist group
        new = groups.duplicate(world, g.group_name, "default_pg", g.timeout)
    else:
        new = groups._new(comm, renumbered, g.group_name, g.group_desc, g.timeout)
        retire(g)
    c10d._world.pg_group_ranks[group] = {r: i for i, r in enumerate(renumbered)}
    return new
