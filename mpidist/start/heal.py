"""``heal_group``: the world back at full size after ranks died, spares in the dead's places.

In a job started with spares (``MPIDIST_SPARES``, :mod:`mpidist.start.spares`) and for ULFM, every
survivor of the world calls :func:`heal_group` after :class:`~mpidist.ProcessFailureError`. The
survivors agree on the dead (``MPI_Comm_agree`` + ``MPI_Comm_shrink``), the first survivor sends
every waiting spare the new membership, and survivors and spares make the new world together
(:func:`mpidist.core.job.regroup`: ``MPI_Comm_shrink`` of the job's control communicator, then
``MPI_Comm_split``; the spares not called in wait on): the same size, each spare at a dead rank's place, so
every rank keeps its number and rank lists keep their meaning. With fewer spares than dead, the
ranks left without one are dropped (the world shrinks, ranks renumbered, as ``shrink_group``) and a
warning says so. Every other group is destroyed (its communicator lost a member): make the
subgroups again, on every rank, newcomers included, from the same rank lists.

The spares run the script from its start: its ``init_process_group`` makes the world with them
(:func:`mpidist.start.world.start`, which the survivors replay here), and
:func:`mpidist.core.job.is_newcomer` tells them to take the survivors' state
(:func:`mpidist.training.recovery.catch_up`).
"""

from __future__ import annotations

import warnings
from typing import Any

from ..core import errors, faults, groups, job
from ..core.groups import ProcessGroup
from . import shrink, spares, world

CALL = "heal_group"


def plan(dead: list[int], size: int) -> tuple[list[int], list[int], list[int]]:
    """For the dead (job ranks) of a job of ``size``: the new membership (``MPI_COMM_WORLD`` ranks
    in job-rank order), the spares called in, and the job ranks they fill (same on every survivor)."""
    called = job.spares[:len(dead)]
    fill = dict(zip(dead, called))
    members = [fill.get(r, job.members[r]) for r in range(size) if r not in dead or r in fill]
    return members, called, [members.index(s) for s in called]


def heal_group(group: Any = None) -> ProcessGroup:
    """The world again after ranks died: survivors in their places, waiting spares in the dead's.

    Every survivor of the default group calls it (``group``: the world, or ``None``), after
    ``ProcessFailureError``. Collective over the survivors and the spares it calls in:
    ``MPI_Comm_agree``/``MPI_Comm_shrink`` to agree on the dead, a message to each waiting spare,
    ``MPI_Comm_shrink`` + ``MPI_Comm_split`` of the control communicator, then the world's start
    (:func:`mpidist.start.world.start`).
    Returns the new default group: the same size while spares last (every rank keeps its number),
    else smaller by the dead left without a spare (a ``RuntimeWarning`` names them). Every other
    group is destroyed.

    Example, after ``ProcessFailureError`` in a job started with ``MPIDIST_SPARES=1``::

        world = dist.heal_group()                  # every survivor
        dist.get_world_size()                      # as before the death
    """
    pg = shrink._target(group, CALL)
    reg = groups.registry
    if pg is not reg.world:
        raise errors.value_error(CALL, "heal_group heals the default group: call it with no group; then make "
                                       "the subgroups again, on every rank, from the same rank lists")
    dead = faults.agreed_dead(pg, CALL)
    members, called, newcomers = plan(dead, pg._size)
    dropped = dead[len(called):]
    job.heals += 1
    message = {"op": "call", "members": members, "spares": job.spares[len(called):],
               "newcomers": newcomers, "heals": job.heals}
    if job.spares and pg._rank == min(r for r in range(pg._size) if r not in dead):
        spares.call_in(message, job.spares)
    for other in list(reg.live.values()):
        shrink._retire(other)
    reg.world = None
    spares.joined(message)
    new = world.start(**world.started)
    if dropped:
        warnings.warn(f"mpidist: {CALL}: no spare left for rank(s) {dropped}: the world goes on with "
                      f"{new._size} ranks, renumbered (start more spares: MPIDIST_SPARES)",
                      RuntimeWarning, stacklevel=2)
    return new


def spares_left() -> int:
    """How many spares still wait to be called in (the same on every rank of the job)."""
    return len(job.spares)

