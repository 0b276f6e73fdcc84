"""GPU buffers: device detection, the CUDA-awareness query, stream sync and host staging.

:func:`mpidist.buffers.as_buffer` asks :func:`inspect` whether an argument lives on a GPU
(``__cuda_array_interface__``, ``__dlpack__``/``__dlpack_device__`` or a torch CUDA tensor)
and then :func:`to_mpi` for the array MPI should see. Two paths:

* **direct** -- MPI is CUDA-aware (:func:`cuda_aware` is ``"yes"``): MPI gets the device
  pointer itself, wrapped in a :class:`DeviceView` (a numpy array over device memory that
  host code must never read; only its shape, size and address are used).
* **staged** -- otherwise, or when the call needs host arithmetic on the payload (fp16/bf16
  reductions, list arguments that mpidist reshuffles on the host): the data is copied into a
  buffer of the one pinned host :data:`POOL`, MPI works on that, and :func:`complete` copies
  results back and returns the buffer to the pool once the call finishes.

No GPU library is imported here: a buffer is handled by the library it came from (torch,
CuPy), or by ``libcudart`` through ctypes for anything else (Numba, JAX, ...). The producing
stream is synchronised before MPI or a copy touches the memory (mpi4py leaves that to the
caller).
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import os
import sys
import warnings
from typing import Any, Callable, NamedTuple

import numpy as np
from mpi4py import MPI

from . import errors

# DLPack device types (dlpack.h DLDeviceType)
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_ROCM, DL_CUDA_MANAGED = 1, 2, 3, 10, 13
_DL_DEVICE = (DL_CUDA, DL_CUDA_MANAGED, DL_ROCM)
# DLPack type codes -> numpy kind letters (DLDataTypeCode)
_DL_CODES = {0: "i", 1: "u", 2: "f", 4: "bfloat", 5: "c", 6: "b"}

#: Environment variable that overrides the CUDA-awareness query (``0`` or ``1``).
ENV_CUDA_AWARE = "MPIDIST_CUDA_AWARE"


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


# ---------------------------------------------------------------- detection

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


# ---------------------------------------------------------------- CUDA-awareness

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
    env = os.environ.get(ENV_CUDA_AWARE, "").strip()
    if env in ("0", "1"):
        return "yes" if env == "1" else "no"
    if env:
        raise errors.value_error("cuda_aware", f"{ENV_CUDA_AWARE}={env!r}; use 0 or 1")
    if _aware is None:
        if os.environ.get("MPIR_CVAR_ENABLE_GPU", "").strip() in ("0", "false", "no"):
            _aware = "no"
        else:
            answer = query_cuda_support()
            _aware = "unknown" if answer is None else ("yes" if answer else "no")
    return _aware


def describe() -> str:
    """One line on the GPU path in use, for ``python -m mpidist info``."""
    aware = cuda_aware()
    src = "MPIDIST_CUDA_AWARE" if os.environ.get(ENV_CUDA_AWARE) else "MPIX_Query_cuda_support"
    if aware == "yes":
        how = "device buffers go to MPI directly (fp16/bf16 reductions and list arguments staged)"
    else:
        how = "device buffers are staged through a reused pinned host pool"
    return f"CUDA-aware MPI: {aware} ({src}); {how}; pool: {POOL.describe()}"


# ---------------------------------------------------------------- per-library operations

class Backend(NamedTuple):
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


def _host_ptr(host: np.ndarray) -> int:
    return host.__array_interface__["data"][0]


def _by_pointer(copy: Callable[[int, int, int], None], sync: Callable[[Device], None],
                pinned: Callable[[int], np.ndarray] | None) -> Backend:
    return Backend(sync, lambda dev, host: copy(_host_ptr(host), dev.ptr, dev.nbytes),
                   lambda host, dev: copy(dev.ptr, _host_ptr(host), dev.nbytes), pinned)


BACKENDS: dict[str, Backend] = {
    "torch": Backend(_torch_sync, _torch_to_host, _torch_to_device, _torch_pinned),
    "cupy": _by_pointer(_cupy_copy, _cupy_sync, _cupy_pinned),
}
#: Anything else (Numba, JAX, ...) goes through libcudart.
DEFAULT_BACKEND = _by_pointer(_cudart_copy, _cudart_sync, None)


def backend(dev: Device) -> Backend:
    return BACKENDS.get(dev.lib, DEFAULT_BACKEND)


def synchronize(dev: Device) -> None:
    """Wait for the work that produces ``dev`` (its stream, or its library's current stream)."""
    backend(dev).sync(dev)


# ---------------------------------------------------------------- the staging pool

class StagingPool:
    """Host buffers reused across calls, in power-of-two size classes (one pool per process).

    Pinned through the producing library when it can allocate page-locked memory; plain
    numpy memory otherwise.
    """

    MIN = 4096

    def __init__(self) -> None:
        self._free: dict[int, list[np.ndarray]] = collections.defaultdict(list)
        self._whole: dict[int, np.ndarray] = {}  # start address -> the allocated buffer
        self.allocations = 0
        self.pinned = 0
        self.bytes = 0

    def acquire(self, nbytes: int, alloc: Callable[[int], np.ndarray] | None = None) -> np.ndarray:
        """A uint8 host array of exactly ``nbytes``, carved from a reused buffer."""
        size = max(self.MIN, 1 << max(0, nbytes - 1).bit_length())
        free = self._free[size]
        if free:
            buf = free.pop()
        else:
            buf = None
            if alloc is not None:
                try:
                    buf = alloc(size)
                    self.pinned += 1
                except Exception:  # no pinned memory here (e.g. a CPU-only torch): plain memory
                    buf = None
            if buf is None:
                buf = np.empty(size, np.uint8)
            self.allocations += 1
            self.bytes += size
            self._whole[_host_ptr(buf)] = buf
        return buf[:nbytes]

    def release(self, buf: np.ndarray) -> None:
        """Return a buffer from :meth:`acquire` to the pool."""
        whole = self._whole[_host_ptr(buf)]
        self._free[whole.size].append(whole)

    def describe(self) -> str:
        held = sum(len(v) for v in self._free.values())
        return (f"{self.allocations} buffers ({self.bytes / 2**20:.1f} MiB, {self.pinned} pinned), "
                f"{held} free")


#: The process-wide staging pool.
POOL = StagingPool()


# ---------------------------------------------------------------- path choice and completion

class Staged(NamedTuple):
    device: Device
    host: np.ndarray  # the pool buffer (uint8)
    writable: bool


_pending: list[Staged] = []
_direct: collections.deque = collections.deque(maxlen=8)  # (call, lo, hi) of direct buffers
_warned = False

# Calls whose bodies never read or write the payload on the host, so device pointers can go
# to a CUDA-aware MPI as they are (reductions also divide/scale: ops does that via staging).
DIRECT_CALLS = frozenset({
    "broadcast", "all_reduce", "reduce", "reduce_scatter_tensor", "all_gather_into_tensor",
    "all_to_all_single", "send", "recv", "isend", "irecv",
})
_REDUCING = frozenset({"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"})


def choose_path(call: str, kind: str, aware: str | None = None) -> str:
    """``"direct"`` or ``"staged"`` for a device buffer of dtype kind ``kind`` in ``call``."""
    if (aware or cuda_aware()) != "yes" or call not in DIRECT_CALLS:
        return "staged"
    if call in _REDUCING and kind in ("f16", "bf16"):
        return "staged"  # mpidist reduces 16-bit words itself, on the host
    return "direct"


def _warn_staging(call: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"mpidist: {call}: MPI is not CUDA-aware (cuda_aware()={cuda_aware()!r}); device "
                      "buffers are staged through host memory (set MPIDIST_CUDA_AWARE=1 to override)",
                      RuntimeWarning, stacklevel=4)


def stage(dev: Device, writable: bool) -> np.ndarray:
    """Copy ``dev`` into a pool buffer (after syncing its stream); registered for :func:`complete`."""
    be = backend(dev)
    host = POOL.acquire(dev.nbytes, be.alloc_pinned)
    if dev.nbytes:
        be.sync(dev)
        be.to_host(dev, host)
    _pending.append(Staged(dev, host, writable))
    return host


def to_mpi(dev: Device, raw: np.dtype, kind: str, call: str, writable: bool) -> np.ndarray:
    """The array MPI gets for device buffer ``dev``: a :class:`DeviceView` or a staged host copy."""
    path = choose_path(call, kind)
    lo, hi = dev.ptr, dev.ptr + dev.nbytes
    if path == "direct" and any(c == call and lo < end and start < hi for c, start, end in _direct):
        path = "staged"  # overlaps another argument of this call: give MPI a separate copy
    if path == "staged":
        if cuda_aware() != "yes":
            _warn_staging(call)
        return stage(dev, writable).view(raw).reshape(dev.shape)
    if dev.nbytes == 0:
        return np.empty(dev.shape, raw)
    synchronize(dev)
    _direct.append((call, lo, hi))
    buf = MPI.buffer.fromaddress(dev.ptr, dev.nbytes, readonly=not writable)
    view = np.frombuffer(buf, raw).reshape(dev.shape).view(DeviceView)
    view.gpu_device = dev
    return view


def in_flight() -> bool:
    """Whether the call being assembled holds device buffers (``complete`` has work to do)."""
    return bool(_pending or _direct)


def complete(post: Callable[[], None] | None, output: Any) -> Callable[[], None] | None:
    """``post`` followed by the copy-back of staged buffers in ``output`` and their release.

    Takes every buffer staged since the last call; the ones that belong to ``output`` (an
    array or a list of arrays) and were writable are copied back to the device, all are
    returned to :data:`POOL`. Returns ``post`` unchanged when nothing was staged.
    """
    _direct.clear()
    if not _pending:
        return post
    staged = list(_pending)
    _pending.clear()
    outs = output if isinstance(output, (list, tuple)) else (output,)
    ids = {id(o) for o in outs if o is not None}
    last: dict[int, Staged] = {}
    for s in staged:
        if s.writable and id(s.device.obj) in ids:
            last[id(s.device.obj)] = s  # the newest staging of an object is this call's

    def finish() -> None:
        try:
            if post is not None:
                post()
            for s in last.values():
                if s.device.nbytes:
                    backend(s.device).to_device(s.host, s.device)
        finally:
            for s in staged:
                POOL.release(s.host)
    return finish


def through_host(view: DeviceView, fn: Callable[[np.ndarray], Any], write_back: bool) -> Any:
    """Run host arithmetic ``fn`` on a pool copy of device memory ``view``.

    With ``write_back`` the (modified) copy goes back to the device and ``None`` is
    returned; otherwise ``fn``'s result, which must not be the pool copy itself.
    """
    dev = view.gpu_device
    be = backend(dev)
    host = POOL.acquire(dev.nbytes, be.alloc_pinned)
    try:
        be.sync(dev)
        be.to_host(dev, host)
        result = fn(host.view(view.dtype).reshape(view.shape))
        if write_back:
            be.to_device(host, dev)
            return None
        return result
    finally:
        POOL.release(host)
