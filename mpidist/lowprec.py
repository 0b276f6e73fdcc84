"""float16 and bfloat16 on raw 16-bit words: conversions and the 16-bit reductions.

MPI has no bfloat16 datatype (``MPI.BFLOAT16_T`` is null in the MPICH and Open MPI builds
we ship against), Open MPI has no float16, and ``ml_dtypes.bfloat16`` arrays cannot be
exported as buffers. So mpidist moves both types as ``uint16`` words (``MPI_UINT16_T``)
and reduces them itself: every element is widened exactly to float32, accumulated in
float32 in rank order, scaled (AVG, PREMUL_SUM) in float32, and rounded once, to nearest
even. The result is the same on every rank.

The reductions are :class:`Words16` methods, which stand in for the communicator's
``Allreduce`` / ``Reduce`` / ``Reduce_scatter_block`` (see :meth:`mpidist.ops.Plan.on`).
The float32 arithmetic runs in one pass over memory in a small C kernel (``_words16.c``,
built at install where a C compiler is found), else in numpy (torch's casts for float16
when torch is loaded). Widening to float32 and reducing inside MPI was measured slower on
one node and moves twice the bytes across nodes, so the words are what travels:

* all_reduce -- small messages (and fewer words than ranks): ``MPI_Allgather`` of the
  words, then every rank reduces all of them (one collective). Large messages on 2 ranks:
  each rank sums one half (``MPI_Sendrecv`` of the other half with the peer) and the sums
  are swapped with a second ``MPI_Sendrecv``, on a private duplicate of the communicator,
  in chunks of :data:`CHUNK` words. Large messages on more ranks: ``MPI_Alltoallv`` so
  that each rank holds every rank's copy of its slice, one float32 pass per slice, then
  ``MPI_Allgatherv`` of the rounded words (a reduce-scatter/all-gather allreduce).
* reduce -- the gather or the reduce-scatter shape, ending in ``MPI_Gather(v)`` to the root.
* reduce_scatter -- ``MPI_Alltoall`` of the blocks, then the float32 pass on the own block.

Every path combines the ranks' values in rank order, so the result does not depend on
the path. ``Iallreduce`` (``async_op=True``, DDP's fp16-compressed buckets) runs on one
worker thread per process, in issue order, on a private duplicate of the communicator, and
returns a generalized request (``MPI_Grequest_start``) that the worker completes; without
``MPI_THREAD_MULTIPLE`` it runs at once. The other ``I*`` variants run to completion and
return ``MPI.REQUEST_NULL``.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI

#: Below this many bytes per rank all_reduce/reduce gather every rank's words instead.
SMALL_BYTES = 64 * 1024
#: The two-rank path moves its halves in chunks of this many words, :data:`DEPTH` chunks in flight.
CHUNK = 1 << 20
DEPTH = 3
#: Scratch buffers up to this many words are kept per thread for the next call.
SCRATCH_KEEP = 1 << 24
#: Asynchronous all-reduces (``async_op=True``) run on a worker thread, overlapping the caller.
ASYNC = True
#: From this many elements on, conversions use torch's vectorised casts when torch is loaded.
TORCH_MIN = 4096

_WORD = MPI.UINT16_T
_ml_bf16: Any = None

try:  # the C kernel, built at install where a compiler is found (setup.py)
    from . import _words16 as _kernel
except ImportError:
    _kernel = None
_KIND = {"f16": 0, "bf16": 1}
_OPCODE = {np.add: 0, np.multiply: 1, np.minimum: 2, np.maximum: 3}


def kernel(kind: str) -> Any:
    """The C kernel module when it is built and handles ``kind`` (``"f16"``/``"bf16"``), else ``None``."""
    if _kernel is not None and (kind == "bf16" or _kernel.has_f16):
        return _kernel
    return None


def _bf16_dtype() -> Any:
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
    elif _bf16_dtype():
        np.copyto(out, words.view(_bf16_dtype()))
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
        elif _bf16_dtype():
            np.copyto(out.view(_bf16_dtype()), values, casting="unsafe")
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


def _scratch(nwords: int) -> np.ndarray:
    """``nwords`` uint16 scratch words, reused by this thread's next call (page faults cost more)."""
    buf = getattr(_local, "words", None)
    if buf is None or buf.size < nwords:
        buf = np.empty(nwords, np.uint16)
        if nwords <= SCRATCH_KEEP:
            _local.words = buf
    return buf[:nwords]


