"""The path every array call ends in: debug's check, the MPI call, the completion step.

:func:`issue` starts the nonblocking ``I*`` routine and either waits for it within the
group's timeout (:func:`mpidist.timeouts.wait`) and runs the call's post-step, or, under
``async_op=True``, returns a :class:`~mpidist.work.Work` that does both on ``wait()``. A
group of one rank, which no peer can keep waiting, runs the blocking routine.

The helpers below are shared by the call families: list arguments that lie back to back
in memory (``chunk``/``split`` of one buffer) are used directly, other lists go through one
staging buffer.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from . import debug, errors, gpu
from .buffers import DType, as_buffer, joined
from .groups import ProcessGroup
from .timeouts import wait
from .work import Work

Step = Callable[[], None]


def issue(pg: ProcessGroup, call: Any, async_op: bool, blocking: Callable[..., Any],
          nonblocking: Callable[..., Any], args: tuple, post: Step | None = None,
          output: Any = None, staging: list[gpu.Staged] | None = None,
          own_waits: bool = False) -> Work | None:
    """Complete ``nonblocking(*args)`` (``blocking`` on one rank), then ``post()``; or a Work.

    ``staging`` holds the call's device buffers: their copy-back and release join ``post``.
    ``own_waits``: ``blocking`` is mpidist's own sequence of MPI calls (the 16-bit reductions,
    :mod:`mpidist.lowprec`), run as it is rather than through its nonblocking form.
    """
    if staging:
        post = gpu.completion(staging, post, output)
    try:
        if debug.LEVEL:
            debug.check(pg)  # DETAIL: all ranks agree on the call before MPI sees it
        pg.seq += 1
        if async_op:
            return Work((nonblocking(*args),), call, post, output, pg, keep=args)
        if pg._size == 1 or own_waits:
            blocking(*args)
        else:
            wait((nonblocking(*args),), pg, call, args)
    except BaseException:
        if staging:
            gpu.release(staging)
        raise
    if post is not None:
        post()
    return None


def then(*steps: Step | None) -> Step | None:
    """One step that runs ``steps`` in order (``None`` entries skipped; ``None`` if none are left)."""
    steps = tuple(s for s in steps if s is not None)
    if not steps:
        return None
    if len(steps) == 1:
        return steps[0]

    def run() -> None:
        for s in steps:
            s()
    return run


def output_and_input(call: Any, output: Any, out_arg: str, input: Any, in_arg: str,  # noqa: A002
                     staging: list) -> tuple[np.ndarray, np.ndarray, DType]:
    """The output and input arrays of a two-tensor call, which must share a dtype."""
    out, d = as_buffer(output, call, out_arg, True, staging)
    inp, di = as_buffer(input, call, in_arg, False, staging)
    if di is not d:
        raise errors.type_error(call, f"{out_arg} is {d.name} but {in_arg} is {di.name}")
    return out, inp, d


def size_error(call: Any, arg: str, got: int, want: int, why: str) -> ValueError:
    return errors.value_error(call, f"argument '{arg}' has {got} elements, expected {want} ({why})")


def into_list(outs: list[tuple[np.ndarray, DType]], d: DType) -> tuple[np.ndarray, Step | None]:
    """The one array MPI writes for an output list, and the step that copies it into the entries.

    Entries that lie back to back are written in place (no step); others get a staging array.
    """
    whole = joined(outs)
    if whole is not None:
        return whole, None
    whole = np.empty(sum(a.size for a, _ in outs), d.raw)

    def copy_out() -> None:
        off = 0
        for arr, _ in outs:
            n = arr.size
            arr.reshape(-1)[...] = whole[off:off + n]
            off += n
    return whole, copy_out


def from_list(bufs: list[tuple[np.ndarray, DType]], d: DType) -> np.ndarray:
    """The entries of an input list as one contiguous 1-D array (a view when possible)."""
    whole = joined(bufs)
    if whole is not None:
        return whole
    if not bufs:
        return np.empty(0, d.raw)
    return np.concatenate([a.reshape(-1) for a, _ in bufs])


def displacements(counts: Sequence[int]) -> list[int]:
    out, off = [], 0
    for c in counts:
        out.append(off)
        off += c
    return out


def overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """May ``a`` and ``b`` share memory? Two distinct arrays that own their data cannot."""
    if a.base is None and b.base is None:
        return a is b
    return np.may_share_memory(a, b)
