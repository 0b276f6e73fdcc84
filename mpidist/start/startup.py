"""A bound on ``MPI_Init``: one process that never starts MPI must not hang the whole job.

Under a launcher, ``MPI_Init`` waits for every process of the job (the PMI exchange of
addresses). A process that dies before it (``import mpidist`` failing on a node without
mpidist, a node without the Python or virtualenv the job names) leaves every other
process blocked in ``MPI_Init`` for good: MPICH's hydra does not end the job when a
process exits before initialising MPI. ``MPI_Init`` holds the GIL, so no Python thread
can watch it; a watcher forked before it can. It waits on a pipe; if ``MPI_Init`` has not
returned after ``MPIDIST_INIT_TIMEOUT_S`` seconds (default 300; ``0`` turns it off) it
says why on stderr and ends this process, and the launcher then ends the job.

Armed on import (before ``mpi4py.MPI`` loads), only under a launcher of more than one
process; :func:`disarm` runs once ``MPI_Init`` has returned.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

from ..core import settings

_RANK_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")
_watcher: tuple[int, int] | None = None  # (pid, write end of the pipe)


def timeout_s() -> float:
    """``MPIDIST_INIT_TIMEOUT_S`` (default 300; 0 turns the bound off)."""
    return settings.seconds("MPIDIST_INIT_TIMEOUT_S") or 0.0  # declared with a default: never None


def _launched() -> bool:
    """A launcher started this process as one of several (a lone process never waits in MPI_Init)."""
    if not any(v in os.environ for v in _RANK_VARS):
        return False
    sizes = [os.environ.get(v, "") for v in _SIZE_VARS]
    return not any(s.isdigit() for s in sizes) or any(s.isdigit() and int(s) > 1 for s in sizes)


def _watch(read_end: int, parent: int, limit: float) -> None:
    """The forked watcher: wait for the pipe; past ``limit`` explain, end the parent, exit."""
    ready, _, _ = select.select([read_end], [], [], limit)
    if ready:  # MPI_Init returned (a byte) or the parent is gone (end of file)
        return
    rank = next((os.environ[v] for v in _RANK_VARS if v in os.environ), "?")
    os.write(2, (
        f"mpidist: MPI_Init has not returned after {limit:g} s on {os.uname().nodename} "
        f"(launcher rank {rank}, pid {parent}). MPI_Init waits for every process of the job: one "
        "has not started MPI. Look for its error (an ImportError, or a missing python or "
        "virtualenv on its node) or for a node the launcher could not start. Ending this "
        "process (MPIDIST_INIT_TIMEOUT_S sets the bound).\n").encode())
    os.kill(parent, signal.SIGTERM)
    time.sleep(2.0)
    try:
        os.kill(parent, signal.SIGKILL)
    except ProcessLookupError:
        pass


def arm() -> None:
    """Fork the watcher, unless MPI is already loaded, no launcher started us, or it is off."""
    global _watcher
    limit = timeout_s()
    if (_watcher is not None or limit <= 0 or "mpi4py.MPI" in sys.modules or not _launched()
            or not hasattr(os, "fork")):
        return
    read_end, write_end = os.pipe()
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return
    if pid == 0:  # the watcher: no cleanup handlers, no buffered output of the parent's
        try:
            os.close(write_end)
            _watch(read_end, parent, limit)
        finally:
            os._exit(0)
    os.close(read_end)
    _watcher = (pid, write_end)


def disarm() -> None:
    """``MPI_Init`` has returned: release the watcher and reap it."""
    global _watcher
    if _watcher is None:
        return
    pid, write_end = _watcher
    _watcher = None
    try:
        os.write(write_end, b"1")
    finally:
        os.close(write_end)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


arm()