def _split(n: int, size: int) -> tuple[list[int], list[int]]:
    counts = [n // size + (r < n % size) for r in range(size)]
    displs = [0] * size
    for r in range(1, size):
        displs[r] = displs[r - 1] + counts[r - 1]
    return counts, displs


def _scatter_slices(comm: MPI.Comm, words: np.ndarray, red: Reduction, out: np.ndarray | None
                    ) -> tuple[np.ndarray, list[int], list[int]]:
    """Reduce-scatter by slices: rank r ends with the reduced slice r (written to ``out``)."""
    size, me = comm.Get_size(), comm.Get_rank()
    counts, displs = _split(words.size, size)
    m = counts[me]
    rows = _scratch(size * m).reshape(size, m)
    comm.Alltoallv([words, (counts, displs), _WORD], [rows, ([m] * size, None), _WORD])
    seg = out if out is not None else np.empty(m, np.uint16)
    return reduce_rows(rows, red, size, seg), counts, displs


def _gather_all(n: int, size: int) -> bool:
    """Whether every rank should receive all words (one exchange instead of two)."""
    return n * 2 <= SMALL_BYTES or n < size


_private_key: int | None = None


def _private(comm: MPI.Comm) -> MPI.Comm:
    """A duplicate of ``comm`` for lowprec's point-to-point messages, made on first use
    (collective: every rank is in the same reduction) and freed with ``comm``."""
    global _private_key
    if _private_key is None:
        _private_key = MPI.Comm.Create_keyval(delete_fn=lambda c, k, dup: dup.Free())
    dup = comm.Get_attr(_private_key)
    if dup is None:
        dup = comm.Dup()
        comm.Set_attr(_private_key, dup)
    return dup


def _wait(reqs: list[MPI.Request]) -> None:
    """``MPI_Waitall``; on the asynchronous worker, ``MPI_Testall`` with growing sleeps instead
    (a blocking wait there would spin a core that backward needs)."""
    if threading.current_thread() is not _async.thread:
        MPI.Request.Waitall(reqs)
        return
    pause = 20e-6
    while not MPI.Request.Testall(reqs):
        time.sleep(pause)
        pause = min(pause * 2, 500e-6)


class _Async:
    """One thread per process that runs the asynchronous 16-bit all-reduces in issue order.

    Each is handed over with a generalized request (``MPI_Grequest_start``) that the thread
    completes, so the caller's ``Work`` waits on it like on any MPI request. The thread works
    on a private duplicate of the communicator, made by the caller (collective), so the
    caller's own collectives on the communicator never meet it.
    """

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def submit(self, job: Any) -> MPI.Request:
        failed: list[BaseException] = []
        greq = MPI.Grequest.Start(_query, _free, _cancel, args=(failed,))
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="mpidist-lowprec", daemon=True)
                self.thread.start()
        self.jobs.put((job, greq, failed))
        return greq

    def _run(self) -> None:
        while True:
            job, greq, failed = self.jobs.get()
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - reported through the request's status
                failed.append(exc)
            greq.Complete()


def _query(status: MPI.Status, failed: list) -> None:
    status.Set_source(MPI.UNDEFINED)
    status.Set_tag(MPI.UNDEFINED)
    status.Set_error(MPI.ERR_OTHER if failed else MPI.SUCCESS)
    status.Set_elements(MPI.BYTE, 0)
    status.Set_cancelled(False)


def _free(failed: list) -> None:
    pass


def _cancel(completed: bool, failed: list) -> None:
    pass


_async = _Async()


