"""Can MPI read and write device memory? The CUDA-awareness query and its override."""

from __future__ import annotations

import ctypes
import os

from mpi4py import MPI

from ..core import errors, settings

#: Environment variable that overrides the CUDA-awareness query (``0`` or ``1``).
ENV_CUDA_AWARE = "MPIDIST_CUDA_AWARE"

_aware: str | None = None


def _mpi_libraries() -> list[str]:
    paths = [MPI.__file__]  # the extension resolves MPI's symbols through its own dependencies
    try:
        with open("/proc/self/maps") as maps:
            paths += sorted({ln.split()[-1] for ln in maps if "libmpi" in ln and ".so" in ln})
    except OSError:
        pass
    return paths


def query_cuda_support() -> int | None:
    """``MPIX_Query_cuda_support()`` of the loaded MPI library, or ``None`` where it has none."""
    for path in _mpi_libraries():
        try:
            fn = ctypes.CDLL(path).MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        fn.restype, fn.argtypes = ctypes.c_int, []
        return int(fn())
    return None


def cuda_aware() -> str:
    """``"yes"``, ``"no"`` or ``"unknown"``: can MPI read and write device memory?

    ``MPIDIST_CUDA_AWARE=0|1`` decides when set; else ``MPIX_Query_cuda_support`` (MPICH,
    Open MPI) through ctypes, with MPICH's ``MPIR_CVAR_ENABLE_GPU=0`` read as ``"no"``.
    Without an answer mpidist stages, which is always correct.
    """
    global _aware
    try:
        chosen = settings.flag(ENV_CUDA_AWARE)
    except ValueError as exc:
        raise errors.value_error("cuda_aware", str(exc)) from None
    if chosen is not None:
        return "yes" if chosen else "no"
    if _aware is None:
        if os.environ.get("MPIR_CVAR_ENABLE_GPU", "").strip() in ("0", "false", "no"):
            _aware = "no"
        else:
            answer = query_cuda_support()
            _aware = "unknown" if answer is None else ("yes" if answer else "no")
    return _aware

