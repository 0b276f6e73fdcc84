"""The torch ``"mpidist"`` group's membership under failure: abort and its hooks, shrink, reconfigure.

A mixin of :class:`mpidist.torch.backend.MpidistProcessGroup`: torch's fault-tolerance calls on a
group (``_abort_process_group``, ``register_abort_hook``, ``shrink_group``, torch 2.14's
``_reconfigure`` family), each one mpidist or MPI call on the group's ``mpi_group``
(:mod:`mpidist.start.shrink`, :mod:`mpidist.torch.reconfigure`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch.distributed as tdist

from ..core import faults, groups
from ..start import shrink
from . import overlap, reconfigure
from . import work as twork


class FaultTolerance:
    """What a group does when members die or change (mixed into ``MpidistProcessGroup``)."""

    mpi_group: Any
    _name: str
    _sync_limit: int

    def abort(self) -> None:
        """End the group now (torch's ``_abort_process_group``, ``DeviceMesh`` abort): the abort
        hooks run first; under ULFM the communicator is then revoked, so calls pending on it fail
        on every member."""
        groups.run_abort_hooks(self.mpi_group)
        comm = self.mpi_group.comm
        if comm is not None and faults.ENABLED:
            try:
                comm.Revoke()
            except Exception:  # noqa: BLE001 - already revoked: the end is the same
                pass
        self.shutdown()

    def register_abort_hook(self, hook_id: int, hook: Callable[[], None]) -> None:
        """torch 2.14's ``register_abort_hook``: ``hook()`` runs once, before the group goes, when
        a call on it times out or finds a dead member (the group breaks) or :meth:`abort` is
        called; a ``hook_id`` already registered is replaced."""
        self.mpi_group.abort_hooks[int(hook_id)] = hook

    def unregister_abort_hook(self, hook_id: int) -> None:
        """Drop the hook registered as ``hook_id`` (nothing happens for an unknown id)."""
        self.mpi_group.abort_hooks.pop(int(hook_id), None)

    @property
    def supports_reconfigure(self) -> bool:
        """torch 2.14's ``_supports_reconfigure``: every group on this backend can be reconfigured."""
        return True

    def get_reconfigure_handle(self) -> str:
        """torch 2.14's ``_get_reconfigure_handle``: ``mpi:world:<this process's rank in
        MPI_COMM_WORLD>``, the same for every group and for the life of the job."""
        return reconfigure.handle()

    def reconfigure(self, opts: Any) -> twork.Work:
        """torch 2.14's ``_reconfigure``: the processes ``opts.handles`` become this group's members
        (a list gives their ranks by position, a set by ascending handle), on this same object.

        Called by exactly the processes listed, with the same handles and a fresh ``opts.uuid``
        (a used one raises ``RuntimeError``, "already used"). They meet with point-to-point
        messages within ``opts.timeout`` (default the group's; past it each raises
        ``RuntimeError``, "Timed out", naming the handles not heard from), then make the
        communicator (``MPI_Comm_create_from_group``). Reconfiguring the default group moves
        mpidist's world too and destroys the other groups (docs/reconfigure.md has an example).
        """
        self.mpi_group = reconfigure.regroup(self, opts, self is tdist.GroupMember.WORLD)
        self._sync_limit = overlap.sync_bytes(self.mpi_group.comm, overlap.from_env())  # collective
        return twork.done([])

    @property
    def supports_shrinking(self) -> bool:
        """``torch.distributed.shrink_group`` works on this backend."""
        return True

    def shrink(self, ranks_to_exclude: list[int], shrink_flags: int = 0,
               opts: Any = None) -> Any:
        """The backend of the group without ``ranks_to_exclude`` (group ranks), for torch's
        ``shrink_group``: :func:`mpidist.shrink_group` on this group's communicator. For the
        default group, mpidist's world shrinks too (torch's default group is a duplicate of it),
        and the new backend is a duplicate of the shrunk world."""
        g = self.mpi_group
        if g.group_desc != "default_pg":
            new = shrink.shrink_group(list(ranks_to_exclude), g, shrink_flags)
            return type(self)(new, new._rank, new._size)
        # the world has the same members: once they agreed on the dead here, it shrinks at once
        world = shrink.shrink_group(list(ranks_to_exclude), None, shrink_flags,
                                    _failed=faults.failed_ranks(g) is not None)
        self.shutdown()
        new = groups.duplicate(world, self._name, "default_pg", g.timeout)
        return type(self)(new, new._rank, new._size)