def _allreduce_pair(comm: MPI.Comm, words: np.ndarray, red: Reduction) -> None:
    """Two ranks: rank r reduces half r of each chunk, then the halves are swapped.

    Pipelined: while chunk k is reduced, the halves of the next :data:`DEPTH` chunks are
    on their way (``MPI_Isend``/``MPI_Irecv``), and chunk k's sum leaves at once, so the
    link stays busy in both directions.
    """
    me = comm.Get_rank()
    peer = 1 - me
    comm = _private(comm)
    n = words.size
    step = min(n, CHUNK)
    nchunks = -(-n // step)
    depth = min(DEPTH, nchunks)
    width = step - step // 2  # the larger half
    slots = _scratch(depth * 2 * width).reshape(depth, 2 * width)
    chunks = []
    for k in range(nchunks):
        part = words[k * step:(k + 1) * step]
        halves = (part[:part.size // 2], part[part.size // 2:])
        chunks.append((halves[me], halves[peer]))

    def exchange(k: int) -> list[MPI.Request]:
        mine, theirs = chunks[k]
        rows = slots[k % depth, :2 * mine.size].reshape(2, mine.size)
        return [comm.Isend([theirs, _WORD], peer, 0), comm.Irecv([rows[peer], _WORD], peer, 0)]

    incoming = [exchange(k) for k in range(depth)]
    outgoing: list[MPI.Request] = []
    for k in range(nchunks):
        _wait(incoming[k])
        mine, theirs = chunks[k]
        rows = slots[k % depth, :2 * mine.size].reshape(2, mine.size)
        rows[me] = mine
        reduce_rows(rows, red, 2, mine)
        outgoing += [comm.Isend([mine, _WORD], peer, 1), comm.Irecv([theirs, _WORD], peer, 1)]
        if k + depth < nchunks:
            incoming.append(exchange(k + depth))
    _wait(outgoing)


def allreduce(comm: MPI.Comm, words: np.ndarray, red: Reduction) -> None:
    """In-place all-reduce of the 1-D ``uint16`` array ``words`` (see the module docstring)."""
    size, n = comm.Get_size(), words.size
    if n == 0:
        return
    if _gather_all(n, size):
        rows = _scratch(size * n).reshape(size, n)
        comm.Allgather([words, _WORD], [rows, _WORD])
        reduce_rows(rows, red, size, words)
    elif size == 2:
        _allreduce_pair(comm, words, red)
    else:
        counts, displs = _split(n, size)
        me = comm.Get_rank()
        _scatter_slices(comm, words, red, words[displs[me]:displs[me] + counts[me]])
        comm.Allgatherv(MPI.IN_PLACE, [words, (counts, displs), _WORD])


def reduce(comm: MPI.Comm, send: np.ndarray, recv: np.ndarray | None, root: int, red: Reduction
           ) -> None:
    """Reduce 1-D ``send`` words onto ``root``'s ``recv`` (``recv`` may be ``send`` there)."""
    size, me, n = comm.Get_size(), comm.Get_rank(), send.size
    if n == 0:
        return
    if _gather_all(n, size):
        rows = _scratch(size * n).reshape(size, n) if me == root else None
        comm.Gather([send, _WORD], [rows, _WORD] if me == root else None, root)
        if me == root:
            reduce_rows(rows, red, size, recv)
        return
    seg, counts, displs = _scatter_slices(comm, send, red, None)
    if me == root:
        recv[displs[me]:displs[me] + counts[me]] = seg
        comm.Gatherv(MPI.IN_PLACE, [recv, (counts, displs), _WORD], root)
    else:
        comm.Gatherv([seg, _WORD], None, root)


def reduce_scatter_block(comm: MPI.Comm, send: np.ndarray, recv: np.ndarray, red: Reduction) -> None:
    """Block r of the reduction of 1-D ``send`` (``size * m`` words) into rank r's ``recv``."""
    size, m = comm.Get_size(), recv.size
    rows = _scratch(size * m).reshape(size, m)
    comm.Alltoall([send, _WORD], [rows, _WORD])
    reduce_rows(rows, red, size, recv.reshape(-1))


def _words(buf: Any) -> np.ndarray:
    return buf[0].reshape(-1)


class Words16:
    """A communicator stand-in whose reductions run :mod:`lowprec`'s 16-bit algorithms.

    Takes the same arguments as mpi4py's ``Allreduce``/``Reduce``/``Reduce_scatter_block``
    (``[array, datatype]`` buffer specs, ``MPI.IN_PLACE``); the ``op`` argument is ignored:
    the :class:`Reduction` decides.
    """

    def __init__(self, comm: MPI.Comm, red: Reduction) -> None:
        self.comm = comm
        self.red = red

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = None) -> None:  # noqa: N802
        words = _words(recvbuf)
        if sendbuf is not MPI.IN_PLACE:
            words[...] = _words(sendbuf)
        allreduce(self.comm, words, self.red)

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = None, root: int = 0) -> None:  # noqa: N802
        recv = _words(recvbuf) if recvbuf is not None else None
        send = recv if sendbuf is MPI.IN_PLACE else _words(sendbuf)
        reduce(self.comm, send, recv, root, self.red)

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = None) -> None:  # noqa: N802
        reduce_scatter_block(self.comm, _words(sendbuf), _words(recvbuf), self.red)

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = None) -> MPI.Request:  # noqa: N802
        """On :data:`ASYNC` (``MPI_THREAD_MULTIPLE``): run on the worker thread, else now."""
        if not ASYNC or MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            self.Allreduce(sendbuf, recvbuf, op)
            return MPI.REQUEST_NULL
        words = _words(recvbuf)
        if sendbuf is not MPI.IN_PLACE:
            words[...] = _words(sendbuf)
        private, red = _private(self.comm), self.red
        return _async.submit(lambda: allreduce(private, words, red))

    def Ireduce(self, *args: Any) -> MPI.Request:  # noqa: N802
        self.Reduce(*args)
        return MPI.REQUEST_NULL

    def Ireduce_scatter_block(self, *args: Any) -> MPI.Request:  # noqa: N802
        self.Reduce_scatter_block(*args)
        return MPI.REQUEST_NULL
