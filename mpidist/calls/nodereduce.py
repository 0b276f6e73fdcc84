"""Large SUM all_reduce on a group whose ranks share one node, through memory they all map.

MPI moves a message between two ranks of a node by copying it into shared memory and out again,
and its large ``MPI_Allreduce`` (a reduce-scatter, then an all-gather) does that twice, besides
its reduction. Where the group's ranks share a node, mpidist maps one segment of ``/dev/shm``
into all of them (:mod:`mpidist.core.segments`) and each rank copies out only the parts its peers
sum, sums its own part reading theirs in place, and copies in only their sums. 2 ranks, float32,
caches cold, medians: 16 MiB in 2.9 ms against ``MPI_Allreduce``'s 4.9 ms, 29 MiB in 6.5 ms
against 9.3 ms; 3 ranks on 2 cores 0.34-0.69x ``MPI_Allreduce`` (benchmarks/node_reduce.py,
docs/benchmarks.md "Large all_reduce within a node").

The array goes in chunks of :data:`CHUNK` bytes where each rank has a core of its own, and of
:data:`CHUNK_SHARED` where ranks share cores (:func:`mpidist.core.bell.ranks_per_core`). In chunk
``c``, rank ``r`` owns the ``r``-th of ``n`` equal parts and, in half ``c % 2`` of its window (its
share of the segment):

1. writes every other part of its array into its *in* area (the parts its peers sum);
2. barrier; sums its own part in rank order (its array for its own term, the peers' *in* areas
   for theirs) into its *out* area, and copies the sum into its array;
3. barrier; copies each peer's part of the sum from that peer's *out* area into its array.

Two halves used in turn make a third barrier needless: a half is written again only after its
readers have passed the barrier that follows their reads. Each part of the sum is made by one
rank, so every rank ends with the same bits, as DDP needs. The barriers are mpidist's bounded
ones (the C barrier, the group's timeout, peers' notices), so a rank that never comes makes the
others raise :class:`~mpidist.core.timeouts.GroupTimeoutError`, as in any wait. Before the
first barrier each rank writes its count and dtype in its window's head; after it every rank
reads every head, and none writes its own again before the next barrier, so ranks that pass
different arrays all raise the same ``ValueError`` instead of summing the wrong parts.

:func:`mpidist.all_reduce` (and so the torch backend's blocking calls) comes here for SUM, AVG
and PREMUL_SUM of numeric arrays (kinds :data:`KINDS`) of at least :data:`MIN_BYTES`, on groups
of two or more ranks that MPI says share a node (``MPI_Comm_split_type``); the group's segment is
made at its first such call, once the ranks agree (in a bounded wait) that ``/dev/shm`` has room
for it. ``MPIDIST_NODE_REDUCE=0`` sends every all_reduce to MPI.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..checks import signature
from ..core import bell, errors, segments, topology
from ..core.groups import ProcessGroup
from ..core.timeouts import failure
from . import native

#: Bytes of the array per chunk, and of each area of the window (a multiple of any itemsize),
#: where each rank has a core: the parts stay in the caches between the copies and the sum (2 ranks,
#: 1 core each, caches cold: 10 MiB in 0.78-0.91 ms, 29 MiB in 2.61-2.80 ms; 2 MiB chunks
#: 1.12-1.23 and 3.06-3.17 ms).
CHUNK = 1 << 20
#: Where the node's ranks share cores: half the barriers, each of which may wait for a peer that
#: is not running (4 ranks on 2 cores, 10 MiB: 2.8 ms against 5.0 ms with 1 MiB chunks).
CHUNK_SHARED = 2 << 20
#: Arrays from this size on take this path (below it MPI's own is as fast or faster).
MIN_BYTES = 4 << 20
#: The window's head: this rank's count and dtype, for the peers to check.
HEAD = 64
#: dtype kinds summed here as MPI sums them (bool is a logical type in MPI; 16-bit floats never
#: reach here, mpidist.calls.lowprec reduces them).
KINDS = frozenset("iufc")


#: ``MPIDIST_NODE_REDUCE=0``: every all_reduce goes through MPI's own.
ON = os.environ.get("MPIDIST_NODE_REDUCE", "").strip().lower() not in ("0", "off", "no", "false")
native.large_from(MIN_BYTES if ON else 0)


def describe() -> str:
    """For ``python -m mpidist info``: whether large sums within a node take the segment."""
    if not ON:
        return "through MPI (MPIDIST_NODE_REDUCE=0)"
    return (f"from {MIN_BYTES >> 20} MiB on groups within one node, in a shared /dev/shm segment "
            f"({_room() >> 20} MiB free there)")


def takes(arr: np.ndarray, op: MPI.Op) -> bool:
    """Whether this path sums ``arr`` (at least :data:`MIN_BYTES`, checked by the caller) with ``op``."""
    return ON and op is MPI.SUM and arr.dtype.kind in KINDS


class Window:
    """One group's shared memory (:func:`mpidist.core.segments.map_on_node`): per rank a head and
    two halves of *in* and *out* areas."""

    __slots__ = ("seg", "chunk", "views", "__weakref__")

    def __init__(self, seg: Any, ranks: int, chunk: int) -> None:
        self.seg, self.chunk = seg, chunk
        whole = np.frombuffer(seg, np.uint8)
        per = HEAD + 4 * chunk
        self.views = [whole[k * per:(k + 1) * per] for k in range(ranks)]

    def area(self, rank: int, half: int, out: bool) -> np.ndarray:
        start = HEAD + (2 * half + out) * self.chunk
        return self.views[rank][start:start + self.chunk]


#: group -> its windows, or None where its ranks do not share a node (or /dev/shm has no room)
_windows: weakref.WeakKeyDictionary[ProcessGroup, Window | None] = weakref.WeakKeyDictionary()


def window(pg: ProcessGroup, call: Any) -> Window | None:
    """The group's windows, made at its first large call (collective then, as that call is).

    The ranks first agree, in a bounded wait (so that a rank that never comes makes the others
    raise as in any call), on the chunk (the largest any rank chose: each rank reads its own
    cores, and the window's layout must be the same on all) and that ``/dev/shm`` has room for
    the segment twice over (a container's is often 64 MiB); then MPI says whether they share a
    node, and they map it."""
    try:
        return _windows[pg]
    except KeyError:
        pass
    # the node's ranks, not only the group's, compete for its cores
    chunk = CHUNK if bell.ranks_per_core(max(pg._size, bell.local_size)) == 1 else CHUNK_SHARED
    agreed = np.array([_room(), -chunk], np.int64)  # MIN: the least room, the largest chunk
    w = None
    try:
        native.finish(NotImplemented, lambda: pg.comm.Iallreduce(MPI.IN_PLACE, agreed, MPI.MIN), pg, call,
                      agreed)
        chunk = -int(agreed[1])
        size = pg._size * (HEAD + 4 * chunk)
        if agreed[0] >= 2 * size and topology.node_count(pg.comm) == 1:
            seg = segments.map_on_node(pg.comm, size, "mpidist-reduce")[0]
            w = Window(seg, pg._size, chunk) if seg is not None else None
    except MPI.Exception as exc:  # a dead peer (ULFM), as in the barriers below
        raise failure(pg, call, exc, agreed) from None
    _windows[pg] = w
    return w


def _room() -> int:
    """Bytes free in ``/dev/shm`` (0 without it: no segment can be made)."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def all_reduce(arr: np.ndarray, pg: ProcessGroup, call: Any) -> bool:
    """Sum ``arr`` (C-contiguous, writable, a kind in :data:`KINDS`) over ``pg`` in place;
    ``False`` where the group's ranks do not share a node (nothing was done: use MPI)."""
    w = window(pg, call)
    if w is None:
        return False
    head = w.views[pg._rank][:HEAD].view(np.int64)
    head[0], head[1] = arr.size, arr.dtype.num
    per = w.chunk // arr.dtype.itemsize  # elements per chunk, of which each rank sums 1/n

    def barrier() -> None:
        # MPI's barrier orders this rank's stores before its peers' loads after it, as it must
        # for its own messages through shared memory
        try:
            native.barrier_on(pg, call, arr)
        except MPI.Exception as exc:
            raise failure(pg, call, exc, arr) from None

    flat = arr.reshape(-1)
    with np.errstate(all="ignore"):  # MPI_SUM overflows to inf without a word; so does this
        _chunks(w, pg, call, flat, per, barrier)
    return True


def _chunks(w: Window, pg: ProcessGroup, call: Any, flat: np.ndarray, per: int,
            barrier: Callable[[], None]) -> None:
    """The chunks of :func:`all_reduce` (see the module)."""
    n, r, dtype, count = pg._size, pg._rank, flat.dtype, flat.size
    for c, s in enumerate(range(0, count, per)):
        m = min(per, count - s)
        cut = [k * m // n for k in range(n + 1)]
        half = c % 2
        ins = [w.area(k, half, False).view(dtype) for k in range(n)]
        mine = ins[r]
        for k in range(n):
            if k != r:
                mine[cut[k]:cut[k + 1]] = flat[s + cut[k]:s + cut[k + 1]]
        barrier()
        if not c:
            error = _heads_differ(w, pg, call)
            if error is not None:
                barrier()  # no rank writes its head again until every rank has read them
                signature.forget_last(pg)  # every rank raises here: no later check reports it
                raise error
        lo, hi = cut[r], cut[r + 1]
        terms = [flat[s + lo:s + hi] if k == r else ins[k][lo:hi] for k in range(n)]
        acc = w.area(r, half, True).view(dtype)[lo:hi]
        np.add(terms[0], terms[1], out=acc)
        for t in terms[2:]:
            np.add(acc, t, out=acc)
        flat[s + lo:s + hi] = acc
        barrier()
        for k in range(n):
            if k != r:
                flat[s + cut[k]:s + cut[k + 1]] = w.area(k, half, True).view(dtype)[cut[k]:cut[k + 1]]


def _heads_differ(w: Window, pg: ProcessGroup, call: Any) -> ValueError | None:
    """After the first barrier, every rank reads every head: all find the error or none does."""
    heads = [tuple(w.views[k][:HEAD].view(np.int64)[:2].tolist()) for k in range(pg._size)]
    if all(h == heads[0] for h in heads):
        return None
    names = {np.dtype(t).num: np.dtype(t).name for t in set(np.sctypeDict.values())}
    return errors.value_error(call, "the ranks passed arrays of different sizes or dtypes: " + ", ".join(
        f"rank {pg.ranks[k]}: {h[0]} x {names.get(h[1], h[1])}" for k, h in enumerate(heads)))
