"""Per-library device operations: synchronise a buffer's stream, copy to and from host memory.

torch and CuPy buffers use their own library; anything else (Numba, JAX, ...) goes through
``libcudart`` by pointer, loaded with ctypes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Callable, NamedTuple

import numpy as np

from ..core import errors
from .detect import Device


class Library(NamedTuple):
    """How to synchronise and copy the buffers of one library (``lib`` of :class:`Device`)."""

    sync: Callable[[Device], None]
    to_host: Callable[[Device, np.ndarray], None]  # device bytes -> uint8 host array
    to_device: Callable[[np.ndarray, Device], None]  # uint8 host array -> device bytes
    alloc_pinned: Callable[[int], np.ndarray] | None  # page-locked uint8 host array


def _torch_bytes(dev: Device) -> Any:
    import torch

    return dev.obj.detach().reshape(-1).view(torch.uint8)


def _torch_sync(dev: Device) -> None:
    import torch

    torch.cuda.current_stream(dev.obj.device).synchronize()


def _torch_to_host(dev: Device, host: np.ndarray) -> None:
    import torch

    torch.from_numpy(host).copy_(_torch_bytes(dev))


def _torch_to_device(host: np.ndarray, dev: Device) -> None:
    import torch

    _torch_bytes(dev).copy_(torch.from_numpy(host))


def _torch_pinned(nbytes: int) -> np.ndarray:
    import torch

    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()


def _cupy_sync(dev: Device) -> None:
    import cupy

    if dev.stream is None:
        return
    if dev.stream == 1:
        cupy.cuda.Stream.null.synchronize()
    else:
        cupy.cuda.ExternalStream(dev.stream).synchronize()


def _cupy_copy(dst: int, src: int, n: int) -> None:
    import cupy

    cupy.cuda.runtime.memcpy(dst, src, n, cupy.cuda.runtime.memcpyDefault)


def _cupy_pinned(nbytes: int) -> np.ndarray:
    import cupy

    return np.frombuffer(cupy.cuda.alloc_pinned_memory(nbytes), np.uint8, nbytes)


_cudart: Any = None


def cudart() -> Any:
    """``libcudart`` through ctypes: the one already loaded, else the system's."""
    global _cudart
    if _cudart is None:
        paths = []
        try:
            with open("/proc/self/maps") as maps:
                paths = sorted({ln.split()[-1] for ln in maps if "libcudart" in ln})
        except OSError:
            pass
        found = ctypes.util.find_library("cudart")
        for path in [*paths, *([found] if found else [])]:
            try:
                _cudart = ctypes.CDLL(path)
                break
            except OSError:
                continue
        else:
            raise errors.runtime_error("gpu", "a device buffer needs libcudart, which is not found")
    return _cudart


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise errors.runtime_error("gpu", f"{what} failed with CUDA error {rc}")


def _cudart_sync(dev: Device) -> None:
    if dev.stream is not None:
        handle = 0 if dev.stream == 1 else dev.stream  # 2 is cudaStreamPerThread as is
        _check(cudart().cudaStreamSynchronize(ctypes.c_void_p(handle)), "cudaStreamSynchronize")


def _cudart_copy(dst: int, src: int, n: int) -> None:
    lib = cudart()
    _check(lib.cudaMemcpy(ctypes.c_void_p(dst), ctypes.c_void_p(src), ctypes.c_size_t(n), 4),
           "cudaMemcpy")  # 4: cudaMemcpyDefault, direction from unified addressing


def host_address(host: np.ndarray) -> int:
    return host.__array_interface__["data"][0]


def _by_pointer(copy: Callable[[int, int, int], None], sync: Callable[[Device], None],
                pinned: Callable[[int], np.ndarray] | None) -> Library:
    return Library(sync, lambda dev, host: copy(host_address(host), dev.ptr, dev.nbytes),
                   lambda host, dev: copy(dev.ptr, host_address(host), dev.nbytes), pinned)


LIBRARIES: dict[str, Library] = {
    "torch": Library(_torch_sync, _torch_to_host, _torch_to_device, _torch_pinned),
    "cupy": _by_pointer(_cupy_copy, _cupy_sync, _cupy_pinned),
}
#: Anything else (Numba, JAX, ...) goes through libcudart.
BY_POINTER = _by_pointer(_cudart_copy, _cudart_sync, None)


def library(dev: Device) -> Library:
    """The operations for ``dev``'s library (``libcudart`` by pointer for unknown ones)."""
    return LIBRARIES.get(dev.lib, BY_POINTER)


def synchronize(dev: Device) -> None:
    """Wait for the work that produces ``dev`` (its stream, or its library's current stream)."""
    library(dev).sync(dev)

