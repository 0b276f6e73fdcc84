"""Process groups as MPI communicators: the group object, resolution and rank translation.

A :class:`ProcessGroup` is one MPI intracommunicator plus the global ranks of its
members, in group-rank order. :func:`create` is the one way a group of chosen ranks is
made (for mpidist's API in :mod:`mpidist.core.subgroups` and for the torch backend alike).
"""

from __future__ import annotations

import hashlib
import operator
import threading
import warnings
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Iterator, Sequence

from mpi4py import MPI

from . import cpus, errors, job


class ProcessGroup:
    """One MPI communicator and the global ranks of its members.

    ``comm`` is the raw ``mpi4py`` communicator (use it for anything mpidist lacks);
    ``ranks`` lists the members' global ranks, indexed by group rank. ``seq`` counts the
    collectives issued on the group, the same on every member (point-to-point calls, which only
    some make, leave it alone); ``broken`` says why the group can no longer be used (a call
    timed out, :mod:`mpidist.core.timeouts`), else ``None``; ``abort_hooks`` are called once,
    when it breaks or is aborted (torch's ``register_abort_hook``).
    """

    __slots__ = ("comm", "ranks", "_rank", "_size", "_to_group", "group_name", "group_desc",
                 "timeout", "seq", "broken", "abort_hooks", "_abandoned", "signatures", "lock", "holder",
                 "__weakref__")

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
        self.seq = 0
        self.broken: str | None = None
        self.abort_hooks: dict[int, Callable[[], None]] = {}
        self._abandoned: list[Any] = []  # requests and buffers of calls given up on
        self.signatures: Any = None  # the calls since the last cross-rank check (checks.signature)
        #: held by the thread in a call on the group (:func:`mpidist.core.concurrency.busy`);
        #: ``holder``: that call and thread
        self.lock = threading.RLock()
        self.holder: tuple[Any, int] | None = None

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


#: ``GroupMember.NON_GROUP_MEMBER``, for the calls that test for it first.
NON_GROUP_MEMBER = GroupMember.NON_GROUP_MEMBER


class group:  # noqa: N801 - torch spells it ``dist.group.WORLD``
    """``group.WORLD`` is the default process group (``None`` before init)."""

    WORLD: ProcessGroup | None = None


class _Registry:
    """The live groups of this process. ``world`` is ``None`` outside init/destroy."""

    world: ProcessGroup | None = None
    live: dict[int, ProcessGroup] = {}
    names: dict[tuple[int, ...], int] = {}
    was_destroyed = False
    generation = 0  # how many times the world was made (the same count on every rank)
    hosts: list[str] = []  # host name of each global rank, gathered at init
    local_rank = -1  # this rank among the world's ranks on its node (MPI_COMM_TYPE_SHARED), from init
    local_size = 0  # the world's ranks on this rank's node, from init
    local_masks: tuple[frozenset[int], ...] = ()  # the CPU mask of each of them (node-rank order), from init
    made = 0  # groups whose making this rank took part in since init, the world included (get_pg_count)


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


def _unusable(pg: ProcessGroup, call: Any) -> RuntimeError:
    if pg.broken is not None:
        return errors.runtime_error(call, f"process group {pg.group_name!r} is broken: {pg.broken}")
    if registry.world is None:
        return _not_initialized(call)
    return errors.runtime_error(call, f"process group {pg.group_name!r} was destroyed")


def resolve(grp: Any, call: Any) -> ProcessGroup:
    """The group a call runs on: ``None`` is the default group; ``NON_GROUP_MEMBER`` raises
    :class:`~mpidist.core.errors.NotAMemberError` (a declared call returns on it, as in torch)."""
    if grp is None:
        pg = registry.world
        if pg is None:
            raise _not_initialized(call)
        if pg.comm is None:
            raise _unusable(pg, call)
        return pg
    if type(grp) is ProcessGroup:
        if grp.comm is None:
            raise _unusable(grp, call)
        return grp
    if grp is GroupMember.NON_GROUP_MEMBER:
        world(call)
        raise errors.NotAMemberError(errors.message(
            call, "this rank is not a member of the group (new_group returned NON_GROUP_MEMBER)"))
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
    """The default group: a duplicate of the job's communicator (``MPI_COMM_WORLD`` less any spare
    ranks, :mod:`mpidist.core.job`; never the user's own handle)."""
    registry.names = {}
    registry.made = 1
    registry.generation += 1
    comm = job.world.Dup()
    registry.hosts = comm.allgather(MPI.Get_processor_name())
    learn_local_rank(comm)
    return _new(comm, range(comm.Get_size()), name or "default_pg", "default_pg", timeout)


