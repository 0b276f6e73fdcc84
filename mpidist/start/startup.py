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

Also before ``MPI_Init``: :func:`check_dev_shm`, one line on stderr when ``/dev/shm`` has too
little room for the MPI library's shared-memory segment (``MPI_Init`` then dies of ``SIGBUS``
with no message of its own).
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


#: Free ``/dev/shm`` that MPICH's ``MPI_Init`` needs, per rank of the node and once more for the
#: node: measured with MPICH 5 (ch4) at 2 to 4 ranks, it dies of SIGBUS with n MiB free and runs
#: with n + 1 MiB (docs/troubleshooting.md).
SHM_PER_RANK = SHM_PER_NODE = 1 << 20
_LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_LOCAL_SIZE")


def local_size() -> int:
    """How many ranks the launcher started on this node, from its variables (1 where none says).

    Before ``MPI_Init`` MPI cannot be asked: Hydra's ``MPI_LOCALNRANKS``, Open MPI's
    ``OMPI_COMM_WORLD_LOCAL_SIZE``, PMIx's ``PMIX_LOCAL_SIZE``, else the largest count in
    Slurm's ``SLURM_STEP_TASKS_PER_NODE``/``SLURM_TASKS_PER_NODE`` (``"4(x2),3"``).
    """
    for var in _LOCAL_SIZE_VARS:
        text = os.environ.get(var, "").strip()
        if text.isdigit() and int(text) > 0:
            return int(text)
    for var in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        counts = [part.split("(")[0] for part in os.environ.get(var, "").split(",")]
        if counts and all(c.isdigit() for c in counts):
            return max(int(c) for c in counts)
    return 1


def check_dev_shm(path: str = "/dev/shm") -> str | None:
    """Warn, on stderr, when ``path`` has less room than ``MPI_Init`` needs; the line, or ``None``.

    MPICH maps its shared-memory segment in ``/dev/shm`` (``ftruncate``, then it writes to it):
    a tmpfs without room for it kills the rank with ``SIGBUS`` ("Bus error (signal 7)") before
    any message, with or without mpidist. So this runs before ``MPI_Init``, reads
    ``os.statvfs(path)`` (nothing where ``path`` does not exist) and below
    :data:`SHM_PER_RANK` per rank of the node (:func:`local_size`) plus :data:`SHM_PER_NODE`
    prints one line naming the free space, the need and the fixes. A warning, not an error: the
    floor is measured, not MPI's contract (another MPI, version or segment setting needs more
    or less, and without the launcher's variables the node's rank count is a guess), and a
    job that would have started must not be refused.
    """
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    free, ranks = st.f_bavail * st.f_frsize, local_size()
    need = ranks * SHM_PER_RANK + SHM_PER_NODE
    if free >= need:
        return None
    line = (f"mpidist: {path} has {free / 2**20:.1f} MiB free, but the MPI library maps its shared memory "
            f"there in MPI_Init: MPICH needs about {need / 2**20:.0f} MiB for {ranks} rank(s) on this node "
            f"and dies of SIGBUS (\"Bus error\") without it. Free space in {path}, give the container a "
            "larger one (docker run --shm-size=1g), or shrink MPICH's segment "
            "(MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_NUM_CELLS=4; Open MPI: --mca btl_sm_backing_directory /tmp)\n")
    os.write(2, line.encode())
    return line


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


if "mpi4py.MPI" not in sys.modules:  # before MPI_Init, which the next import of mpidist runs
    check_dev_shm()
arm()
