"""Start real ``mpiexec`` jobs from a test, always under a timeout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


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
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    cmd = [mpiexec_path(), *(mpiexec_args or []), "-n", str(n), sys.executable, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=str(cwd))


def run_python(args: list[str], timeout: float = 120, env: dict | None = None
               ) -> subprocess.CompletedProcess:
    """A plain ``python <args>`` (an MPI singleton), captured, under ``timeout``."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=str(ROOT))
