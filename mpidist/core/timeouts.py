"""Group timeouts that raise: the bounded wait every call ends in, and the broken group.

MPI has no timeouts, and a blocking MPI routine cannot be interrupted. So a call on a
group of more than one rank starts the nonblocking ``I*`` routine (or a persistent request,
:mod:`mpidist.calls.persistent`) and waits here:
:func:`wait` tests the requests once (the common case ends there) and otherwise polls them,
backing off, until they complete or the group's ``timeout`` passes.

Past the deadline the rank gives up, and tells its peers: it sends a notice (its call, its
sequence number on the group and "gave up") on the tag :mod:`mpidist.core.tags` reserves for
it, then listens for a short grace period. In a group of up to :data:`DIRECT_UP_TO` ranks the
notice goes straight to every peer (n - 1 messages, one hop). In a larger one it goes to the
``ceil(log2 n)`` ranks ``r + 1, r + 2, r + 4, ...`` (mod n) of the group and carries what its
sender has heard of other ranks; each rank passes on, to the same neighbours, what it learns
that it did not know, so every rank hears of every other one that gave up within
``ceil(log2 n)`` hops, along many paths: a rank that never answers cuts none of them short,
and the ranks still unheard of half-way through the grace period are asked directly. A peer that is
waiting in a call on the same group sees the notice in its own polling loop, gives up too
and sends its own notice, so every rank that waits raises within about the grace period of
the first (a rank listens on while news new to it still comes, up to :data:`MOST_GRACES`
grace periods), and each names the ranks it did not hear of -- the ones that never reached a
call on the group, or that cannot be reached -- with their hosts. The group is then broken:
its communicator is set aside (an abandoned collective cannot be cancelled) and every later
call on it raises at once. The world and other groups keep working.

A rank that is not waiting in a bounded wait (a 16-bit reduction's own sequence of MPI
calls, or busy outside mpidist) answers no notice; the stall watch (:mod:`mpidist.checks.stall`)
is the fallback there, aborting the job past the timeout.
"""

from __future__ import annotations

import os
import time
import zlib
from typing import Any, Callable, Sequence

import numpy as np
from mpi4py import MPI

from . import bell, errors, faults, groups, registry
from .groups import ProcessGroup
from .reports import call_id, report
from .tags import NOTICE
from .waiting import SPIN, TESTS_PER_YIELD, Backoff, longest_for, nbytes_of, poll, seconds, spin_for, spin_on

GAVE_UP, WAITING = 1, 2  # what a notice says of its sender: it gave up, or it answers one that did
_NOTICE_LEN = 5  # sequence number, call id, state, seconds waited (milliseconds), group token
#: A notice message: the group token and its kind (news, or an ask for the receiver's notice),
#: then one entry per rank it tells of (group rank, then the first four fields of the notice).
_HEAD, _ENTRY = 2, 5
_NEWS, _ASK = 0, 1
#: What the last give-up of this process sent: ``messages`` (point-to-point sends) and ``entries``
#: (ranks' notices they carried, summed over the sends), for ``benchmarks/scale.py``.
LAST_GIVE_UP: dict[str, int] = {"messages": 0, "entries": 0}
#: Groups of up to this many ranks send a give-up's notice straight to every peer (n - 1 messages);
#: larger ones use :func:`neighbours`, whose O(log² n) are the fewer from about here (docs/benchmarks.md).
DIRECT_UP_TO = 64
#: A rank that gave up listens until a grace period after the last news new to it (ranks slow to be
#: scheduled are still heard of), at most this many grace periods in all.
MOST_GRACES = 4
#: Rate-limited news messages after the first waves; later news waits for the last message.
LATE_NEWS = 8
_yield = os.sched_yield
#: Tests before the polling loop (a call on ranks that arrive together completes within microseconds),
#: in runs of :data:`~mpidist.core.waiting.TESTS_PER_YIELD`, each followed by ``sched_yield`` so that a
#: peer sharing this core runs, as ``MPI_Wait`` does (docs/benchmarks.md, "Where ranks share cores").
QUICK_TESTS = 32

