"""The path every array call ends in: debug's check, the MPI call, the completion step.

:func:`issue` starts the nonblocking ``I*`` routine and either waits for it within the
group's timeout (:func:`mpidist.core.timeouts.wait`) and runs the call's post-step, or, under
``async_op=True``, returns a :class:`~mpidist.core.work.Work` that does both on ``wait()``. A
group of one rank, which no peer can keep waiting, runs the blocking routine.

The helpers below are shared by the call families: list arguments that lie back to back
in memory (``chunk``/``split`` of one buffer) are used directly, other lists go through one
staging buffer, except where a call's vector form can name each entry where it lies
(:func:`in_place_list`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from mpi4py import MPI

from .. import gpu
from ..checks import debug, signature
from ..core import errors
from ..core.buffers import DType, address, as_buffer, joined
from ..core.groups import ProcessGroup
from ..core.timeouts import failure, wait
from ..core.work import Work

Step = Callable[[], None]


def issue(pg: ProcessGroup, call: Any, async_op: bool, blocking: Callable[..., Any],
          nonblocking: Callable[..., Any], args: tuple, post: Step | None = None,
          output: Any = None, staging: list[gpu.Staged] | None = None,
          own_waits: bool = False, sig: tuple | None = None,
          pairs: tuple[Sequence[int], Sequence[int]] | None = None, hold: Any = None) -> Work | None:
    """Complete ``nonblocking(*args)`` (``blocking`` on one rank), then ``post()``; or a Work.

    ``staging`` holds the call's device buffers: their copy-back and release join ``post``.
    ``own_waits``: ``blocking`` is mpidist's own sequence of MPI calls (the 16-bit reductions,
    :mod:`mpidist.calls.lowprec`), run as it is rather than through its nonblocking form.
    ``sig`` (and an all-to-all's ``pairs``) is what the default cross-rank check records
    (:func:`mpidist.checks.signature.note`), before any MPI routine of the call starts.
    ``hold``: what a Work must keep alive besides ``args`` (the arrays of a list that ``args``
    names only by address, :func:`vector_list`).
    """
    if staging:
        post = gpu.completion(staging, post, output)
    try:
        start(pg, sig, pairs)
        if async_op:
            keep = args if hold is None else (*args, Held(hold))
            return Work((nonblocking(*args),), call, post, output, pg, keep=keep)
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


class Held:
    """Objects a Work keeps alive that are no buffer of its own: not counted in its bytes."""

    __slots__ = ("objects",)

    def __init__(self, objects: Any) -> None:
        self.objects = objects


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


#: A gather or scatter whose blocks hold at least this many bytes becomes ``MPI_Gatherv`` /
#: ``MPI_Scatterv``, so that the root's list is written or read where its entries lie
#: (:func:`in_place_list`). The vector form must be chosen from what every rank knows (the
#: block's size), never from the root's layout. MPICH 5, 2 cores, us, Gather / Gatherv on one
#: contiguous buffer: 8 B, 1.3 / 1.4 at 2 ranks and 6.6 / 9.2 at 4; 4 KiB, 1.5 / 1.8 and
#: 30.8 / 12.5; 1 MiB, 164 / 161, 537 / 529 at 3 ranks and 1146 / 708 at 4.
VECTOR_BYTES = 4096


#: Where a root's own array lies against its list (:func:`vector_list`).
APART, OWN_SLOT, INSIDE = 0, 1, 2


def spread(bufs: list[tuple[np.ndarray, DType]], d: DType) -> tuple[int, int, list[int]] | None:
    """``(first byte, end, displacements in elements)`` of a list's entries over one span, where
    they lie; ``None`` where two entries overlap, an entry lies a part of an element off, or the
    span passes what an ``int`` displacement can say. Each address is read once: this runs on
    every vector call."""
    item = d.raw.itemsize
    at = [(address(a), a.nbytes) for a, _ in bufs]
    base = end = at[0][0]
    for a, n in at:  # back to back in list order (chunk, split): no sort
        if a != end:
            break
        end += n
    else:
        if end == base or (end - base) // item >= 2**31:
            return None
        return base, end, displacements([n // item for _, n in at])
    live = sorted(x for x in at if x[1])
    if not live:
        return None
    base = end = live[0][0]
    for a, n in live:
        if a < end or (a - base) % item:
            return None
        end = a + n
    if (end - base) // item >= 2**31:
        return None
    return base, end, [(a - base) // item if n else 0 for a, n in at]


def vector_list(bufs: list[tuple[np.ndarray, DType]], d: DType, writable: bool,
                mine: np.ndarray | None = None, slot: int = 0) -> tuple[list, Step | None, int]:
    """A vector call's buffer argument for a list, ``[buffer, (counts, displacements),
    datatype]``: over the entries where they lie (:func:`spread`), else over one staging array
    (with the step that copies it out, for an output). And where the root's own array ``mine``
    lies: :data:`OWN_SLOT` (it is entry ``slot``, MPI's ``IN_PLACE``), :data:`INSIDE` (it
    overlaps another entry: MPI would write what it reads) or :data:`APART`."""
    counts = [a.size for a, _ in bufs]
    got = spread(bufs, d)
    if got is None:
        if writable:
            whole, post = into_list(bufs, d)
            return [whole, (counts, displacements(counts)), d.mpi], post, APART
        whole = from_list(bufs, d)  # a copy, or a view where the entries lie back to back
        where = INSIDE if mine is not None and overlap(mine, whole) else APART
        return [whole, (counts, displacements(counts)), d.mpi], None, where
    base, end, displs = got
    where = APART
    m, mn = (address(mine), mine.nbytes) if mine is not None else (0, 0)
    if mn and m < end and m + mn > base:
        if m == address(bufs[slot][0]):
            where = OWN_SLOT
        elif any(m < address(a) + a.nbytes and address(a) < m + mn for a, _ in bufs if a.nbytes):
            where = INSIDE
    return [MPI.buffer.fromaddress(base, end - base), (counts, displs), d.mpi], None, where


def copied_list(bufs: list[tuple[np.ndarray, DType]], d: DType) -> list:
    """A vector call's buffer argument over a copy of an input list, entries back to back: for a
    list whose memory MPI would also write."""
    counts = [a.size for a, _ in bufs]
    whole = np.concatenate([a.reshape(-1) for a, _ in bufs]) if bufs else np.empty(0, d.raw)
    return [whole, (counts, displacements(counts)), d.mpi]


def spans_meet(a: Any, b: Any) -> bool:
    """Do the memory spans of two buffers (arrays or ``MPI.buffer``) meet?"""
    a = a if isinstance(a, MPI.buffer) else MPI.buffer(a)
    b = b if isinstance(b, MPI.buffer) else MPI.buffer(b)
    if not a.nbytes or not b.nbytes:
        return False
    return a.address < b.address + b.nbytes and b.address < a.address + a.nbytes


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
