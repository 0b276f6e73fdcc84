"""The job's processes: ``MPI_COMM_WORLD`` less its spare ranks, and the spares still waiting.

A job started with spares (``MPIDIST_SPARES=k``) has ``k`` processes at the end of
``MPI_COMM_WORLD`` that the script never sees: they wait (:mod:`mpidist.start.spares`) until a rank
dies and the survivors call one in to take its place (:mod:`mpidist.start.heal`). Every step that
speaks for the whole job (start-up checks, the rendezvous, the world group, the exit) uses
:data:`world`, never ``MPI_COMM_WORLD`` itself; without spares the two are the same processes.
"""

from __future__ import annotations

from mpi4py import MPI

#: The job's processes, in job-rank order: ``MPI_COMM_WORLD`` without spares, or after a heal
#: the communicator of the survivors and the spares that took the dead's places.
world: MPI.Intracomm = MPI.COMM_WORLD
#: The ``MPI_COMM_WORLD`` rank of each job rank (what names a process for the job's whole life).
members: list[int] = list(range(MPI.COMM_WORLD.Get_size()))
#: ``MPI_COMM_WORLD`` ranks of the spares still waiting, in the order they are called in.
spares: list[int] = []
#: Every live process of the job, spares included: a duplicate of ``MPI_COMM_WORLD`` made at start,
#: after each heal its ``MPI_Comm_shrink`` (the dead left out). The survivors call spares in over
#: it (``None`` in a job without spares).
control: MPI.Intracomm | None = None
#: Job ranks that this process's last heal filled with spares (on every member alike).
newcomers: list[int] = []
#: Heals so far, the same on every member: the next one's tag.
heals = 0


def rank() -> int:
    """This process's rank in the job."""
    return world.Get_rank()


def size() -> int:
    """The job's size (spares not counted)."""
    return world.Get_size()


def is_newcomer() -> bool:
    """Whether this process is a spare called in to take a dead rank's place (its script started
    when it was called in, and must take the survivors' state: :func:`mpidist.training.recovery.catch_up`)."""
    return rank() in newcomers


def translate(ranks: list[int], comm: MPI.Comm) -> list[int]:
    """``MPI_COMM_WORLD`` ranks as ranks of ``comm`` (``MPI_UNDEFINED`` where absent):
    ``MPI_Group_translate_ranks``."""
    theirs, mine = MPI.COMM_WORLD.Get_group(), comm.Get_group()
    try:
        return list(MPI.Group.Translate_ranks(theirs, ranks, mine))
    finally:
        theirs.Free()
        mine.Free()


def regroup(members: list[int]) -> None:
    """The job after a heal: ``members`` (``MPI_COMM_WORLD`` ranks, in the order of their new
    ranks) become :data:`world`. Collective over every live process of the job, members and
    spares still waiting (:data:`control`; without spares, over the old :data:`world`):
    ``MPI_Comm_shrink`` leaves the dead out, then ``MPI_Comm_split`` keeps the members, and the
    shrunk communicator is the new :data:`control`. Both are ULFM's and MPI's own collectives, and
    unlike ``MPI_Comm_create_from_group`` they need no process outside the job to be waited for."""
    global world, control
    base = control if control is not None else world
    alive = base.Shrink()
    alive.Set_errhandler(MPI.ERRORS_RETURN)
    me = MPI.COMM_WORLD.Get_rank()
    world = alive.Split(0 if me in members else MPI.UNDEFINED, members.index(me) if me in members else 0)
    if control is None:
        alive.Free()
        return
    old, control = control, alive
    old.Free()


def join(members: list[int], tag: str) -> MPI.Intracomm:
    """The communicator of the processes ``members`` (``MPI_COMM_WORLD`` ranks, in the order of
    their new ranks): ``MPI_Comm_create_from_group``, collective over exactly them, matched by
    ``tag`` (a heal's or a reconfigure's own)."""
    everyone = MPI.COMM_WORLD.Get_group()
    try:
        chosen = everyone.Incl(members)
    finally:
        everyone.Free()
    try:
        return MPI.Intracomm.Create_from_group(chosen, tag, MPI.INFO_NULL, MPI.ERRORS_RETURN)
    finally:
        chosen.Free()
