"""Jobs started for ULFM (Open MPI's ``mpiexec --with-ft ulfm``), for the survival tests.

The tests kill real ranks (``os._exit``, SIGKILL); each job runs under a timeout, and the
launcher's process group is killed with it, so nothing is left behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from launcher import mpiexec_path, run_mpi

from mpidist.core.faults import OPENMPI_FLAGS, SHARED_DETECTOR, STARTS, crashed_in_init, detector_flags

#: Open MPI refuses root and more ranks than cores without these.
ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
       "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe", "OMPI_MCA_mpi_yield_when_idle": "1",
       "MPIDIST_ABORT_ON_ERROR": "1"}
#: ``mpiexec`` flags of the suite's ULFM jobs: the tolerant detector, since the suite runs 3-4
#: ranks and torch on 2 cores.
FLAGS = f"{OPENMPI_FLAGS} {detector_flags(*SHARED_DETECTOR)}".split()


def unavailable() -> str | None:
    """Why this Python's MPI cannot start a job that survives a dead rank (``None``: it can)."""
    try:
        out = subprocess.run([str(Path(mpiexec_path()).parent / "ompi_info"), "--parsable"],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return f"no Open MPI next to this Python ({exc}); the survival tests run in the suite's Open MPI run"
    if "ftmpi" not in out and "FT MPI support:yes" not in out.replace(" ", ""):
        return "this Open MPI has no ULFM support (ompi_info: FT MPI support: no)"
    return None


REASON = unavailable()
needs_ulfm = pytest.mark.skipif(REASON is not None, reason=str(REASON))
if REASON is not None and os.environ.get("MPIDIST_REQUIRE_ULFM") == "1":
    raise RuntimeError(f"MPIDIST_REQUIRE_ULFM=1 but {REASON}")

HEAD = """
import os, signal, sys, time, warnings
import numpy as np
import mpidist as dist

def say(*words):
    sys.stdout.write(" ".join(map(str, words)) + "\\n")
    sys.stdout.flush()

def die(how="exit"):
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(1)
"""


def job(tmp_path: Path, n: int, body: str, timeout: float = 120, args: list[str] | None = None,
        script: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``mpiexec --with-ft ulfm ... -n n python`` of ``body`` (after :data:`HEAD`) or of ``script``,
    with :data:`ENV` and ``env`` added to the environment."""
    if script is None:
        path = tmp_path / "job.py"
        path.write_text(HEAD + textwrap.dedent(body))
        script = str(path)
    env = {**ENV, **(env or {})}
    r = run_mpi(n, [script, *(args or [])], timeout=timeout, env=env, mpiexec_args=FLAGS)
    for start in range(2, STARTS + 1):
        if not crashed_in_init(r.stdout, r.stderr):
            break
        # Open MPI's start-up race (mpidist.core.faults.STARTS): no line of the test had run
        print(f"a rank segfaulted inside Open MPI's MPI_Init before the job's own code ran; "
              f"start {start} of {STARTS}:\n{r.stderr[-2000:]}", file=sys.stderr)
        r = run_mpi(n, [script, *(args or [])], timeout=timeout, env=env, mpiexec_args=FLAGS)
    return r


def lines(out: str, word: str) -> list[list[str]]:
    """The words of every output line that starts with ``word``."""
    return [ln.split() for ln in out.splitlines() if ln.startswith(word + " ")]


def python() -> str:
    return sys.executable
