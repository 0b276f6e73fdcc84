"""``MPI_Finalize`` in a job that can survive a dead rank (ULFM), set before ``mpi4py.MPI`` loads.

Open MPI 5's ``MPI_Finalize`` waits for every process of the job (a PMIx fence), the dead
too, so a survivor that calls it hangs (open-mpi/ompi#11404); and with the failure detector
on its own thread (which a job of Python ranks needs) ``MPI_Finalize`` itself hung or crashed
in some of the jobs tried here even when no rank died. So in a job started for ULFM
(``mpiexec --with-ft ulfm``, which exports ``OMPI_MCA_mpi_ft_enable``) mpi4py's own finalize
is turned off, and :func:`_at_exit` only waits, bounded, until every live rank of the job has
reached its exit (``MPI_Ibarrier`` over ``MPI_COMM_WORLD``, so no rank leaves while a peer
still needs its messages), then lets the process exit without ``MPI_Finalize``.
"""

from __future__ import annotations

import atexit
import os
import sys
import time


def _ft_job() -> bool:
    return os.environ.get("OMPI_MCA_mpi_ft_enable", "").strip().lower() in ("1", "true", "yes", "on")


def _at_exit() -> None:
    from mpi4py import MPI

    from ..core import faults, job, settings
    from ..core.waiting import Backoff, poll
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    if faults.seen or job.heals:
        return  # a rank died: the barrier would only wait for it to be declared dead
    limit = settings.seconds("MPIDIST_EXIT_TIMEOUT")
    if limit is None:  # no group's timeout to fall back on at exit
        limit = 60.0
    try:
        req = MPI.COMM_WORLD.Ibarrier()
        poll(req.Test, time.monotonic() + limit, Backoff())
    except MPI.Exception:
        pass  # a rank of the job died meanwhile


def _at_exit_late() -> None:
    """:func:`_at_exit` where mpi4py's own finalize is already armed (``mpi4py.MPI`` was imported
    before mpidist): the process ends here, before it. Its status is 1 after an uncaught
    exception, else 0 (a ``sys.exit(n)`` status is lost then: import mpidist first)."""
    _at_exit()
    sys.stdout.flush()
    sys.stderr.flush()
    crashed = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    os._exit(1 if crashed is not None else 0)


if _ft_job():
    if "mpi4py.MPI" not in sys.modules:
        import mpi4py

        mpi4py.rc.finalize = False
        atexit.register(_at_exit)
    else:
        atexit.register(_at_exit_late)
