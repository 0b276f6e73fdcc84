"""Low-precision (float16, bfloat16) arithmetic: conversions and the float32 sums of their reductions.

Every element is widened exactly to float32, accumulated in float32 in rank order, scaled
(AVG, PREMUL_SUM) in float32 and rounded once, to nearest even. The arithmetic runs in one
pass over memory in a small C kernel (``_lowprec.c``, built at install where a C compiler is
found), else in numpy (torch's casts for float16 when torch is loaded). The exchanges that
move the words are :mod:`mpidist.calls.lowprec`'s.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, NamedTuple

import numpy as np

#: From this many elements on, conversions use torch's vectorised casts when torch is loaded.
TORCH_MIN = 4096
#: Scratch buffers up to this many words are kept for the thread's next call.
SCRATCH_KEEP = 1 << 24

_ml_bf16: Any = None

try:  # the C kernel, built at install where a compiler is found (setup.py)
    from . import _lowprec as _kernel
except ImportError:
    _kernel = None
_KIND = {"f16": 0, "bf16": 1}
_OPCODE = {np.add: 0, np.multiply: 1, np.minimum: 2, np.maximum: 3}


def kernel(kind: str) -> Any:
    """The C kernel module when it is built and handles ``kind`` (``"f16"``/``"bf16"``), else ``None``."""
    if _kernel is not None and (kind == "bf16" or _kernel.has_f16):
        return _kernel
    return None


def bf16_dtype() -> Any:
    """``ml_dtypes.bfloat16`` when installed (fast C conversions), else ``False``."""
    global _ml_bf16
    if _ml_bf16 is None:
        try:
            import ml_dtypes

            _ml_bf16 = np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            _ml_bf16 = False
    return _ml_bf16


def bf16_to_f32(words: np.ndarray) -> np.ndarray:
    """Widen bfloat16 words (``uint16``) to float32 exactly (bfloat16 is the top half)."""
    return (words.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Round float32 to bfloat16 words, nearest-even; NaN stays a quiet NaN.

    ``out`` (``uint16``, same size) receives the words when given.
    """
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))
    words = (rounded >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        words[nan] = ((bits[nan] >> 16) | np.uint32(0x0040)).astype(np.uint16)
    if out is None:
        return words
    out[...] = words.reshape(out.shape)
    return out


def _torch_for(n: int) -> Any:
    """torch when the caller already imported it (numpy's float16 casts are scalar loops)."""
    return sys.modules.get("torch") if n >= TORCH_MIN else None


def widen(words: np.ndarray, kind: str, out: np.ndarray) -> np.ndarray:
    """float16 (``kind`` ``"f16"``) or bfloat16 (``"bf16"``) words -> float32 ``out``, exactly."""
    k = kernel(kind)
    if k is not None:
        k.widen(words, out, _KIND[kind])
        return out
    torch = _torch_for(words.size)
    if kind == "f16":
        if torch is not None:
            torch.from_numpy(out).copy_(torch.from_numpy(words.view(np.float16)))
        else:
            np.copyto(out, words.view(np.float16))
    elif bf16_dtype():
        np.copyto(out, words.view(bf16_dtype()))
    else:
        out.view(np.uint32)[...] = words
        np.left_shift(out.view(np.uint32), 16, out=out.view(np.uint32))
    return out


def narrow(values: np.ndarray, kind: str, out: np.ndarray) -> np.ndarray:
    """float32 -> 16-bit words in ``out``, rounded once to nearest even."""
    k = kernel(kind)
    if k is not None:
        k.narrow(values, out, _KIND[kind])
        return out
    torch = _torch_for(values.size)
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN are the defined results
        if kind == "f16":
            if torch is not None:
                torch.from_numpy(out.view(np.float16)).copy_(torch.from_numpy(values))
            else:
                np.copyto(out.view(np.float16), values, casting="unsafe")
        elif bf16_dtype():
            np.copyto(out.view(bf16_dtype()), values, casting="unsafe")
        else:
            f32_to_bf16(values, out=out)
    return out


class Reduction(NamedTuple):
    """One 16-bit reduction: element kind, float32 ufunc, and the scaling before rounding."""

    kind: str  # "f16" or "bf16"
    ufunc: np.ufunc  # np.add, np.multiply, np.minimum, np.maximum
    average: bool  # divide by the group size (ReduceOp.AVG)
    scale: float | None = None  # PREMUL_SUM's factor, applied to the float32 sum


def reduce_rows(rows: np.ndarray, red: Reduction, size: int, out: np.ndarray) -> np.ndarray:
    """Reduce the rows of ``rows`` (``(k, m)`` words, rank order) into ``out`` (``m`` words).

    One pass in the C kernel when it is built; otherwise numpy, one row at a time.
    """
    k = kernel(red.kind)
    if k is not None:
        scaled = red.scale is not None
        k.reduce(rows, rows.shape[0], out, _KIND[red.kind], _OPCODE[red.ufunc],
                 float(size) if red.average else 0.0, scaled, float(red.scale) if scaled else 0.0)
        return out
    m = rows.shape[1]
    acc = widen(rows[0], red.kind, np.empty(m, np.float32))
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN are the defined results
        if rows.shape[0] > 1:
            tmp = np.empty(m, np.float32)
            for row in rows[1:]:
                red.ufunc(acc, widen(row, red.kind, tmp), out=acc)
        if red.average:
            np.divide(acc, np.float32(size), out=acc)
        if red.scale is not None:
            np.multiply(acc, np.float32(red.scale), out=acc)
    return narrow(acc, red.kind, out)


_local = threading.local()


def drop_scratch() -> None:
    """Let this thread's next call allocate new scratch words (a given-up call's MPI may still write)."""
    _local.words = None


def scratch(nwords: int) -> np.ndarray:
    """``nwords`` uint16 scratch words, reused by this thread's next call (page faults cost more)."""
    buf = getattr(_local, "words", None)
    if buf is None or buf.size < nwords:
        buf = np.empty(nwords, np.uint16)
        if nwords <= SCRATCH_KEEP:
            _local.words = buf
    return buf[:nwords]
