"""Data-parallel gradient averaging: one flat buffer, one ``all_reduce(AVG)`` per step.

Reducing many small gradient arrays one by one pays MPI's latency per array; packing
them into one contiguous buffer pays it once. :class:`FlatBuffer` owns that buffer and
is meant to be reused every step (its :meth:`~FlatBuffer.views` can even *be* the
gradient arrays, so packing costs nothing). :func:`average_gradients` is the whole
step: pack, ``MPI_Allreduce`` (sum, then divide by the group size), unpack.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..calls.collectives import all_reduce
from ..calls.ops import ReduceOp
from ..core import errors
from ..core.buffers import as_buffer


def _arrays(arrays: Sequence[Any], call: str) -> list[np.ndarray]:
    """The numpy views MPI would use for ``arrays`` (numpy arrays or torch CPU tensors)."""
    if isinstance(arrays, np.ndarray) or not isinstance(arrays, (list, tuple)):
        raise errors.type_error(call, f"expected a list of arrays, got {errors.type_name(arrays)}")
    out = []
    for i, a in enumerate(arrays):
        arr, d = as_buffer(a, call, f"arrays[{i}]", True)
        if d.kind == "bf16":
            raise errors.type_error(
                call, f"arrays[{i}] is bfloat16; flatten float32 gradients or reduce it with all_reduce"
            )
        if arr.dtype.name != d.name:  # as_buffer hands float16 over as its raw 16-bit words
            arr = arr.view(np.dtype(d.name))
        out.append(arr)
    return out


class FlatBuffer:
    """One contiguous buffer laid out like a list of arrays (same dtype), for reuse.

    Parameters
    ----------
    arrays : list of numpy arrays (or torch CPU tensors)
        The layout template: shapes and the common dtype. Their values are not copied.

    Attributes
    ----------
    flat : numpy.ndarray
        The 1-D buffer; array ``i`` occupies ``flat[offsets[i]:offsets[i + 1]]``.
    """

    def __init__(self, arrays: Sequence[Any]) -> None:
        call = "FlatBuffer"
        arrs = _arrays(arrays, call)
        if not arrs:
            raise errors.value_error(call, "needs at least one array")
        self.dtype = arrs[0].dtype
        for i, a in enumerate(arrs):
            if a.dtype != self.dtype:
                raise errors.value_error(
                    call, f"arrays[{i}] has dtype {a.dtype}, arrays[0] has {self.dtype}; "
                    "one flat buffer holds one dtype"
                )
        self.shapes = [a.shape for a in arrs]
        self.offsets = np.concatenate([[0], np.cumsum([a.size for a in arrs])]).astype(int).tolist()
        self.flat = np.zeros(self.offsets[-1], dtype=self.dtype)

    def views(self) -> list[np.ndarray]:
        """Arrays of the template's shapes that share memory with :attr:`flat`."""
        o = self.offsets
        return [self.flat[o[i]:o[i + 1]].reshape(s) for i, s in enumerate(self.shapes)]

    def _check(self, arrs: list[np.ndarray], call: str) -> None:
        if len(arrs) != len(self.shapes):
            raise errors.value_error(call, f"got {len(arrs)} arrays, the buffer holds {len(self.shapes)}")
        for i, (a, s) in enumerate(zip(arrs, self.shapes)):
            if a.shape != s or a.dtype != self.dtype:
                raise errors.value_error(
                    call, f"arrays[{i}] is {a.dtype} {a.shape}, the buffer expects {self.dtype} {s}"
                )

    def _own(self, a: np.ndarray, i: int) -> bool:
        """Whether ``a`` already is slot ``i`` of :attr:`flat` (then no copy is needed)."""
        return (a.size > 0 and a.__array_interface__["data"][0]
                == self.flat.__array_interface__["data"][0] + self.offsets[i] * self.flat.itemsize)

    def pack(self, arrays: Sequence[Any]) -> np.ndarray:
        """Copy ``arrays`` into :attr:`flat` (skipping those that are its views); return it."""
        arrs = _arrays(arrays, "FlatBuffer.pack")
        self._check(arrs, "FlatBuffer.pack")
        o = self.offsets
        for i, a in enumerate(arrs):
            if not self._own(a, i):
                self.flat[o[i]:o[i + 1]] = a.reshape(-1)
        return self.flat

    def unpack(self, arrays: Sequence[Any]) -> None:
        """Copy :attr:`flat` back into ``arrays`` (in place; views of it are skipped)."""
        arrs = _arrays(arrays, "FlatBuffer.unpack")
        self._check(arrs, "FlatBuffer.unpack")
        o = self.offsets
        for i, a in enumerate(arrs):
            if not self._own(a, i):
                a.reshape(-1)[...] = self.flat[o[i]:o[i + 1]]


def flatten(arrays: Sequence[Any], out: FlatBuffer | None = None) -> FlatBuffer:
    """Pack ``arrays`` into ``out`` (a new :class:`FlatBuffer` when ``None``) and return it."""
    buf = out if out is not None else FlatBuffer(arrays)
    buf.pack(arrays)
    return buf


def unflatten(buffer: FlatBuffer, arrays: Sequence[Any]) -> None:
    """Copy ``buffer``'s contents back into ``arrays``, in place."""
    buffer.unpack(arrays)


def average_gradients(grads: Sequence[Any], group: Any = None, *, buffer: FlatBuffer | None = None,
                      bucket_cap_mb: float | None = None) -> None:
    """Replace every array in ``grads`` by its mean over the ranks of ``group``.

    Packs ``grads`` into one flat buffer (``buffer`` when given: pass the same one every
    step), runs ``all_reduce(flat, ReduceOp.AVG)`` — ``MPI_Allreduce`` with ``MPI_SUM``,
    then a divide by the group size — and copies the result back. With ``bucket_cap_mb``
    the buffer is reduced in slices of at most that many MiB, all started at once as
    ``MPI_Iallreduce`` and then waited for, as torch DDP's buckets are.

    Every rank passes arrays of the same shapes and dtype, in the same order; afterwards
    they hold identical values on every rank.

    Example::

        grads = [dW, db]                      # this rank's gradients
        dist.average_gradients(grads, buffer=flat)
    """
    call = "average_gradients"
    if bucket_cap_mb is not None and not bucket_cap_mb > 0:
        raise errors.value_error(call, f"bucket_cap_mb must be positive, got {bucket_cap_mb!r}")
    buf = flatten(grads, buffer)
    flat = buf.flat
    if bucket_cap_mb is None:
        all_reduce(flat, ReduceOp.AVG, group)
    else:
        step = max(1, int(bucket_cap_mb * 2**20) // flat.itemsize)
        works = [all_reduce(flat[i:i + step], ReduceOp.AVG, group, async_op=True)
                 for i in range(0, flat.size, step)]
        for w in works:
            w.wait()
    buf.unpack(grads)
