"""Can a device buffer occur here at all? For ``python -m mpidist info``'s GPU line.

Answered without importing a GPU library or starting a GPU runtime: from the files the
libraries install and the device nodes the kernel drivers make.
"""

from __future__ import annotations

import glob
import importlib.util
import os

from .copy import cudart

#: The device nodes of a GPU driver: NVIDIA's, AMD's (ROCm) and WSL2's.
DEVICE_NODES = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg")


def device_libraries() -> list[str]:
    """The libraries installed here that can hand mpidist a device buffer: torch built for CUDA
    or ROCm (``libc10_cuda``/``libc10_hip`` in its ``lib/``), CuPy, and ``libcudart`` for the
    rest (Numba, JAX, ...)."""
    found = []
    spec = importlib.util.find_spec("torch")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for name, what in (("libc10_cuda.so", "torch (CUDA)"), ("libc10_hip.so", "torch (ROCm)")):
            if os.path.exists(os.path.join(folder, "lib", name)):
                found.append(what)
    if importlib.util.find_spec("cupy") is not None:
        found.append("CuPy")
    try:
        cudart()
        found.append("libcudart")
    except RuntimeError:
        pass
    return found


def absent() -> str | None:
    """Why no device buffer can occur in this process, or ``None`` where one can."""
    libraries = device_libraries()
    if not libraries:
        return ("no GPU library here makes device buffers (no torch built for CUDA or ROCm, no CuPy, "
                "no libcudart)")
    if not any(glob.glob(pattern) for pattern in DEVICE_NODES):
        return f"no GPU here ({', '.join(libraries)} installed, but no /dev/nvidia*, /dev/kfd or /dev/dxg)"
    return None
