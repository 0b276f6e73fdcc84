"""float16 and bfloat16 on raw 16-bit words: conversions and the 16-bit reductions.

MPI has no bfloat16 datatype (``MPI.BFLOAT16_T`` is null in the MPICH and Open MPI builds
we ship against), Open MPI has no float16, and ``ml_dtypes.bfloat16`` arrays cannot be
exported as buffers. So mpidist moves both types as ``uint16`` words (``MPI_UINT16_T``)
and reduces them itself: every element is widened exactly to float32, accumulated in
float32 in rank order, scaled (AVG, PREMUL_SUM) in float32, and rounded once, to nearest
even. The result is the same on every rank.

The reductions are :class:`Words16` methods, which stand in for the communicator's
``Allreduce`` / ``Reduce`` / ``Reduce_scatter_block`` (see :meth:`mpidist.calls.ops.Plan.reducer`).
The float32 arithmetic is :mod:`mpidist.calls.lowprec_math`'s (a C kernel where one was built). Widening to
float32 and reducing inside MPI was measured slower on one node and moves twice the bytes across
nodes, so the words are what travels:

* all_reduce -- small messages (and fewer words than ranks): ``MPI_Allgather`` of the
  words, then every rank reduces all of them (one collective). Large messages on 2 ranks:
  each rank sums one half (``MPI_Isend``/``MPI_Irecv`` of the other half with the peer) and
  the sums are swapped the same way, on a private duplicate of the communicator,
  in chunks of :data:`CHUNK` words. Large messages on more ranks: ``MPI_Alltoallv`` so
  that each rank holds every rank's copy of its slice, one float32 pass per slice, then
  ``MPI_Allgatherv`` of the rounded words (a reduce-scatter/all-gather allreduce).
* reduce -- the gather or the reduce-scatter shape, ending in ``MPI_Gather(v)`` to the root.
* reduce_scatter -- ``MPI_Alltoall`` of the blocks, then the float32 pass on the own block.

Every path combines the ranks' values in rank order, so the result does not depend on
the path. Each collective named here is started in its nonblocking form and completed by the
caller's ``wait``: mpidist passes its group's bounded wait (:func:`mpidist.core.timeouts.wait`), so
a 16-bit reduction past the group's timeout raises as every other call does.
``Iallreduce`` (``async_op=True``, DDP's fp16-compressed buckets) runs on one
worker thread per process, in issue order, on a private duplicate of the communicator, and
returns a generalized request (``MPI_Grequest_start``) that the worker completes; without
``MPI_THREAD_MULTIPLE`` it runs at once. The other ``I*`` variants run to completion and
return ``MPI.REQUEST_NULL``.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..core.waiting import Backoff, poll
from .lowprec_math import (
    Reduction,
    bf16_to_f32,
    drop_scratch,
    f32_to_bf16,
    kernel,
    narrow,
    reduce_rows,
    scratch,
    widen,
)

__all__ = ["Reduction", "Words16", "allreduce", "bf16_to_f32", "f32_to_bf16", "kernel", "narrow", "reduce",
           "reduce_rows", "reduce_scatter_block", "widen"]

#: Below this many bytes per rank all_reduce/reduce gather every rank's words instead.
SMALL_BYTES = 64 * 1024
#: The two-rank path moves its halves in chunks of this many words, :data:`DEPTH` chunks in flight.
CHUNK = 1 << 20
DEPTH = 3
#: Asynchronous all-reduces (``async_op=True``) run on a worker thread, overlapping the caller.
ASYNC = True

_WORD = MPI.UINT16_T
#: How a step's requests are completed: ``wait(requests, buffers they use)``.
Wait = Callable[[list, Any], None]
def _split(n: int, size: int) -> tuple[list[int], list[int]]:
    counts = [n // size + (r < n % size) for r in range(size)]
    displs = [0] * size
    for r in range(1, size):
        displs[r] = displs[r - 1] + counts[r - 1]
    return counts, displs


def _scatter_slices(comm: MPI.Comm, words: np.ndarray, red: Reduction, out: np.ndarray | None,
                    wait: Wait) -> tuple[np.ndarray, list[int], list[int]]:
    """Reduce-scatter by slices: rank r ends with the reduced slice r (written to ``out``)."""
    size, me = comm.Get_size(), comm.Get_rank()
    counts, displs = _split(words.size, size)
    m = counts[me]
    rows = scratch(size * m).reshape(size, m)
    bufs = ([words, (counts, displs), _WORD], [rows, ([m] * size, None), _WORD])
    wait([comm.Ialltoallv(*bufs)], bufs)
    seg = out if out is not None else np.empty(m, np.uint16)
    return reduce_rows(rows, red, size, seg), counts, displs


def _gather_all(n: int, size: int) -> bool:
    """Whether every rank should receive all words (one exchange instead of two)."""
    return n * 2 <= SMALL_BYTES or n < size


_private_key: int | None = None


def _private(comm: MPI.Comm, wait: Wait) -> MPI.Comm:
    """A duplicate of ``comm`` for lowprec's point-to-point messages, made on first use
    (collective: every rank is in the same reduction; ``MPI_Comm_idup`` completed by ``wait``)
    and freed with ``comm``."""
    global _private_key
    if _private_key is None:
        _private_key = MPI.Comm.Create_keyval(delete_fn=lambda c, k, dup: dup.Free())
    dup = comm.Get_attr(_private_key)
    if dup is None:
        dup, req = comm.Idup()
        wait([req], None)
        comm.Set_attr(_private_key, dup)
    return dup


def _wait(reqs: list[MPI.Request], keep: Any = None) -> None:
    """``MPI_Waitall``; on the asynchronous worker, ``MPI_Testall`` with growing sleeps instead
    (a blocking wait there would spin a core that backward needs). The default :data:`Wait`;
    mpidist's calls pass their group's bounded wait (:func:`mpidist.core.timeouts.wait`)."""
    if threading.current_thread() is not _async.thread:
        MPI.Request.Waitall(reqs)
        return
    poll(lambda: MPI.Request.Testall(reqs), None, Backoff(longest=500e-6))


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
            # dropped before the caller can see the request complete: held until the next job
            # arrived, the closure kept the caller's buffer alive after the caller let it go
            del job
            greq.Complete()
            del greq, failed


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


def _allreduce_pair(comm: MPI.Comm, words: np.ndarray, red: Reduction, wait: Wait) -> None:
    """Two ranks: rank r reduces half r of each chunk, then the halves are swapped.

    Pipelined: while chunk k is reduced, the halves of the next :data:`DEPTH` chunks are
    on their way (``MPI_Isend``/``MPI_Irecv``), and chunk k's sum leaves at once, so the
    link stays busy in both directions.
    """
    me = comm.Get_rank()
    peer = 1 - me
    comm = _private(comm, wait)
    n = words.size
    step = min(n, CHUNK)
    nchunks = -(-n // step)
    depth = min(DEPTH, nchunks)
    width = step - step // 2  # the larger half
    slots = scratch(depth * 2 * width).reshape(depth, 2 * width)
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
        wait(incoming[k], slots)
        mine, theirs = chunks[k]
        rows = slots[k % depth, :2 * mine.size].reshape(2, mine.size)
        rows[me] = mine
        reduce_rows(rows, red, 2, mine)
        outgoing += [comm.Isend([mine, _WORD], peer, 1), comm.Irecv([theirs, _WORD], peer, 1)]
        if k + depth < nchunks:
            incoming.append(exchange(k + depth))
    wait(outgoing, slots)


def allreduce(comm: MPI.Comm, words: np.ndarray, red: Reduction, wait: Wait = _wait) -> None:
    """In-place all-reduce of the 1-D ``uint16`` array ``words`` (see the module docstring)."""
    size, n = comm.Get_size(), words.size
    if n == 0:
        return
    if _gather_all(n, size):
        rows = scratch(size * n).reshape(size, n)
        bufs = ([words, _WORD], [rows, _WORD])
        wait([comm.Iallgather(*bufs)], bufs)
        reduce_rows(rows, red, size, words)
    elif size == 2:
        _allreduce_pair(comm, words, red, wait)
    else:
        counts, displs = _split(n, size)
        me = comm.Get_rank()
        _scatter_slices(comm, words, red, words[displs[me]:displs[me] + counts[me]], wait)
        buf = [words, (counts, displs), _WORD]
        wait([comm.Iallgatherv(MPI.IN_PLACE, buf)], buf)


def reduce(comm: MPI.Comm, send: np.ndarray, recv: np.ndarray | None, root: int, red: Reduction,
           wait: Wait = _wait) -> None:
    """Reduce 1-D ``send`` words onto ``root``'s ``recv`` (``recv`` may be ``send`` there)."""
    size, me, n = comm.Get_size(), comm.Get_rank(), send.size
    if n == 0:
        return
    if _gather_all(n, size):
        rows = scratch(size * n).reshape(size, n) if me == root else None
        bufs = ([send, _WORD], [rows, _WORD] if me == root else None)
        wait([comm.Igather(*bufs, root)], bufs)
        if me == root:
            reduce_rows(rows, red, size, recv)
        return
    seg, counts, displs = _scatter_slices(comm, send, red, None, wait)
    if me == root:
        recv[displs[me]:displs[me] + counts[me]] = seg
        bufs = (MPI.IN_PLACE, [recv, (counts, displs), _WORD])
    else:
        bufs = ([seg, _WORD], None)
    wait([comm.Igatherv(*bufs, root)], bufs)


