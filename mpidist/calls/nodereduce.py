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

Ranks whose arrays fall on either side of :data:`MIN_BYTES` (or differ in dtype or op, or pass
``async_op=True``, or make another call) take different paths to one call: the ones here would
wait in their window's barriers, the others in MPI, neither ever completing, and MPI may match
the two paths' calls with each other (Open MPI 5 then wrote a peer's array past the agreement's
buffer below: a segfault). So a rank here first marks the call in its line of the node's bell
(:func:`mpidist.core.bell.mark`: the group's token and the call's number) and makes no MPI call
until every member has marked it (a bounded wait on shared memory). A wait of a call on the
group that has lasted :data:`mpidist.core.timeouts.CROSS_AFTER` looks at its peers' lines
(:data:`mpidist.core.timeouts.CROSSING`): seeing a call marked by a peer that it made by
another path, it marks it too, as crossed, and raises; the ranks here see that mark and raise
too, and tell every peer (:func:`mpidist.core.notices.tell_all`). Each names every rank's array
and path in the same ``ValueError``, and the group is broken (an MPI call cannot be taken
back). The agreement and the heads carry the call's key as a second line of defence.

:func:`mpidist.all_reduce` (and so the torch backend's blocking calls) comes here for SUM, AVG
and PREMUL_SUM of numeric arrays (kinds :data:`KINDS`) of at least :data:`MIN_BYTES`, on groups
of two or more ranks that share the node's bell (:mod:`mpidist.core.bell`: MPI says they share a
node, and the bell is on); the group's segment is made at its first such call, once the ranks
agree (in a bounded wait) that ``/dev/shm`` has room for it. ``MPIDIST_NODE_REDUCE=0`` sends
every all_reduce to MPI.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..checks import signature
from ..core import bell, errors, groups, notices, segments, timeouts
from ..core.groups import ProcessGroup
from ..core.reports import call_id, call_name
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
#: The largest int64, from which the ranks' agreement subtracts their call's key (see window()).
TOP = (1 << 63) - 1
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
    state = bell.state(2)
    if state.startswith("off"):  # the segment's ranks meet on the bell before any MPI call
        return f"through MPI (the node's bell is {state})"
    return (f"from {MIN_BYTES >> 20} MiB on groups within one node, in a shared /dev/shm segment "
            f"({_room() >> 20} MiB free there)")


def takes(arr: np.ndarray, op: MPI.Op) -> bool:
    """Whether this path sums ``arr`` (at least :data:`MIN_BYTES`, checked by the caller) with ``op``."""
    return ON and op is MPI.SUM and arr.dtype.kind in KINDS


class Window:
    """One group's shared memory (:func:`mpidist.core.segments.map_on_node`): per rank a head and
    two halves of *in* and *out* areas."""

    __slots__ = ("seg", "chunk", "views", "last", "__weakref__")

    def __init__(self, seg: Any, ranks: int, chunk: int) -> None:
        self.seg, self.chunk = seg, chunk
        self.last = 0  # the last call (its number on the group) this rank summed here
        whole = np.frombuffer(seg, np.uint8)
        per = HEAD + 4 * chunk
        self.views = [whole[k * per:(k + 1) * per] for k in range(ranks)]

    def area(self, rank: int, half: int, out: bool) -> np.ndarray:
        start = HEAD + (2 * half + out) * self.chunk
        return self.views[rank][start:start + self.chunk]


#: group -> its windows, or None where its ranks do not share a node (or /dev/shm has no room)
_windows: weakref.WeakKeyDictionary[ProcessGroup, Window | None] = weakref.WeakKeyDictionary()
#: group -> its token (:func:`mpidist.core.notices.group_token`), for :func:`call_key`
_tokens: weakref.WeakKeyDictionary[ProcessGroup, int] = weakref.WeakKeyDictionary()
#: ``.key``: the call this thread sums here now (0: none)
_here = threading.local()


def call_key(pg: ProcessGroup, seq: int) -> int:
    """Call number ``seq`` of ``pg``, as one int64 that no other group's call shares (but by a
    31-bit hash's chance): the group's token, then the number."""
    token = _tokens.get(pg)
    if token is None:
        token = _tokens[pg] = notices.group_token(pg)
    return token << 32 | (seq & 0xFFFFFFFF)


