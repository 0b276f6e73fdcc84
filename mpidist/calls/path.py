"""The path every array call ends in: debug's check, the MPI call, the completion step.

:func:`issue` starts the nonblocking ``I*`` routine and either waits for it within the
group's timeout (:func:`mpidist.core.timeouts.wait`) and runs the call's post-step, or, under
``async_op=True``, returns a :class:`~mpidist.core.work.Work` that does both on ``wait()``. A
group of one rank, which no peer can keep waiting, runs the blocking routine.

The helpers below are shared by the call families: list arguments that lie back to back
in memory (``chunk``/``split`` of one buffer) are used directly, other lists go through one
staging buffer.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from mpi4py import MPI

from .. import gpu
from ..checks import debug, signature
from ..core import errors
from ..core.buffers import DType, as_buffer, joined
from ..core.groups import ProcessGroup
from ..core.timeouts import failure, wait
from ..core.work import Work

Step = Callable[[], None]


def issue(pg: ProcessGroup, call: Any, async_op: bool, blocking: Callable[..., Any],
          nonblocking: Callable[..., Any], args: tuple, post: Step | None = None,
          output: Any = None, staging: list[gpu.Staged] | None = None,
          own_waits: bool = False, sig: tuple | None = None,
          pairs: tuple[Sequence[int], Sequence[int]] | None = None) -> Work | None:
    """Complete ``nonblocking(*args)`` (``blocking`` on one rank), then ``post()``; or a Work.

    ``staging`` holds the call's device buffers: their copy-back and release join ``post``.
    ``own_waits``: ``blocking`` is mpidist's own sequence of MPI calls (the 16-bit reductions,
    :mod:`mpidist.calls.lowprec`), run as it is rather than through its nonblocking form.
    ``sig`` (and an all-to-all's ``pairs``) is what the default cross-rank check records
    (:func:`mpidist.checks.signature.note`), before any MPI routine of the call starts.
    """
    if staging:
        post = gpu.completion(staging, post, output)
    try:
        start(pg, sig, pairs)
        if async_op:
            return Work((nonblocking(*args),), call, post, output, pg, keep=args)
        if pg._size == 1 or own_waits:
            blocking_call(pg, call, blocking, args)
        else:
            wait((nonblocking(*args),), pg, call, args)
    except MPI.Exception as exc:  # the initiating call on a communicator a peer revoked
        if staging:
            gpu.release(staging)
        raise failure(pg, call, exc, args) from None
    except BaseException:
        if staging:
            gpu.release(staging)
        raise
    if post is not None:
        post()
    return None


def start(pg: ProcessGroup, sig: tuple | None, pairs: Any = None) -> None:
    """What precedes a collective's first MPI routine: debug's check (DETAIL: all ranks agree on the
    call) or the default cross-rank check (:func:`mpidist.checks.signature.note`), and the count."""
    if debug.LEVEL:
        debug.check(pg, sig, pairs)
    pg.seq += 1
    if sig is not None and signature.ON and debug.LEVEL < 2 and pg._size > 1:
        signature.note(pg, sig, pairs)


def blocking_call(pg: ProcessGroup, call: Any, blocking: Callable[..., Any], args: tuple) -> None:
    """``blocking(*args)``, an MPI error raised as mpidist's (:func:`mpidist.core.timeouts.failure`)."""
    try:
        blocking(*args)
    except MPI.Exception as exc:
        raise failure(pg, call, exc, args) from None


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
