"""A job whose ``/dev/shm`` is too full before it starts: every rank says so before ``MPI_Init``.

MPICH's ``MPI_Init`` dies of SIGBUS when ``/dev/shm`` cannot hold its shared-memory segment;
:func:`mpidist.start.startup.check_dev_shm` prints one line first. Serial tests; each starts its
own ``mpiexec`` inside a private mount namespace (``unshare -m``) whose ``/dev/shm`` is a small
tmpfs, under a timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import shm
from launcher import _run, mpiexec_path

RANKS = 2
WARNING = "mpidist: /dev/shm has"
FILL = ("import os, sys; st = os.statvfs('/dev/shm'); f = open('/dev/shm/filler', 'wb'); "
        "os.posix_fallocate(f.fileno(), 0, max(st.f_bavail * st.f_frsize - int(sys.argv[1]), 4096))")


def _job(tmp_path, leave: int) -> subprocess.CompletedProcess:
    """``import mpidist`` on RANKS ranks, with ``leave`` bytes free in a 16 MiB /dev/shm."""
    reason = shm.private_mount_reason()
    if reason:
        print(reason)
        pytest.skip(reason)
    script = ('mount -t tmpfs -o size=16m tmpfs /dev/shm && "$0" -c "$FILL" "$LEAVE" && '
              'exec timeout -k 10 60 "$@"')
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, sys.executable,
           mpiexec_path(), "-n", str(RANKS), sys.executable, "-c", "import mpidist; print('STARTED')"]
    env = dict(os.environ, PYTHONUNBUFFERED="", FILL=FILL, LEAVE=str(leave))
    env.pop("PMI_RANK", None)
    proc = _run(cmd, 90, env, tmp_path)
    print(f"rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    assert proc.returncode not in (124, 137), "the job hung"
    return proc


def test_too_little_room_is_named_before_mpi_init(tmp_path):
    proc = _job(tmp_path, 1 << 20)  # MPICH dies of SIGBUS here; the line comes first
    lines = [line for line in proc.stderr.splitlines() if line.startswith(WARNING)]
    assert len(lines) == RANKS, proc.stderr[-3000:]
    assert "1.0 MiB free" in lines[0] and f"for {RANKS} rank(s)" in lines[0], lines[0]
    assert "--shm-size" in lines[0] and "MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_NUM_CELLS" in lines[0], lines[0]


def test_enough_room_says_nothing(tmp_path):
    proc = _job(tmp_path, 8 << 20)
    assert proc.returncode == 0 and proc.stdout.count("STARTED") == RANKS, proc.stderr[-3000:]
    assert WARNING not in proc.stderr, proc.stderr[-3000:]