def window(pg: ProcessGroup, call: Any, key: int) -> Window | None:
    """The group's windows, made at its first large call (collective then, as that call is).

    The ranks first agree, in a bounded wait (so that a rank that never comes makes the others
    raise as in any call), on the chunk (the largest any rank chose: each rank reads its own
    cores, and the window's layout must be the same on all) and that ``/dev/shm`` has room for
    the segment twice over (a container's is often 64 MiB), and check that all came with this
    call's ``key`` (MPI matches any two reductions); then they map it."""
    try:
        return _windows[pg]
    except KeyError:
        pass
    # the node's ranks, not only the group's, compete for its cores
    chunk = CHUNK if bell.ranks_per_core(max(pg._size, bell.local_size)) == 1 else CHUNK_SHARED
    # MIN: the least room, the largest chunk, and the call's key where every rank passed it: each
    # half of it below the largest int64 and the complement below it too, so that no other value
    # leaves them as they are but one whose every word is almost the largest (a NaN's high bits)
    lo, hi = key & 0xFFFFFFFF, key >> 32
    said = [TOP - lo, TOP - (0xFFFFFFFF - lo), TOP - hi, TOP - (0xFFFFFFFF - hi)]
    agreed = np.array([_room(), -chunk, *said], np.int64)
    w = None
    try:
        native.finish(NotImplemented, lambda: pg.comm.Iallreduce(MPI.IN_PLACE, agreed, MPI.MIN), pg, call,
                      agreed)
        if agreed[2:].tolist() != said:  # a rank at another call, which MPI matched with this one
            raise crossed(pg, call, key, agreed)
        chunk = -int(agreed[1])
        size = pg._size * (HEAD + 4 * chunk)
        if agreed[0] >= 2 * size:
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
    if not pg.bell or (pg in _windows and _windows[pg] is None):
        return False
    key = call_key(pg, pg.seq)
    bell.mark(bell.SEG, key, arr.size, _info(arr.dtype, call))
    bell.ring()  # a peer asleep in its arrival below
    _here.key = key
    try:
        # no MPI call until every member has come here: one that came to this call by another
        # path would have MPI match its call with this rank's, and some MPIs then write its data
        # past this rank's buffers (Open MPI 5: a segfault); its wait marks the call crossed
        timeouts.wait_for(lambda: bell.all_marked(pg.bell, key), pg, call, arr)
        w = window(pg, call, key)
        if w is None:
            return False
        _sum(w, arr, pg, call, key)
    finally:
        _here.key = 0
    return True


def _sum(w: Window, arr: np.ndarray, pg: ProcessGroup, call: Any, key: int) -> None:
    w.last = key & 0xFFFFFFFF
    head = w.views[pg._rank][:HEAD].view(np.int64)
    head[0], head[1], head[2] = arr.size, arr.dtype.num, key
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
        _chunks(w, pg, call, flat, per, barrier, key)


def _chunks(w: Window, pg: ProcessGroup, call: Any, flat: np.ndarray, per: int,
            barrier: Callable[[], None], key: int) -> None:
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
            error = _heads_differ(w, pg, call, key, flat)
            if error is not None:
                if pg.broken is None:  # every rank is here: none writes its head again until all read them
                    barrier()
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


def _heads_differ(w: Window, pg: ProcessGroup, call: Any, key: int, flat: np.ndarray) -> ValueError | None:
    """After the first barrier, every rank reads every head: all find the error or none does
    (but a head of another call: that rank is not here, and MPI matched its call with the barrier)."""
    heads = [tuple(w.views[k][:HEAD].view(np.int64)[:3].tolist()) for k in range(pg._size)]
    if any(h[2] != key for h in heads):
        return crossed(pg, call, key, flat)
    if all(h == heads[0] for h in heads):
        return None
    names = {np.dtype(t).num: np.dtype(t).name for t in set(np.sctypeDict.values())}
    return errors.value_error(call, "the ranks passed arrays of different sizes or dtypes: " + ", ".join(
        f"rank {pg.ranks[k]}: {h[0]} x {names.get(h[1], h[1])}" for k, h in enumerate(heads)))


def _info(dtype: np.dtype, call: Any) -> int:
    """What a rank's bell line says of its array's dtype and its call, beside the count."""
    return dtype.num | call_id(call) << 16


