"""GPU buffers: detection, the CUDA-awareness query, per-library copies and host staging, and
whether a device buffer can occur here at all.

:func:`mpidist.core.buffers.as_buffer` asks :func:`inspect` whether an argument lives on a GPU and
then :func:`to_mpi` for the array MPI should see (the device pointer on a CUDA-aware MPI, else
a staged host copy). No GPU library is imported: a buffer is handled by the library it came
from (torch, CuPy), or by ``libcudart`` through ctypes for anything else (Numba, JAX, ...).
The producing stream is synchronised before MPI or a copy touches the memory (mpi4py leaves
that to the caller).

Imports: :mod:`mpidist.core`'s errors and settings only (the core's buffers import this package).
"""

from __future__ import annotations

from ..core import settings
from .aware import ENV_CUDA_AWARE, cuda_aware, query_cuda_support
from .copy import LIBRARIES, Library, cudart, library, synchronize
from .detect import DL_CUDA, DL_CUDA_MANAGED, DL_ROCM, Device, DeviceView, inspect
from .present import absent, device_libraries
from .staging import POOL, Staged, StagingPool, choose_path, completion, release, through_host, to_mpi

__all__ = [
    "DL_CUDA", "DL_CUDA_MANAGED", "DL_ROCM", "ENV_CUDA_AWARE", "LIBRARIES", "POOL", "Device", "DeviceView",
    "Library", "Staged", "StagingPool", "absent", "choose_path", "completion", "cuda_aware", "cudart",
    "describe", "device_libraries", "inspect", "library", "query_cuda_support", "release", "synchronize",
    "through_host", "to_mpi",
]


def describe() -> str:
    """One line on the GPU path in use, for ``python -m mpidist info``."""
    aware = cuda_aware()
    src = ENV_CUDA_AWARE if settings.is_set(ENV_CUDA_AWARE) else "MPIX_Query_cuda_support"
    why = absent()
    if why is not None:
        return f"CUDA-aware MPI: {aware} ({src}); {why}: every buffer is host memory"
    if aware == "yes":
        how = "device buffers go to MPI directly (fp16/bf16 reductions and list arguments staged)"
    else:
        how = "device buffers are staged through a reused pinned host pool"
    return f"CUDA-aware MPI: {aware} ({src}); {how}; pool: {POOL.describe()}"
