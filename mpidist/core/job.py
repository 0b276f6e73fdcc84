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
#: A duplicate of ``MPI_COMM_WORLD`` made at start by every process, spares included: the
#: survivors call spares in over it (``None`` in a job without spares).
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