def _what(pg: ProcessGroup, call: Any) -> tuple[int, int]:
    """``(count, dtype number)`` that this rank passed to ``call``, its last on ``pg``, as the
    group's record of calls has it (:mod:`mpidist.checks.signature`); ``(0, 0xFFFF)``: unknown."""
    sigs = getattr(pg.signatures, "sigs", None)
    sig = sigs[-1] if sigs else ()
    if len(sig) > 2 and sig[0] == getattr(call, "name", call) and isinstance(sig[1], int):
        try:
            return sig[1], np.dtype(sig[2]).num
        except TypeError:
            pass
    return 0, 0xFFFF


def crossing(pg: ProcessGroup, call: Any, seq: int, keep: Any, told: bool) -> ValueError | None:
    """:data:`mpidist.core.timeouts.CROSSING`: in a wait for call ``seq`` of ``pg``, whether the
    group's ranks took different paths to it or to an earlier call (see the module), as the error
    to raise; ``told``: a peer found they did, at call ``seq``."""
    key = call_key(pg, seq)
    if told:
        if getattr(_here, "key", 0) != key:  # its MPI call completed, as MPI matched it
            bell.mark(bell.CROSSED, key, 0, 0xFFFF)
        return crossed(pg, call, key, keep, tell=False)
    seen = bell.marks(pg.bell, key >> 32)
    if getattr(_here, "key", 0) == key:  # this rank sums the call here: has a peer crossed?
        if any(word == bell.CROSSED and k == key for _, word, k, _, _ in seen):
            return crossed(pg, call, key, keep)
        return None
    w = _windows.get(pg, False)
    if w is None:  # this group sums nothing here
        return None
    last = w.last if w else 0  # the last call this rank summed here
    for _, word, k, _, _ in seen:
        at = k & 0xFFFFFFFF
        if word == bell.SEG and last < at <= seq:  # a peer sums call `at` here; this rank made it otherwise
            count, num = _what(pg, call) if at == seq else (0, 0xFFFF)
            bell.mark(bell.CROSSED, k, count, num | (call_id(call) if at == seq else 0) << 16)
            return crossed(pg, call, k, keep)
    return None


def crossed(pg: ProcessGroup, call: Any, key: int, keep: Any, tell: bool = True) -> ValueError:
    """The error for ranks that took different paths to the call of ``key``, which breaks ``pg``;
    ``tell``: first tell every peer (:func:`mpidist.core.notices.tell_all`), so that one whose MPI
    call completed all the same (MPI matched it with this rank's) raises at its next wait."""
    ranks = bell.global_ranks(pg.ranks)
    names = {np.dtype(t).num: np.dtype(t).name for t in set(np.sctypeDict.values())}
    said = {}
    for i, word, k, count, info in sorted(bell.marks(pg.bell, key >> 32), key=lambda m: -m[1]):
        if k == key and i in ranks:  # a rank's SEG mark, if any, says more than its CROSSED one
            what = f"{count} x {names[info & 0xFFFF]} " if info & 0xFFFF in names else ""
            said[ranks[i]] = (f"{what}in {call_name(info >> 16)}, summed in the node's shared memory"
                              if word == bell.SEG else f"{what}in {call_name(info >> 16)}, through MPI"
                              if info >> 16 else "went on past it through MPI")
    other = "not seen at this call yet (another call, or an array of another size, dtype or op)"
    parts = [f"rank {r}: {said.get(r, other)}" for r in pg.ranks]
    seq = key & 0xFFFFFFFF
    if tell:
        keep = (keep, notices.tell_all(pg, np.array([seq, call_id(call), notices.CROSSED, 0, key >> 32])))
    groups.break_group(pg, keep, f"its ranks took different paths to call #{seq}")
    return errors.value_error(call, (
        f"all_reduce #{seq} on group {pg.group_name!r}: the ranks took different paths to this call "
        f"(a blocking sum of {MIN_BYTES >> 20} MiB or more is summed in the node's shared memory; a "
        "smaller array, another dtype or op, async_op=True or another call goes through MPI): "
        f"{'; '.join(parts)}; the group is now broken: later calls on it raise at once"))


timeouts.CROSSING = crossing
