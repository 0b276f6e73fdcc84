"""bfloat16 arithmetic on raw 16-bit words, with numpy only.

MPI has no bfloat16 datatype (``MPI.BFLOAT16_T`` is null in the MPICH and Open MPI
builds we ship against) and ``ml_dtypes.bfloat16`` arrays cannot be exported as
buffers, so mpidist moves bfloat16 data as ``uint16`` words and does the arithmetic
here, in float32: widen exactly, compute, round once to nearest-even.
"""

from __future__ import annotations

import numpy as np


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