def reduce_scatter_block(comm: MPI.Comm, send: np.ndarray, recv: np.ndarray, red: Reduction,
                         wait: Wait = _wait) -> None:
    """Block r of the reduction of 1-D ``send`` (``size * m`` words) into rank r's ``recv``."""
    size, m = comm.Get_size(), recv.size
    rows = scratch(size * m).reshape(size, m)
    bufs = ([send, _WORD], [rows, _WORD])
    wait([comm.Ialltoall(*bufs)], bufs)
    reduce_rows(rows, red, size, recv.reshape(-1))


def _words(buf: Any) -> np.ndarray:
    return buf[0].reshape(-1)


class Words16:
    """A communicator stand-in whose reductions run :mod:`lowprec`'s 16-bit algorithms.

    Takes the same arguments as mpi4py's ``Allreduce``/``Reduce``/``Reduce_scatter_block``
    (``[array, datatype]`` buffer specs, ``MPI.IN_PLACE``); the ``op`` argument is ignored:
    the :class:`Reduction` decides. Each step's requests are completed by ``wait``.
    """

    def __init__(self, comm: MPI.Comm, red: Reduction, wait: Wait = _wait) -> None:
        self.comm = comm
        self.red = red
        self.wait = wait

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = None) -> None:  # noqa: N802
        words = _words(recvbuf)
        if sendbuf is not MPI.IN_PLACE:
            words[...] = _words(sendbuf)
        self._run(allreduce, self.comm, words, self.red, self.wait)

    @staticmethod
    def _run(fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except BaseException:
            drop_scratch()  # a step given up past the timeout may still write into it
            raise

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = None, root: int = 0) -> None:  # noqa: N802
        recv = _words(recvbuf) if recvbuf is not None else None
        send = recv if sendbuf is MPI.IN_PLACE else _words(sendbuf)
        self._run(reduce, self.comm, send, recv, root, self.red, self.wait)

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = None) -> None:  # noqa: N802
        self._run(reduce_scatter_block, self.comm, _words(sendbuf), _words(recvbuf), self.red, self.wait)

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = None) -> MPI.Request:  # noqa: N802
        """On :data:`ASYNC` (``MPI_THREAD_MULTIPLE``): run on the worker thread, else now."""
        if not ASYNC or MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            self.Allreduce(sendbuf, recvbuf, op)
            return MPI.REQUEST_NULL
        words = _words(recvbuf)
        if sendbuf is not MPI.IN_PLACE:
            words[...] = _words(sendbuf)
        private, red = _private(self.comm, self.wait), self.red
        return _async.submit(lambda: allreduce(private, words, red))

    def Ireduce(self, *args: Any) -> MPI.Request:  # noqa: N802
        self.Reduce(*args)
        return MPI.REQUEST_NULL

    def Ireduce_scatter_block(self, *args: Any) -> MPI.Request:  # noqa: N802
        self.Reduce_scatter_block(*args)
        return MPI.REQUEST_NULL