#: Called with the report each time a wait gives up, by owner (the flight recorder writes its ring
#: there); checks register themselves, so that this module needs nothing above the core.
GIVE_UP_LISTENERS: dict[str, Callable[[str], Any]] = {}


class GroupTimeoutError(RuntimeError):
    """A call on a group did not complete within the group's timeout (the group is now broken)."""


def grace(limit: float | None) -> float:
    """Seconds a rank that gave up listens for its peers' notices."""
    return min(max(0.1 * (limit or 0.0), 0.5), 5.0)


def wait(reqs: Sequence[MPI.Request], pg: ProcessGroup, call: Any, keep: Any = None,
         statuses: list[MPI.Status] | None = None, timeout: float | None = None,
         seq: int | None = None, limit: float | None = None) -> None:
    """Complete ``reqs`` of ``call`` on ``pg`` within the group's timeout (or ``limit``, this
    call's own in its place: ``barrier(timeout=)``).

    Raises :class:`GroupTimeoutError` on every waiting rank past the deadline, or once a peer
    has given up on the group; ``keep`` (the buffers of the abandoned requests) stays
    referenced by the broken group. An explicit ``timeout`` (``Work.wait(timeout)``) is this
    rank's own: past it a ``RuntimeError`` says so and the requests stay pending. ``seq``: the
    call's number on the group (default: the last one started), for the bell's ticket.
    """
    test = tester(reqs, statuses)
    mask = pg.bell  # the group's members all on this node: the wait spins only while all wait
    ticket = arrive(pg, call, seq) if mask else 0
    try:
        for _ in range(QUICK_TESTS // TESTS_PER_YIELD):
            for _ in range(TESTS_PER_YIELD):
                if test():
                    return
            _yield()
        # then the spin on the bare test: a peer's notice is looked for only once it has passed
        # (within milliseconds, where the timeout is seconds), since the look costs more than a
        # test and ranks that share cores pay for every instruction between two of them
        # (docs/benchmarks.md, "Where ranks share cores")
        if timeout is not None:
            limit = timeout
        elif limit is None:
            limit = seconds(pg.timeout)
        start = time.monotonic()
        nbytes = nbytes_of(keep)
        end = start + spin_for(nbytes)
        end = end if limit is None else min(end, start + limit)
        if mask:
            bell.enter(ticket)
        try:
            if spin_on(test, end, mask, bell.alone_for(nbytes), ticket):
                return
            until(test, pg, call, (reqs, keep), timeout, statuses, 0.0, start, bool(mask), ticket, limit)
        finally:
            if mask:
                bell.leave()
    except MPI.Exception as exc:
        raise failure(pg, call, exc, (reqs, keep), statuses) from None


def wait_pending(handle: int, pg: ProcessGroup, call: Any, keep: Any) -> None:
    """Go on with :func:`wait` for the request ``handle`` that a C call
    (:mod:`mpidist.calls.native`) left pending after its quick tests and its spin, which are
    :func:`wait`'s own (it counted itself in the group's bell, if any, as a wait): the bounded
    wait's polling loop, from where the spin ended."""
    req = MPI.Request.fromhandle(handle)
    try:
        until(req.Test, pg, call, ((req,), keep), None, None, 0.0,
              time.monotonic() - spin_for(nbytes_of(keep)), bool(pg.bell),
              bell.ticket(pg.bell, pg.seq) if pg.bell else 0)
    finally:
        if pg.bell:
            bell.leave()


def arrive(pg: ProcessGroup, call: Any, seq: int | None = None) -> int:
    """The bell's ticket of ``call`` on ``pg`` (number ``seq``, default the last started),
    published as this rank's (:func:`mpidist.core.bell.arrive`); 0 for a call that is not a
    collective of the group (point to point), whose waits go by whom they have seen."""
    if not registry.collective(call):
        return 0
    return bell.arrive(pg.bell, pg.seq if seq is None else seq)


def tester(reqs: Sequence[MPI.Request], statuses: list[MPI.Status] | None = None
           ) -> Callable[[], bool]:
    """The cheapest test of ``reqs`` (``True`` once all are complete, ``statuses`` filled):
    ``MPI_Test`` for the one request most calls have, which costs less than ``MPI_Testall`` over
    a list of one; the difference decides how fast ranks that share a core hand it on."""
    if len(reqs) == 1 and (statuses is None or len(statuses) == 1):
        req = reqs[0]
        if statuses is None:
            return req.Test
        status = statuses[0]
        return lambda: req.Test(status)
    return lambda: MPI.Request.Testall(reqs, statuses)


def failure(pg: ProcessGroup, call: Any, exc: MPI.Exception, keep: Any,
            statuses: Sequence[MPI.Status] | None = None) -> BaseException:
    """What to raise for an MPI error in ``call`` on ``pg``: :class:`~mpidist.core.faults.ProcessFailureError`
    for a dead member (under ULFM; the group is then broken), else mpidist's error for it
    (:func:`mpidist.core.errors.from_mpi`: a truncated message, a bad count), never the raw
    ``mpi4py.MPI.Exception``."""
    if not faults.is_failure(exc, pg.comm):
        return errors.from_mpi(exc, call, pg, statuses)
    return faults.fail(pg, call, exc, keep, grace(seconds(pg.timeout)))


def until(ready: Callable[[], bool], pg: ProcessGroup, call: Any, keep: Any = None,
          timeout: float | None = None, statuses: list[MPI.Status] | None = None,
          spin: float = SPIN, start: float | None = None, counted: bool = False, ticket: int = 0,
          limit: float | None = None) -> None:
    """Poll ``ready()`` until it is true, bounded as :func:`wait` (which it serves).

    Also for what is not a request: a receive that must first probe for its message's size.
    An MPI error ``ready()`` raises becomes mpidist's (:func:`failure`). ``start``: when the
    wait began (the deadline counts from there), if before this call. ``counted``: the caller
    counted the wait in the group's bell (:mod:`mpidist.core.bell`), so it sleeps there, for the
    call of ``ticket`` (:func:`arrive`). ``limit``: the group's timeout for this call, if not the group's.
    """
    if timeout is not None:
        limit = timeout
    elif limit is None:
        limit = seconds(pg.timeout)
    start = time.monotonic() if start is None else start
    deadline = None if limit is None else start + limit
    comm = pg.comm
    heard: dict[int, np.ndarray] = {}
    asked: set[int] = set()
    nbytes = nbytes_of(keep)
    backoff = Backoff(longest=longest_for(nbytes), spin=spin, bell_mask=pg.bell if counted else 0,
                      respin=spin_for(nbytes), gone=bell.alone_for(nbytes), ticket=ticket)

    tests = [0]

    def finished() -> bool:
        if ready():
            return True
        tests[0] += 1
        if tests[0] % 64 == 1 and comm.Iprobe(MPI.ANY_SOURCE, NOTICE):  # a peer gave up?
            _take_notices(comm, heard, _token(pg), asked)
            return bool(heard)
        return False

    try:
        if poll(finished, deadline, backoff) and not heard:
            return
    except MPI.Exception as exc:
        raise failure(pg, call, exc, keep, statuses) from None
    if timeout is not None and not heard:
        raise errors.runtime_error(
            call, f"timed out after {timeout:.3g} s waiting for the operation to complete")
    _give_up(pg, call, keep, limit, time.monotonic() - start, heard, asked)


def expired(pg: ProcessGroup, call: Any, keep: Any, start: float) -> GroupTimeoutError | None:
    """For work that a thread of its own polls (the torch backend's): ``None`` while ``pg``'s
    timeout has not passed since ``start`` and no peer gave up on it; else the error to hand on,
    after giving up as :func:`wait` does (the peers told, the group broken)."""
    if pg.broken is not None:
        return faults.broken(pg, call) or GroupTimeoutError(
            errors.message(call, f"process group {pg.group_name!r} is broken: {pg.broken}"))
    heard: dict[int, np.ndarray] = {}
    asked: set[int] = set()
    try:
        if pg.comm.Iprobe(MPI.ANY_SOURCE, NOTICE):
            _take_notices(pg.comm, heard, _token(pg), asked)
    except MPI.Exception as exc:
        return failure(pg, call, exc, keep)
    limit = seconds(pg.timeout)
    waited = time.monotonic() - start
    if not heard and (limit is None or waited < limit):
        return None
    try:
        _give_up(pg, call, keep, limit, waited, heard, asked)
    except GroupTimeoutError as exc:
        return exc
    return None  # unreachable: _give_up raises


def _token(pg: ProcessGroup) -> int:
    """What a notice says of its group, the same on every member: MPI reuses a freed
    communicator's context for a new one, and a notice still in flight from a group given up on
    would otherwise be taken as given up on the new group (seen at 4 ranks in the suite)."""
    return zlib.crc32(f"{groups.registry.generation}/{pg.group_name}/{pg.ranks}".encode()) & 0x7FFFFFFF


def _take_notices(comm: MPI.Intracomm, heard: dict[int, np.ndarray], token: int,
                  asked: set[int] | None = None) -> int:
    """Receive every notice message that has arrived and note each rank it tells of (group
    rank -> its notice, as :data:`_NOTICE_LEN`); drop stale ones (another group's token).
    The senders of asks go into ``asked``. Returns how many ranks were new."""
    status = MPI.Status()
    me, new = comm.Get_rank(), 0
    while comm.Iprobe(MPI.ANY_SOURCE, NOTICE, status):
        msg = np.zeros(status.Get_count(MPI.INT64_T), np.int64)
        comm.Recv([msg, MPI.INT64_T], status.Get_source(), NOTICE)
        if msg.size < _HEAD + _ENTRY or msg[0] != token:
            continue
        if msg[1] == _ASK and asked is not None:
            asked.add(status.Get_source())
        for e in msg[_HEAD:].reshape(-1, _ENTRY):
            if int(e[0]) not in heard and e[0] != me:
                heard[int(e[0])] = np.array([e[1], e[2], e[3], e[4], token], np.int64)
                new += 1
    return new


def neighbours(me: int, n: int) -> list[int]:
    """The group ranks a notice goes to from ``me``: ``me + 2**j`` (mod ``n``) for ``2**j < n``.

    Every rank is within ``ceil(log2 n)`` hops of every other, along several paths, so one rank
    that is not listening holds back no news but its own (``tests/core/test_notices.py``)."""
    return [(me + (1 << j)) % n for j in range(max(n - 1, 0).bit_length())]


class _Notices:
    """One rank's side of the give-up exchange: what it has heard, what it has passed on.

    Up to :data:`DIRECT_UP_TO` ranks, the rank's own notice goes once to every peer and nothing
    is passed on or asked: every peer that listens tells this rank itself (n - 1 messages).
    Above it:

    - News goes to :func:`neighbours`: at once for the first ``len(neighbours) + 1`` messages
      (the waves in which it spreads), then at most once per eighth of the grace period, at most
      :data:`LATE_NEWS` times, and whatever is left when the rank stops listening.
    - Half-way through the grace period the rank asks each peer it has not heard of, directly;
      a peer that is listening answers with its own notice. Where silent ranks cut every path
      from a peer, that peer is still heard of, so a report names exactly the ranks that did
      not answer.

    Messages a rank sends there: at most ``L * min(n, L + 12)`` notices (``L = ceil(log2 n)``), plus
    one ask per peer it had not heard of by then and one answer per peer that asked it --
    O(log² n) where a few ranks are silent, however many give up at however many moments.
    """

    def __init__(self, pg: ProcessGroup, heard: dict[int, np.ndarray], asked: set[int],
                 own: np.ndarray, grace_s: float) -> None:
        self.comm, self.token = pg.comm, int(own[4])
        self.me = pg._rank
        self.peers = [r for r in range(pg._size) if r != self.me]
        self.direct = pg._size <= DIRECT_UP_TO
        self.to = self.peers if self.direct else neighbours(self.me, pg._size)
        self.heard, self.asked, self.answered = heard, asked, set()
        self.told: set[int] = set()  # ranks already passed on to the neighbours
        self.sends: list[MPI.Request] = []
        self.sent: list[np.ndarray] = []  # the messages, alive until MPI has sent them
        self.own = own
        self.entries = 0
        self.at_once = len(self.to) + 1
        self.news = 0  # messages of news sent (each to every neighbour)
        self.every = grace_s / 8
        self.next_at = 0.0
        now = time.monotonic()
        self.grace, self.most = grace_s, now + MOST_GRACES * grace_s
        self.until = now + grace_s  # moved on by news new to this rank, up to ``most``
        # told directly, every listening peer has told this rank directly: nobody to ask
        self.ask_at: float | None = None if self.direct else now + grace_s / 2

    def _send(self, kind: int, entries: list[tuple[int, np.ndarray]], to: list[int]) -> None:
        msg = np.empty(_HEAD + _ENTRY * len(entries), np.int64)
        msg[0], msg[1] = self.token, kind
        for i, (r, m) in enumerate(entries):
            msg[_HEAD + _ENTRY * i:_HEAD + _ENTRY * (i + 1)] = (r, m[0], m[1], m[2], m[3])
        self.entries += len(entries) * len(to)
        self.sent.append(msg)
        # one buffer for every destination: MPI only reads a send's buffer
        self.sends += [self.comm.Isend([msg, MPI.INT64_T], r, NOTICE) for r in to]

    def tell(self, now: bool = False) -> None:
        """Send the neighbours one message with every rank heard of and not yet passed on
        (unless the message rate says wait, and ``now`` does not override it)."""
        if len(self.told) == len(self.heard) + 1 or (self.direct and self.told):
            return  # nothing new (own notice told first), or every peer told directly
        if not now and self.news >= self.at_once and (
                time.monotonic() < self.next_at or self.news >= self.at_once + LATE_NEWS):
            return  # the rest waits for the last message, however long the rank listens on
        new = [(self.me, self.own)] if self.me not in self.told else []
        new += [(r, m) for r, m in sorted(self.heard.items()) if r not in self.told]
        self.told.update(r for r, _ in new)
        self.news += 1
        if self.news >= self.at_once:
            self.next_at = time.monotonic() + self.every
        self._send(_NEWS, new, self.to)

    def step(self) -> bool:
        """Take what has arrived, pass on what is new, answer and ask; ``True`` once every peer
        is heard of, or the listening is over (:data:`MOST_GRACES`)."""
        now = time.monotonic()
        if self.comm.Iprobe(MPI.ANY_SOURCE, NOTICE) and _take_notices(
                self.comm, self.heard, self.token, self.asked):
            # news still coming: its senders' peers may be slow, not gone; listen (and hold the
            # asks) a while longer
            self.until = min(self.most, now + self.grace)
            if self.ask_at is not None:
                self.ask_at = max(self.ask_at, min(now, self.most - self.grace) + self.grace / 2)
        if self.asked - self.answered:
            self._send(_NEWS, [(self.me, self.own)], sorted(self.asked - self.answered))
            self.answered |= self.asked
        done = all(r in self.heard for r in self.peers)
        if not done and self.ask_at is not None and now >= self.ask_at:
            self.ask_at = None
            self._send(_ASK, [(self.me, self.own)], [r for r in self.peers if r not in self.heard])
        over = done or now >= self.until
        self.tell(now=over)  # a rank that stops listening passes on all it knows first
        return over


def _give_up(pg: ProcessGroup, call: Any, keep: Any, limit: float | None, waited: float,
             heard: dict[int, np.ndarray], asked: set[int]) -> None:
    first = dict(heard)  # notices that arrived before this rank's own deadline
    notice = np.array([pg.seq, call_id(call), GAVE_UP, int(waited * 1000), _token(pg)], np.int64)
    ex = _Notices(pg, heard, asked, notice, grace(limit))
    ex.tell(now=True)
    poll(ex.step, ex.most)
    ex.step()
    ex.tell(now=True)
    for req in ex.sends:
        req.Free()  # a peer that never listens never takes it: let MPI finish it alone
    LAST_GIVE_UP.update(messages=len(ex.sends), entries=ex.entries)
    groups.break_group(pg, (keep, notice, ex.sent))
    text = report(pg, call, limit, waited, heard, first)
    for listener in list(GIVE_UP_LISTENERS.values()):
        listener(f"timeout: {text}")
    raise GroupTimeoutError(errors.message(call, text))
