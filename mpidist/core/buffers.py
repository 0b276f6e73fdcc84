"""Array → MPI buffer conversion: the one place that knows numpy, torch and dtypes.

Every call hands its arrays to :func:`as_buffer` (or :func:`as_buffers` for lists) and
gets back a numpy array that *shares memory* with the caller's object plus a
:class:`DType` that says which MPI datatype moves it and which reduction family it
belongs to. Nothing is copied on the host path: torch CPU tensors become numpy views
(``Tensor.numpy()`` shares storage), bfloat16 becomes a ``uint16`` view of the same
words. A non-contiguous array, or a read-only one where a result must be written, is
refused with :class:`ValueError`; anything that is not an array is a :class:`TypeError`.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI

from .. import gpu
from . import errors


class DType(NamedTuple):
    """How one element type travels through MPI.

    ``name`` is the user-facing name (``"bfloat16"``), ``mpi`` the datatype MPI moves,
    ``kind`` the reduction family (``b`` bool, ``i`` signed, ``u`` unsigned, ``f`` float,
    ``c`` complex, ``f16`` float16, ``bf16`` bfloat16) and ``raw`` the numpy dtype of
    the array that :func:`as_buffer` hands to MPI.
    """

    name: str
    mpi: MPI.Datatype
    kind: str
    raw: np.dtype


def _dtype(np_name: str, mpi: MPI.Datatype, kind: str, raw: str | None = None) -> DType:
    return DType(np_name, mpi, kind, np.dtype(raw or np_name))


# numpy dtype -> DType. float16 moves as raw 16-bit words: MPI's own float16 types
# are an extension (MPIX_C_FLOAT16) missing from Open MPI, and reductions are ours.
_BY_NUMPY: dict[np.dtype, DType] = {
    np.dtype(d.raw if d.kind != "f16" else "float16"): d
    for d in (
        _dtype("bool", MPI.C_BOOL, "b"),
        _dtype("int8", MPI.INT8_T, "i"),
        _dtype("int16", MPI.INT16_T, "i"),
        _dtype("int32", MPI.INT32_T, "i"),
        _dtype("int64", MPI.INT64_T, "i"),
        _dtype("uint8", MPI.UINT8_T, "u"),
        _dtype("uint16", MPI.UINT16_T, "u"),
        _dtype("uint32", MPI.UINT32_T, "u"),
        _dtype("uint64", MPI.UINT64_T, "u"),
        _dtype("float16", MPI.UINT16_T, "f16", "uint16"),
        _dtype("float32", MPI.FLOAT, "f"),
        _dtype("float64", MPI.DOUBLE, "f"),
        _dtype("longdouble", MPI.LONG_DOUBLE, "f"),
        _dtype("complex64", MPI.C_FLOAT_COMPLEX, "c"),
        _dtype("complex128", MPI.C_DOUBLE_COMPLEX, "c"),
        _dtype("clongdouble", MPI.C_LONG_DOUBLE_COMPLEX, "c"),
    )
}
#: The numpy dtypes MPI moves as they are (no view): a contiguous, writable numpy array of one
#: of these is what :func:`as_buffer` returns unchanged, which ``all_reduce`` checks inline.
AS_IS: dict[np.dtype, DType] = {k: d for k, d in _BY_NUMPY.items() if k == d.raw}
BFLOAT16 = _dtype("bfloat16", MPI.UINT16_T, "bf16", "uint16")
FLOAT16 = _BY_NUMPY[np.dtype("float16")]

# torch dtype name (str(torch.float32) minus "torch.") -> numpy dtype of Tensor.numpy()
_TORCH_VIA_NUMPY = {
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
}


def _unsupported(call: str, arg: str, dtype_name: str) -> TypeError:
    supported = ", ".join(sorted({d.name for d in _BY_NUMPY.values()} | {"bfloat16"}))
    return errors.type_error(
        call, f"argument '{arg}' has unsupported dtype {dtype_name}; supported: {supported}"
    )


def _lookup(dtype: np.dtype, call: str, arg: str) -> DType:
    d = _BY_NUMPY.get(dtype)
    if d is not None:
        return d
    if dtype.name == "bfloat16":  # ml_dtypes.bfloat16: same words, no buffer export
        return BFLOAT16
    raise _unsupported(call, arg, str(dtype))


#: torch dtype -> DType for the dtypes whose ``Tensor.numpy()`` view MPI moves as it is (not
#: complex, which may be a lazily conjugated view; not bfloat16): filled when torch is first met
_TORCH_PLAIN: dict[Any, DType] = {}
_STRIDED: Any = None  # torch.strided, once torch is met


def _plain_torch_dtypes(torch: Any) -> dict[Any, DType]:
    global _STRIDED
    if not _TORCH_PLAIN:
        _STRIDED = torch.strided
        _TORCH_PLAIN.update({getattr(torch, name): _BY_NUMPY[np.dtype(name)] for name in _TORCH_VIA_NUMPY
                             if not name.startswith("complex") and hasattr(torch, name)})
    return _TORCH_PLAIN


def _from_torch(t: Any, call: str, arg: str, writable: bool = False) -> tuple[np.ndarray, DType]:
    if t.requires_grad:
        t = t.detach()
    d = _TORCH_PLAIN.get(t.dtype)
    if d is not None and t.layout is _STRIDED:  # the common case: one lookup, then the view
        return t.numpy(), d
    name = str(t.dtype).rpartition(".")[2]
    if name == "bfloat16":
        import torch

        return t.view(torch.int16).numpy().view(np.uint16), BFLOAT16
    if name not in _TORCH_VIA_NUMPY:
        raise _unsupported(call, arg, f"torch.{name}")
    if t.is_conj():
        if writable:  # the result would land in resolve_conj()'s copy and be lost
            raise errors.value_error(
                call, f"argument '{arg}' is a lazily conjugated view and receives the result; "
                "pass tensor.resolve_conj()"
            )
        t = t.resolve_conj()  # a lazily conjugated view has no plain buffer
    try:
        arr = t.numpy()
    except TypeError:
        if str(t.layout) != "torch.strided":
            raise errors.type_error(call, f"argument '{arg}' is a {t.layout} tensor; {call} takes dense "
                                    "tensors only (all_reduce SUM also takes sparse COO)") from None
        raise
    return arr, _BY_NUMPY[arr.dtype]


def _from_device(dev: gpu.Device, call: Any, arg: str, writable: bool,
                 staging: list[gpu.Staged] | None) -> tuple[np.ndarray, DType]:
    if dev.dtype == "bfloat16":
        d = BFLOAT16
    else:
        try:
            d = _lookup(np.dtype(dev.dtype), call, arg)
        except TypeError:
            raise _unsupported(call, arg, dev.dtype) from None
    if not dev.contiguous:
        raise errors.value_error(
            call, f"argument '{arg}' ({d.name} device array of shape {dev.shape}) is not contiguous; "
            "pass a contiguous array"
        )
    if staging is None:
        raise errors.type_error(call, f"argument '{arg}' is a device buffer, which this call does not take")
    return gpu.to_mpi(dev, d.raw, d.kind, call, writable, staging), d


def _convert_other(x: Any, call: Any, arg: str, writable: bool,
                   staging: list[gpu.Staged] | None) -> tuple[np.ndarray, DType]:
    if isinstance(x, np.ndarray):  # subclasses: memmap, recarray views, ...
        arr = x.view(np.ndarray)
        return arr, _lookup(arr.dtype, call, arg)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor) and x.is_cpu:
        if not _TORCH_PLAIN:
            _plain_torch_dtypes(torch)
        return _from_torch(x, call, arg, writable)
    dev = gpu.inspect(x, call, arg)
    if dev is not None:
        return _from_device(dev, call, arg, writable, staging)
    if torch is not None and isinstance(x, torch.Tensor):
        raise errors.type_error(
            call, f"argument '{arg}' is a torch tensor on {x.device}; mpidist handles CPU and CUDA tensors"
        )
    raise errors.type_error(
        call,
        f"argument '{arg}' must be a numpy array, a torch tensor or a GPU array "
        f"(__cuda_array_interface__ / __dlpack__), got {errors.type_name(x)}",
    )


def as_buffer(x: Any, call: Any, arg: str, writable: bool,
              staging: list[gpu.Staged] | None = None) -> tuple[np.ndarray, DType]:
    """Return ``(array, dtype)`` where ``array`` is what MPI reads or writes for ``x``.

    ``call`` is the :class:`~mpidist.core.registry.Call` (or a name, for host-only callers);
    ``writable`` says that MPI writes results into ``x``. ``array`` is C-contiguous and has
    dtype ``dtype.raw``; ``[array, dtype.mpi]`` is the mpi4py buffer spec. For host data it
    shares memory with ``x``; for a GPU array it is a :class:`~mpidist.gpu.DeviceView` of
    device memory (CUDA-aware MPI) or a staged pool copy, recorded in the call's ``staging``
    list, which :func:`mpidist.gpu.completion` copies back.
    """
    if type(x) is np.ndarray:
        arr = x
        d = _BY_NUMPY.get(arr.dtype)
        if d is None:
            d = _lookup(arr.dtype, call, arg)
    else:
        arr, d = _convert_other(x, call, arg, writable, staging)
    flags = arr.flags
    if not flags.c_contiguous:
        raise errors.value_error(
            call,
            f"argument '{arg}' ({d.name} array of shape {tuple(arr.shape)}) is not contiguous; "
            "pass a contiguous array (numpy.ascontiguousarray / Tensor.contiguous())",
        )
    if writable and not flags.writeable:
        raise errors.value_error(
            call, f"argument '{arg}' is read-only but receives the result; pass a writable array"
        )
    if arr.dtype is not d.raw and arr.dtype != d.raw:
        arr = arr.view(d.raw)
    return arr, d


def as_buffers(xs: Any, call: Any, arg: str, writable: bool, length: int | None = None,
               staging: list[gpu.Staged] | None = None,
               dtype: DType | None = None) -> list[tuple[np.ndarray, DType]]:
    """:func:`as_buffer` for a list argument (``tensor_list``, ``scatter_list``, ...).

    ``length`` is the number of entries the call needs, ``dtype`` the one every entry must have.
    """
    if not isinstance(xs, (list, tuple)):
        raise errors.type_error(
            call, f"argument '{arg}' must be a list of arrays, got {errors.type_name(xs)}"
        )
    if length is not None and len(xs) != length:
        raise errors.value_error(
            call, f"argument '{arg}' has {len(xs)} entries; the group has {length} ranks"
        )
    bufs = []
    for i, x in enumerate(xs):
        try:
            bufs.append(as_buffer(x, call, arg, writable, staging))
        except (TypeError, ValueError):
            as_buffer(x, call, f"{arg}[{i}]", writable, staging)  # raises again, naming the entry
            raise
    if dtype is not None:
        same_dtype(bufs, dtype, call, arg)
    return bufs


def same_dtype(bufs: list[tuple[np.ndarray, DType]], d: DType, call: str, arg: str) -> None:
    """Every entry of a list argument must have dtype ``d`` (torch requires it too)."""
    for i, (_, di) in enumerate(bufs):
        if di is not d:
            raise errors.type_error(
                call, f"argument '{arg}[{i}]' has dtype {di.name}, expected {d.name}"
            )


def address(arr: np.ndarray) -> int:
    """The address of ``arr``'s first byte (``MPI.buffer`` is far cheaper than ``__array_interface__``)."""
    return MPI.buffer(arr).address


def joined(bufs: list[tuple[np.ndarray, DType]]) -> np.ndarray | None:
    """One array over the memory of ``bufs`` if they lie back to back, else ``None``.

    Lists made by ``torch.chunk``/``numpy.split`` of one buffer are laid out this way;
    MPI then reads or writes them in one call with no staging copy.
    """
    if not bufs:
        return None
    first = bufs[0][0]
    if len(bufs) > 1 and bufs[1][0].base is None:
        return None  # an array that owns its memory is no view of a shared buffer: skip the walk
    dt = first.dtype
    start = address(first)
    end = start
    total = 0
    for arr, _ in bufs:
        if arr.dtype != dt or address(arr) != end:
            return None
        end += arr.nbytes
        total += arr.size
    if total == 0:
        return first.reshape(0)
    return np.frombuffer(MPI.buffer.fromaddress(start, end - start), dtype=dt)

