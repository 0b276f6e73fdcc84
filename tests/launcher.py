"""Start real ``mpiexec`` jobs from a test, always under a timeout."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import shm

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
#: Prefixes of the variables a launcher sets; a plain ``python`` must start without them.
LAUNCHER_VARS = ("PMI_", "PMIX_", "HYDI_", "HYDRA_", "MPI_LOCAL", "OMPI_", "PRTE_", "SLURM_",
                 "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


def mpiexec_path() -> str:
    """The ``mpiexec`` that belongs to this Python's MPI (the venv's wheel first)."""
    local = BIN / "mpiexec"
    if local.exists():
        return str(local)
    found = shutil.which("mpiexec")
    if not found:
        raise RuntimeError("no mpiexec found next to this Python or on PATH")
    return found


def run_mpi(n: int, args: list[str], timeout: float = 120, env: dict | None = None,
            mpiexec_args: list[str] | None = None, cwd: Path | str = ROOT
            ) -> subprocess.CompletedProcess:
    """``mpiexec -n n python <args>``; output captured; killed after ``timeout`` seconds."""
    full_env = dict(os.environ)
    full_env.pop("PMI_RANK", None)
    full_env.update(env or {})
    if "PYTHONUNBUFFERED" not in (env or {}):
        # unbuffered, print() writes its pieces separately and ranks' lines interleave
        # mid-line ("SUMSUM 3"); buffered, each flush carries whole lines
        full_env["PYTHONUNBUFFERED"] = ""
    cmd = [mpiexec_path(), *(mpiexec_args or []), "-n", str(n), sys.executable, *args]
    return _run(cmd, timeout, full_env, cwd)


def _run(cmd: list[str], timeout: float, env: dict, cwd: Path | str) -> subprocess.CompletedProcess:
    """``subprocess.run`` that, on timeout, kills the launcher *and every rank it started*.

    Killing only ``mpiexec`` can leave ranks that hold the output pipes open, and the
    wait for them never ends. The shared-memory segments of ranks the job killed are
    removed afterwards (:mod:`shm`).
    """
    with shm.swept():
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              cwd=str(cwd), start_new_session=True) as proc:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
                raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_python(args: list[str], timeout: float = 120, env: dict | None = None
               ) -> subprocess.CompletedProcess:
    """A plain ``python <args>`` (an MPI singleton), captured, under ``timeout``."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return _run([sys.executable, *args], timeout, full_env, ROOT)
