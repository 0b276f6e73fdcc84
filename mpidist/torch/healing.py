"""The torch side of :func:`mpidist.heal_group`: torch's default group onto the healed world.

:func:`heal` is what survivors call after a rank died in a job started with spares; it replays,
on the survivors, what the spares it calls in do in their script's ``init_process_group("mpidist")``
(:func:`mpidist.torch.backend.create`), so that both make the same MPI calls in the same order:
the world's start, a duplicate of it for torch's default group, the exit watch, the node count.
torch's other groups are destroyed (their communicators lost a member): make them again on every
rank, newcomers included, from the same rank lists.
"""

from __future__ import annotations

import torch.distributed as tdist
import torch.distributed.distributed_c10d as c10d

from ..checks import failure
from ..core import errors, groups, job
from ..start import heal as _heal
from . import overlap
from .backend import SYNC_BYTES, MpidistProcessGroup

CALL = "heal"


def heal() -> None:
    """Survivors of a torch job on the ``"mpidist"`` backend: :func:`mpidist.heal_group`, then
    torch's default group on the new world, keeping its rank numbers (each spare takes a dead
    rank's). Collective over the survivors and the spares called in (see the module docstring).

    Example, in a job started with ``MPIDIST_SPARES=1`` under ULFM::

        except Exception as exc:
            if process_failure(exc) is None:
                raise
            mpidist.torch.heal()                     # every survivor
            catch_up(module, optimizer, step=step)   # the newcomer takes the survivors' state
            model = DDP(module)                      # as the newcomer's script builds it
    """
    default = c10d._get_default_group() if tdist.is_initialized() else None
    if not isinstance(default, MpidistProcessGroup):
        raise errors.runtime_error(CALL, "torch's default group is not on the mpidist backend: "
                                         "init_process_group('mpidist') first")
    if _heal.spares_left() == 0:
        raise errors.runtime_error(CALL, "no spare left to take a dead rank's place: go on smaller with "
                                         "torch.distributed.shrink_group(err.failed_ranks)")
    for pg in list(c10d._world.pg_map):
        if pg is not default:
            tdist.destroy_process_group(pg)
    old = default.mpi_group
    world = _heal.heal_group()
    if world._size != old._size:
        raise errors.runtime_error(CALL, f"the world shrank to {world._size} ranks (no spare left): torch's "
                                         "default group keeps its size; use torch.distributed.shrink_group "
                                         "when spares_left() is 0")
    default.mpi_group = groups.duplicate(world, old.group_name, "default_pg", old.timeout)
    if failure.installed():
        failure.restart(job.world)
    default._sync_limit = overlap.sync_bytes(default.mpi_group.comm, SYNC_BYTES)
