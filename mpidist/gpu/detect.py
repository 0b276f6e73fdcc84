"""Device buffers: recognise a GPU array and read its pointer, size, dtype and stream.

Checks ``torch`` CUDA tensors, ``__cuda_array_interface__`` and ``__dlpack__`` /
``__dlpack_device__``, without importing any GPU library: a library is only used when the
buffer is one of its objects. Nothing here touches device memory.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, NamedTuple

import numpy as np

from ..core import errors

# DLPack device types (dlpack.h DLDeviceType)
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_ROCM, DL_CUDA_MANAGED = 1, 2, 3, 10, 13
_DL_DEVICE = (DL_CUDA, DL_CUDA_MANAGED, DL_ROCM)
# DLPack type codes -> numpy kind letters (DLDataTypeCode)
_DL_CODES = {0: "i", 1: "u", 2: "f", 4: "bfloat", 5: "c", 6: "b"}


class Device(NamedTuple):
    """What :func:`inspect` learned about a device buffer, without touching its memory."""

    obj: Any  # the caller's object
    lib: str  # producing library: top-level module of its type ("torch", "cupy", ...)
    ptr: int
    nbytes: int
    shape: tuple
    dtype: str  # numpy dtype string ("float32", "bfloat16", ...)
    contiguous: bool
    device_id: int
    stream: int | None  # stream handle to synchronise (1 legacy default), None: use lib's current
    keep: Any = None  # a DLPack capsule that must outlive the pointer's use


class DeviceView(np.ndarray):
    """A numpy array over *device* memory: MPI may use it, host code must not read it."""

    gpu_device: Device

    def __array_finalize__(self, obj: Any) -> None:
        self.gpu_device = getattr(obj, "gpu_device", None)


def _lib_of(x: Any) -> str:
    return type(x).__module__.partition(".")[0]


def _torch_device(t: Any) -> Device | None:
    if t.device.type != "cuda":
        return None
    name = str(t.dtype).rpartition(".")[2]
    n = t.numel() * t.element_size()
    return Device(t, "torch", t.data_ptr(), n, tuple(t.shape), name, t.is_contiguous(),
                  t.device.index or 0, None)


def _c_contiguous(shape: tuple, strides: tuple | None, itemsize: int) -> bool:
    if strides is None:
        return True
    expect = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim > 1 and stride != expect:
            return False
        expect *= dim
    return True


def _from_cai(x: Any, cai: dict) -> Device:
    ptr = int(cai["data"][0] or 0)
    shape = tuple(int(s) for s in cai["shape"])
    dt = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    strides = tuple(int(s) for s in strides) if strides is not None else None
    stream = cai.get("stream")
    return Device(x, _lib_of(x), ptr, int(np.prod(shape, dtype=np.int64)) * dt.itemsize, shape,
                  dt.name, _c_contiguous(shape, strides, dt.itemsize), 0,
                  int(stream) if stream is not None else None)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(x: Any, dev_type: int, dev_id: int, call: str, arg: str) -> Device:
    try:  # stream=1: the producer orders its work before the legacy default stream
        capsule = x.__dlpack__(stream=1)
    except TypeError:
        capsule = x.__dlpack__()
    # the capsule is not consumed: its destructor still releases the producer's tensor
    t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    kind = _DL_CODES.get(t.dtype.code)
    if kind is None or t.dtype.lanes != 1:
        raise errors.type_error(call, f"argument '{arg}' has an unsupported DLPack dtype code "
                                      f"{t.dtype.code} ({t.dtype.bits} bits)")
    name = "bfloat16" if kind == "bfloat" else np.dtype(f"{kind}{t.dtype.bits // 8}").name
    itemsize = t.dtype.bits // 8
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = None if not t.strides else tuple(t.strides[i] * itemsize for i in range(t.ndim))
    ptr = (t.data or 0) + t.byte_offset
    return Device(x, _lib_of(x), ptr, int(np.prod(shape, dtype=np.int64)) * itemsize, shape, name,
                  _c_contiguous(shape, strides, itemsize), dev_id, 1, capsule)


def inspect(x: Any, call: str = "inspect", arg: str = "tensor") -> Device | None:
    """A :class:`Device` when ``x`` is a GPU buffer, else ``None`` (host memory or unknown).

    Checks, in order: torch CUDA tensors (by ``Tensor.device``; torch's own array interface
    refuses bfloat16), ``__cuda_array_interface__``, then ``__dlpack_device__``. Nothing is
    imported: a library is only used when ``x`` is one of its objects.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _torch_device(x)
    tp = type(x)
    if getattr(tp, "__cuda_array_interface__", None) is not None:
        return _from_cai(x, x.__cuda_array_interface__)
    if hasattr(tp, "__dlpack_device__") and hasattr(tp, "__dlpack__"):
        dev_type, dev_id = (int(v) for v in x.__dlpack_device__())
        if dev_type in _DL_DEVICE:
            return _from_dlpack(x, dev_type, dev_id, call, arg)
    return None

