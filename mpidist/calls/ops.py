"""ReduceOp and its mapping onto MPI.Op: the one place that knows which op fits which dtype.

``plan(op, dtype, call)`` returns the ``MPI.Op`` to call plus the two steps MPI has no
op for: AVG (a SUM, then a divide by the group size on completion) and PREMUL_SUM (a
multiply by the factor before a SUM). bool reduces with MPI's logical ops. float16 and
bfloat16 never reach an MPI reduction: their plan carries a :class:`~mpidist.calls.lowprec.Reduction`
(float32 accumulation, AVG/PREMUL scaling, one rounding) and :meth:`Plan.reducer` hands the
collective a communicator stand-in that runs it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI

from ..core import errors
from ..core.buffers import DType
from ..gpu import DeviceView, through_host
from . import lowprec
from .lowprec import bf16_to_f32, f32_to_bf16


class ReduceOp:
    """Reduction operations, with torch.distributed's names.

    ``ReduceOp.SUM``, ``PRODUCT``, ``MIN``, ``MAX``, ``BAND``, ``BOR``, ``BXOR``,
    ``AVG``; ``PREMUL_SUM`` needs a factor: use :func:`make_premul_sum`.
    """

    __slots__ = ("name", "factor", "plans")
    SUM: ReduceOp
    PRODUCT: ReduceOp
    MIN: ReduceOp
    MAX: ReduceOp
    BAND: ReduceOp
    BOR: ReduceOp
    BXOR: ReduceOp
    AVG: ReduceOp
    PREMUL_SUM: ReduceOp
    UNUSED: ReduceOp

    def __init__(self, name: str, factor: Any = None) -> None:
        self.name = name
        self.factor = factor
        self.plans: dict[str, Plan] = {}  # DType.kind -> Plan, memoised by plan()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ReduceOp):
            return self.name == other.name and self.factor is other.factor
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        if self.factor is not None:
            return f"<ReduceOp.{self.name} factor={self.factor!r}>"
        return f"<ReduceOp.{self.name}>"


_NAMES = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "PREMUL_SUM", "UNUSED")
for _n in _NAMES:
    setattr(ReduceOp, _n, ReduceOp(_n))
ReduceOp.RedOpType = ReduceOp  # torch spells the enum ReduceOp.RedOpType.SUM too

#: Deprecated torch alias (``dist.reduce_op.SUM``).
reduce_op = ReduceOp


def supports_complex(reduceOp: Any) -> bool:  # noqa: N803  (torch's argument name)
    """Whether mpidist reduces complex arrays with ``reduceOp`` (torch's ``supports_complex``):
    every op but ``MAX``, ``MIN`` and the bitwise ones. Unlike NCCL, MPI's ``MPI_PROD`` multiplies
    complex numbers, so ``PRODUCT`` is ``True`` here where torch says ``False``."""
    name = reduceOp.name if isinstance(reduceOp, ReduceOp) else getattr(reduceOp, "name", reduceOp)
    return name not in _NOT_COMPLEX


def make_premul_sum(factor: Any) -> ReduceOp:
    """``PREMUL_SUM`` with ``factor``: each rank's input is multiplied by it, then summed.

    ``factor`` is a Python number or a one-element array/tensor (torch's
    ``_make_nccl_premul_sum``).
    """
    return ReduceOp("PREMUL_SUM", factor)


class Plan(NamedTuple):
    """What to do for one (op, dtype): the MPI op, then optional pre/post steps."""

    op: MPI.Op  # MPI.OP_NULL for fp16/bf16, which never reach an MPI reduction
    average: bool  # divide by the group size after the SUM
    factor: Any  # multiply inputs by this before the SUM (PREMUL_SUM), else None
    lowprec: lowprec.Reduction | None = None  # fp16/bf16: the whole reduction, done by lowprec

    def reducer(self, comm: MPI.Comm, wait: lowprec.Wait) -> Any:
        """What to call ``Allreduce``/``Reduce``/``Reduce_scatter_block`` (and ``I*``) on.

        ``wait`` completes each step of a 16-bit reduction (the group's bounded wait).
        """
        return comm if self.lowprec is None else lowprec.Words16(comm, self.lowprec, wait)


_BASE = {
    "SUM": MPI.SUM, "PRODUCT": MPI.PROD, "MIN": MPI.MIN, "MAX": MPI.MAX,
    "BAND": MPI.BAND, "BOR": MPI.BOR, "BXOR": MPI.BXOR, "AVG": MPI.SUM, "PREMUL_SUM": MPI.SUM,
}
# C_BOOL is a logical type in MPI: only LAND/LOR/LXOR apply. torch's bool semantics.
_BOOL = {
    "SUM": MPI.LOR, "PRODUCT": MPI.LAND, "MIN": MPI.LAND, "MAX": MPI.LOR,
    "BAND": MPI.LAND, "BOR": MPI.LOR, "BXOR": MPI.LXOR,
}
_BITWISE = ("BAND", "BOR", "BXOR")
_FLOATS = ("f", "f16", "bf16")
_NOT_COMPLEX = ("MIN", "MAX", *_BITWISE)

# the float32 arithmetic of each op in a 16-bit reduction
_UFUNC = {
    "SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
    "AVG": np.add, "PREMUL_SUM": np.add,
}


def _name_of(op: Any, call: str) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    # torch.distributed.ReduceOp.SUM (a RedOpType) and friends: accept by name
    name = getattr(op, "name", None)
    if isinstance(name, str) and name in _BASE:
        return getattr(ReduceOp, name)
    raise errors.type_error(call, f"op must be a mpidist.ReduceOp, got {op!r}")


def _build(name: str, d: DType, call: str) -> Plan:
    kind = d.kind
    if name not in _BASE:
        raise errors.value_error(call, f"ReduceOp.{name} is not a reduction")
    if kind in _FLOATS and name in _BITWISE:
        raise errors.type_error(call, f"ReduceOp.{name} is bitwise and cannot reduce {d.name}")
    if kind == "c" and name in _NOT_COMPLEX:
        raise errors.type_error(call, f"ReduceOp.{name} is undefined for complex {d.name}")
    if kind in ("i", "u", "b") and name in ("AVG", "PREMUL_SUM"):
        raise errors.type_error(
            call, f"ReduceOp.{name} needs a floating-point or complex dtype, got {d.name}"
        )
    average = name == "AVG"
    if kind == "b":
        return _plan(_BOOL[name], False)
    if kind in ("f16", "bf16"):  # scaling happens in float32 inside the reduction
        return _plan(MPI.OP_NULL, False, lowprec.Reduction(kind, _UFUNC[name], average))
    return _plan(_BASE[name], average)


def _plan(op: MPI.Op, average: bool, low: lowprec.Reduction | None = None) -> Plan:
    return Plan(op, average, None, low)


def plan(op: Any, d: DType, call: str) -> Plan:
    """The :class:`Plan` for reducing dtype ``d`` with ``op``; raises on a bad pairing."""
    if type(op) is ReduceOp and op.factor is None:
        p = op.plans.get(d.kind)
        if p is None:
            if op.name == "PREMUL_SUM":
                raise errors.value_error(
                    call, "ReduceOp.PREMUL_SUM needs a factor: use make_premul_sum(factor)"
                )
            p = op.plans[d.kind] = _build(op.name, d, call)
        return p
    rop = _name_of(op, call)
    if rop.factor is None:
        return plan(getattr(ReduceOp, rop.name), d, call)
    p = _build(rop.name, d, call)
    factor = np.asarray(rop.factor)
    if factor.size != 1:
        raise errors.value_error(call, f"PREMUL_SUM factor must be a scalar, got shape {factor.shape}")
    value = factor.reshape(()).item()
    if p.lowprec is not None:
        return p._replace(lowprec=p.lowprec._replace(scale=value))
    return p._replace(average=False, factor=value)


def op_name(op: Any, call: str) -> str:
    """The name of ``op`` (mpidist's or torch's ``ReduceOp``), as the cross-rank check records it."""
    return op.name if type(op) is ReduceOp else _name_of(op, call).name


def premultiply(arr: np.ndarray, d: DType, factor: Any, out: np.ndarray | None = None) -> np.ndarray:
    """``factor * arr`` into ``out`` (a new array when ``None``), in ``arr``'s dtype.

    On device memory (a :class:`~mpidist.gpu.DeviceView`) it runs on a staged host copy;
    ``out`` is then ``arr`` itself or ``None`` (a new host array).
    """
    if isinstance(arr, DeviceView):
        if out is None:
            return through_host(arr, lambda h: premultiply(h, d, factor), False)
        through_host(arr, lambda h: premultiply(h, d, factor, out=h), True)
        return out
    if out is None:
        out = np.empty_like(arr)
    if d.kind == "bf16":
        f32_to_bf16(bf16_to_f32(arr) * np.float32(factor), out=out)
    elif d.kind == "f16":
        out[...] = (arr.view(np.float16) * factor).astype(np.float16).view(arr.dtype)
    else:
        np.multiply(arr, factor, out=out, casting="unsafe")
    return out


def divide(arr: np.ndarray, d: DType, n: int) -> None:
    """In place ``arr /= n``, the second half of AVG (on a staged copy for device memory)."""
    if isinstance(arr, DeviceView):
        through_host(arr, lambda h: divide(h, d, n), True)
    elif d.kind == "bf16":
        f32_to_bf16(bf16_to_f32(arr) / np.float32(n), out=arr)
    elif d.kind == "f16":
        v = arr.view(np.float16)
        np.divide(v, n, out=v)
    else:
        np.divide(arr, n, out=arr, casting="unsafe")
