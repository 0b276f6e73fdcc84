"""Spare ranks: processes started with the job that wait, without spinning a core, to be called in.

``MPIDIST_SPARES=k`` (``mpiexec -n N+k``, ``srun --ntasks=N+k``) makes the last ``k`` processes
of ``MPI_COMM_WORLD`` spares. :func:`set_aside` runs when mpidist is imported, collectively over
``MPI_COMM_WORLD``: the first ``N`` processes go on with a job world of ``N`` ranks
(:data:`mpidist.core.job.world`; the script sees no spare). Each spare runs the script up to the
first step that speaks for the job (its ``init_process_group``: :func:`park`), so that its imports
and data are ready, and waits there in :func:`wait`: an ``MPI_Iprobe`` on the control
communicator, then a sleep that grows to :data:`LONGEST_SLEEP`. When a rank dies, the survivors'
:func:`mpidist.heal_group` sends every waiting spare the new membership; together they make the
new world (:func:`mpidist.core.job.regroup`), and a spare called in goes on with its script from
there as the dead rank's replacement (:func:`mpidist.core.job.is_newcomer`); the others wait on. When the
job ends, its rank 0 releases the spares still waiting (:func:`release`), which then exit with status 0.
"""

from __future__ import annotations

import atexit
import importlib
import sys
from typing import Any

from mpi4py import MPI

from ..core import errors, faults, job, settings
from ..core.waiting import Backoff

#: The tag of every message on the control communicator.
TAG = 7
#: A waiting spare's longest sleep between two probes: how late it may notice a call.
LONGEST_SLEEP = 0.05
CALL = "MPIDIST_SPARES"


def count() -> int:
    """``MPIDIST_SPARES`` (0 when unset)."""
    return settings.integer(CALL) or 0


def set_aside(k: int | None = None) -> None:
    """Split off the last ``k`` (default :func:`count`) processes as spares (they wait at :func:`park`).

    Collective over ``MPI_COMM_WORLD`` (``MPI_Comm_dup`` for the control communicator, then
    ``MPI_Comm_split``).
    """
    k = count() if k is None else k
    if k <= 0 or job.control is not None:
        return
    n, me = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()
    if k >= n:
        raise errors.value_error(CALL, f"{k} spare(s) leave none of the {n} processes started to run the "
                                       f"script: start {k} more (mpiexec -n {n + k}) or ask for fewer")
    job.control = MPI.COMM_WORLD.Dup()
    job.control.Set_errhandler(MPI.ERRORS_RETURN)
    job.spares = list(range(n - k, n))
    spare = me >= n - k
    part = MPI.COMM_WORLD.Split(1 if spare else 0, me)
    if spare:  # no job of its own until called in: a call on job.world before then fails
        part.Free()
        job.world = MPI.COMM_NULL
        return
    job.world, job.members = part, list(range(n - k))
    atexit.register(release)


def park() -> None:
    """Where the script first speaks for the job (``init_process_group``, torch's rendezvous,
    ``mpidist.run``, ``use_for_cpu``): a spare not yet called in waits here (:func:`wait`), after
    running the script up to that point (its imports, its data), so that it starts warm."""
    if job.world == MPI.COMM_NULL and job.control is not None:
        warm()
        wait()


def warm() -> None:
    """In a torch script, import now what a newcomer's first ``DistributedDataParallel`` would:
    its constructor imports ``torch._dynamo`` (about 900 modules), and the survivors would wait
    for that in its parameters' broadcast."""
    if "torch" in sys.modules:
        try:
            importlib.import_module("torch._dynamo")
        except ImportError:
            pass  # a torch without it: its DDP does not import it either


def wait() -> None:
    """Wait, probing the control communicator between sleeps, until a heal calls this spare in
    (a heal that leaves it waiting is taken part in, then waited past) or the job releases it."""
    while job.world == MPI.COMM_NULL:
        message = _next()
        if message["op"] == "release":
            faults.seen = faults.seen or message["died"]
            sys.exit(0)
        joined(message)


def _next() -> dict[str, Any]:
    """The next message on the control communicator (``MPI_Iprobe`` between growing sleeps)."""
    ctl = job.control
    assert ctl is not None
    pause = Backoff(first=1e-3, longest=LONGEST_SLEEP)
    status = MPI.Status()
    while True:
        try:
            if ctl.Iprobe(MPI.ANY_SOURCE, TAG, status):
                return ctl.recv(source=status.Get_source(), tag=TAG)
        except MPI.Exception as exc:
            if not faults.is_failure(exc, ctl):
                raise
            ctl.Ack_failed()  # a process of the job died: the survivors will call, or release
            continue
        pause.sleep()


def call_in(message: dict[str, Any], waiting: list[int]) -> None:
    """Send ``message`` (the new membership) to each spare in ``waiting`` (``MPI_COMM_WORLD``
    ranks): those it calls in and those it leaves waiting, since all of them take part in the
    heal's ``MPI_Comm_shrink`` of the control communicator."""
    assert job.control is not None
    for spare in job.translate(waiting, job.control):
        job.control.send(message, dest=spare, tag=TAG)


def joined(message: dict[str, Any]) -> None:
    """Take the membership a heal brought (:func:`mpidist.core.job.regroup`, collective over the
    survivors and every waiting spare); a spare it calls in has the job world from here on."""
    job.regroup(list(message["members"]))
    job.members, job.spares = list(message["members"]), list(message["spares"])
    job.newcomers, job.heals = list(message["newcomers"]), message["heals"]
    if job.world == MPI.COMM_NULL:
        return
    errors.WORLD_RANK = job.world.Get_rank()
    atexit.register(release)  # this process may be the job's rank 0 now


def release() -> None:
    """Job rank 0, at exit: tell every spare still waiting to exit (status 0)."""
    if job.control is None or not job.spares or job.rank() != 0 or MPI.Is_finalized():
        return
    waiting, job.spares = job.spares, []
    for spare in job.translate(waiting, job.control):
        try:
            job.control.send({"op": "release", "died": faults.seen}, dest=spare, tag=TAG)
        except MPI.Exception:
            pass  # the spare died too: nothing waits there any more