def learn_local_rank(comm: MPI.Intracomm) -> None:
    """Keep this rank's rank among ``comm``'s ranks on its node, their number and their CPU masks
    (``MPI_Comm_split_type`` with ``MPI_COMM_TYPE_SHARED``, an ``MPI_Allgather`` in the node):
    what ``get_node_local_rank`` answers once the world is made, and whether the ranks share cores."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    registry.local_rank, registry.local_size = node.Get_rank(), node.Get_size()
    registry.local_masks = tuple(node.allgather(cpus.mask()))
    node.Free()


def free(pg: ProcessGroup) -> None:
    """Release the communicator of ``pg``; the group object stays, marked destroyed."""
    comm, pg.comm = pg.comm, None
    registry.live.pop(id(pg), None)
    if comm is not None and not MPI.Is_finalized():
        try:
            comm.Free()
        except MPI.Exception:
            pass  # revoked under ULFM: the group is gone either way


def run_abort_hooks(pg: ProcessGroup) -> None:
    """Call ``pg``'s abort hooks once each, in registration order, before the group goes (a hook
    captures debug state; one that raises is reported as a warning and the others still run)."""
    hooks, pg.abort_hooks = pg.abort_hooks, {}
    for hook_id, hook in hooks.items():
        try:
            hook()
        except Exception as exc:  # noqa: BLE001 - the abort goes on whatever a hook does
            warnings.warn(f"mpidist: abort hook {hook_id} of process group {pg.group_name!r} raised "
                          f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)


def break_group(pg: ProcessGroup, abandoned: Any, reason: str | None = None) -> None:
    """Mark ``pg`` unusable after a call on it was given up; keep ``abandoned`` alive.

    The communicator is set aside, not freed: MPI cannot cancel a collective, and the
    abandoned requests may still read or write their buffers.
    """
    if pg.broken is None:
        pg.broken = reason or f"a call on it timed out (after call #{pg.seq})"
        run_abort_hooks(pg)
    pg._abandoned.append((pg.comm, abandoned))
    pg.comm = None
    registry.live.pop(id(pg), None)


@contextmanager
def limited(pg: ProcessGroup, limit: float) -> Iterator[None]:
    """``limit`` seconds in place of ``pg``'s timeout while a call starts (``barrier(timeout=)``),
    so that the cross-rank check it may take first is bounded by it too."""
    old, pg.timeout = pg.timeout, timedelta(seconds=limit)
    try:
        yield
    finally:
        pg.timeout = old


def check_backend(backend: Any, call: str) -> None:
    """Refuse any backend but ``"mpi"`` (any case; ``None`` means the default, ``"mpi"``)."""
    if backend is not None and (not isinstance(backend, str) or backend.lower() != "mpi"):
        raise errors.value_error(
            call, f"backend {backend!r} is not supported; the supported backend is 'mpi'"
        )


def create(parent: ProcessGroup, members: list[int], desc: str | None, timeout: timedelta | None,
           name: str | None = None, ordered: bool = False) -> ProcessGroup | _NonGroupMember:
    """Group of ``members`` (group ranks of ``parent``); only members take part in MPI.
    ``ordered``: the members' order was chosen (``sort_ranks=False``), see :func:`create_comm`.

    The one way mpidist makes a group of chosen ranks, for its own API and the torch backend
    alike: ``MPI_Comm_create_group`` on the parent's communicator with a fixed tag. The tag
    only tells apart creations that run at the same time on one rank; a rank creates its
    groups one after another, and the members of a group create it in the same order.
    """
    registry.made += 1
    if parent._rank not in members:
        return GroupMember.NON_GROUP_MEMBER
    ranks = [parent.ranks[r] for r in members]
    return _new(create_comm(parent.comm, members, ordered), ranks, name or _next_name(ranks), desc, timeout)


def create_comm(parent: MPI.Intracomm, members: Sequence[int], ordered: bool = False) -> MPI.Intracomm:
    """``MPI_Comm_create_group`` of ``parent``'s ranks ``members``, in that order; only they call it.

    Members that list the same ranks in different orders (``new_group(sort_ranks=False)``) would
    leave ``MPI_Comm_create_group`` waiting for ever. So an ``ordered`` group (every member says so,
    even one whose own list is ascending), or an order that is not ascending, is made in two
    steps: the group in ascending order, where the members check that they all gave the same order
    (``MPI_Allgather`` of its hash; ``ValueError`` on every member otherwise), then
    ``MPI_Comm_split`` into that order.
    """
    order = list(members)
    ascending = sorted(order)
    parent_group = parent.Get_group()
    sub = parent_group.Incl(ascending)
    try:
        comm = parent.Create_group(sub, tag=0)
    finally:
        sub.Free()
        parent_group.Free()
    if order == ascending and not ordered:
        return comm
    try:
        key = hashlib.blake2b(repr(order).encode(), digest_size=8).hexdigest()
        if len(set(comm.allgather(key))) > 1:
            given = comm.allgather(order)
            raise errors.value_error("new_group", "the members gave their ranks in different orders "
                                     f"with sort_ranks=False: {given} (in ascending rank order); every "
                                     "member must pass the same list")
        return comm.Split(0, order.index(parent.Get_rank()))
    finally:
        comm.Free()


def duplicate(pg: ProcessGroup, name: str, desc: str | None, timeout: timedelta | None) -> ProcessGroup:
    """A new group of the same ranks as ``pg`` on a duplicate of its communicator (``MPI_Comm_dup``)."""
    return _new(pg.comm.Dup(), pg.ranks, name, desc, timeout)


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
