"""Group timeouts that raise: the bounded wait every call ends in, and the broken group.

MPI has no timeouts, and a blocking MPI routine cannot be interrupted. So a call on a
group of more than one rank starts the nonblocking ``I*`` routine (or a persistent request,
:mod:`mpidist.calls.persistent`) and waits here:
:func:`wait` tests the requests once (the common case ends there) and otherwise polls them,
backing off, until they complete or the group's ``timeout`` passes.

Past the deadline the rank gives up, and tells its peers: it sends a notice (its call, its
sequence number on the group and "gave up") to every other rank of the group, on the tag
:mod:`mpidist.core.tags` reserves for it, then listens for a short grace period. A peer that is
waiting in a call on the same group sees the notice in its own polling loop, gives up too
and sends its own notice, so every rank that waits raises within about the grace period of
the first, and each names the ranks it did not hear from -- the ones that never reached a
call on the group, or that cannot be reached -- with their hosts. The group is then broken:
its communicator is set aside (an abandoned collective cannot be cancelled) and every later
call on it raises at once. The world and other groups keep working.

A rank that is not waiting in a bounded wait (a 16-bit reduction's own sequence of MPI
calls, or busy outside mpidist) answers no notice; the stall watch (:mod:`mpidist.checks.stall`)
is the fallback there, aborting the job past the timeout.
"""

from __future__ import annotations

import functools
import os
import time
import zlib
from typing import Any, Callable, Sequence

import numpy as np
from mpi4py import MPI

from . import errors, faults, groups, ranklists, registry
from .groups import ProcessGroup
from .tags import NOTICE
from .waiting import SPIN, TESTS_PER_YIELD, Backoff, nbytes_of, poll, seconds, spin_for, spin_on

#: What a notice says of its sender: it gave up waiting, or it answers one that did.
GAVE_UP, WAITING = 1, 2
_NOTICE_LEN = 5  # sequence number, call id, state, seconds waited (milliseconds), group token
_yield = os.sched_yield
#: Tests before the polling loop: a call on ranks that arrive together completes within a few
#: microseconds, less than the loop costs to set up. They run in runs of
#: :data:`~mpidist.core.waiting.TESTS_PER_YIELD`, each run followed by ``sched_yield``, which lets
#: a peer that shares this core (or torch's threads) run, as ``MPI_Wait`` does between its polls
#: (docs/benchmarks.md, "Where ranks share cores").
QUICK_TESTS = 32


#: Called with the report each time a wait gives up, by owner: the flight recorder
#: (:mod:`mpidist.checks.flight`) writes its ring there. A check registers itself here, so
#: that this module needs nothing above the core.
GIVE_UP_LISTENERS: dict[str, Callable[[str], Any]] = {}


class GroupTimeoutError(RuntimeError):
    """A call on a group did not complete within the group's timeout (the group is now broken)."""


def _call_id(call: Any) -> int:
    return zlib.crc32(str(call).encode()) & 0x7FFFFFFF


@functools.lru_cache(maxsize=64)
def _call_name(cid: int) -> str:
    for name in registry.REGISTRY:
        if _call_id(name) == cid:
            return name
    return f"call {cid}"


def grace(limit: float | None) -> float:
    """Seconds a rank that gave up listens for its peers' notices."""
    return min(max(0.1 * (limit or 0.0), 0.5), 5.0)


def wait(reqs: Sequence[MPI.Request], pg: ProcessGroup, call: Any, keep: Any = None,
         statuses: list[MPI.Status] | None = None, timeout: float | None = None) -> None:
    """Complete ``reqs`` of ``call`` on ``pg`` within the group's timeout.

    Raises :class:`GroupTimeoutError` on every waiting rank past the deadline, or once a peer
    has given up on the group; ``keep`` (the buffers of the abandoned requests) stays
    referenced by the broken group. An explicit ``timeout`` (``Work.wait(timeout)``) is this
    rank's own: past it a ``RuntimeError`` says so and the requests stay pending.
    """
    test = tester(reqs, statuses)
    try:
        for _ in range(QUICK_TESTS // TESTS_PER_YIELD):
            for _ in range(TESTS_PER_YIELD):
                if test():
                    return
            _yield()
        # then the spin on the bare test: a peer's notice is looked for only once it has passed
        # (within milliseconds, where the timeout is seconds), since the look costs more than a
        # test and ranks that share cores pay for every instruction between two of them
        # (8 B all_reduce on 2 cores: 2.37-2.58x raw MPI_Allreduce at 16 ranks with the look,
        # 1.99-2.20x without; docs/benchmarks.md, "Where ranks share cores")
        limit = seconds(pg.timeout) if timeout is None else timeout
        start = time.monotonic()
        end = start + spin_for(nbytes_of(keep))
        if spin_on(test, end if limit is None else min(end, start + limit)):
            return
    except MPI.Exception as exc:
        raise failure(pg, call, exc, (reqs, keep), statuses) from None
    until(test, pg, call, (reqs, keep), timeout, statuses, 0.0, start)


def wait_pending(handle: int, pg: ProcessGroup, call: Any, keep: Any) -> None:
    """Go on with :func:`wait` for the request ``handle`` that a C call
    (:mod:`mpidist.calls.native`) left pending after its quick tests and its spin, which are
    :func:`wait`'s own: the bounded wait's polling loop, from where the spin ended."""
    req = MPI.Request.fromhandle(handle)
    until(req.Test, pg, call, ((req,), keep), None, None, 0.0,
          time.monotonic() - spin_for(nbytes_of(keep)))


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
          spin: float = SPIN, start: float | None = None) -> None:
    """Poll ``ready()`` until it is true, bounded as :func:`wait` (which it serves).

    Also for what is not a request: a receive that must first probe for its message's size.
    An MPI error ``ready()`` raises becomes mpidist's (:func:`failure`). ``start``: when the
    wait began (the deadline counts from there), if before this call.
    """
    limit = seconds(pg.timeout) if timeout is None else timeout
    start = time.monotonic() if start is None else start
    deadline = None if limit is None else start + limit
    comm = pg.comm
    heard: dict[int, np.ndarray] = {}
    backoff = Backoff(spin=spin)

    tests = [0]

    def finished() -> bool:
        if ready():
            return True
        tests[0] += 1
        if tests[0] % 64 == 1 and comm.Iprobe(MPI.ANY_SOURCE, NOTICE):  # a peer gave up?
            _take_notices(comm, heard, _token(pg))
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
    _give_up(pg, call, keep, limit, time.monotonic() - start, heard)


def expired(pg: ProcessGroup, call: Any, keep: Any, start: float) -> GroupTimeoutError | None:
    """For work that a thread of its own polls (the torch backend's): ``None`` while ``pg``'s
    timeout has not passed since ``start`` and no peer gave up on it; else the error to hand on,
    after giving up as :func:`wait` does (the peers told, the group broken)."""
    if pg.broken is not None:
        return faults.broken(pg, call) or GroupTimeoutError(
            errors.message(call, f"process group {pg.group_name!r} is broken: {pg.broken}"))
    heard: dict[int, np.ndarray] = {}
    try:
        if pg.comm.Iprobe(MPI.ANY_SOURCE, NOTICE):
            _take_notices(pg.comm, heard, _token(pg))
    except MPI.Exception as exc:
        return failure(pg, call, exc, keep)
    limit = seconds(pg.timeout)
    waited = time.monotonic() - start
    if not heard and (limit is None or waited < limit):
        return None
    try:
        _give_up(pg, call, keep, limit, waited, heard)
    except GroupTimeoutError as exc:
        return exc
    return None  # unreachable: _give_up raises


def _token(pg: ProcessGroup) -> int:
    """What a notice says of its group, the same on every member: MPI reuses a freed
    communicator's context for a new one, and a notice still in flight from a group given up on
    would otherwise be taken as given up on the new group (seen at 4 ranks in the suite)."""
    return zlib.crc32(f"{groups.registry.generation}/{pg.group_name}/{pg.ranks}".encode()) & 0x7FFFFFFF


def _take_notices(comm: MPI.Intracomm, heard: dict[int, np.ndarray], token: int) -> None:
    """Receive every notice that has arrived (group rank -> its notice); drop stale ones."""
    status = MPI.Status()
    while comm.Iprobe(MPI.ANY_SOURCE, NOTICE, status):
        msg = np.zeros(_NOTICE_LEN, np.int64)
        comm.Recv([msg, MPI.INT64_T], status.Get_source(), NOTICE)
        if msg[4] == token:
            heard[status.Get_source()] = msg


def _give_up(pg: ProcessGroup, call: Any, keep: Any, limit: float | None, waited: float,
             heard: dict[int, np.ndarray]) -> None:
    comm = pg.comm
    me = pg._rank
    peers = [r for r in range(pg._size) if r != me]
    first = dict(heard)  # notices that arrived before this rank's own deadline
    notice = np.array([pg.seq, _call_id(call), GAVE_UP, int(waited * 1000), _token(pg)], np.int64)
    sends = [comm.Isend([notice, MPI.INT64_T], r, NOTICE) for r in peers]
    end = time.monotonic() + grace(limit)
    token = _token(pg)
    poll(lambda: _collect(comm, heard, peers, token), end)
    _collect(comm, heard, peers, token)
    for req in sends:
        req.Free()  # a peer that never listens never takes it: let MPI finish it alone
    groups.break_group(pg, (keep, notice))
    text = _report(pg, call, limit, waited, heard, first)
    for listener in list(GIVE_UP_LISTENERS.values()):
        listener(f"timeout: {text}")
    raise GroupTimeoutError(errors.message(call, text))


def _collect(comm: MPI.Intracomm, heard: dict[int, np.ndarray], peers: list[int], token: int) -> bool:
    if comm.Iprobe(MPI.ANY_SOURCE, NOTICE):
        _take_notices(comm, heard, token)
    return all(r in heard for r in peers)


def _limit(limit: float | None) -> str:
    return "none" if limit is None else f"{limit:g} s"


def _report(pg: ProcessGroup, call: Any, limit: float | None, waited: float,
            heard: dict[int, np.ndarray], first: dict[int, np.ndarray]) -> str:
    silent = [pg.ranks[r] for r in range(pg._size) if r != pg._rank and r not in heard]
    where = f"{call} #{pg.seq} on group {pg.group_name!r} (global ranks {ranklists.ranges(pg.ranks)})"
    if first and (limit is None or waited < limit):
        r, msg = min(first.items())
        why = (f"{where}: Timed out after {waited:.3g} s here, since rank {pg.ranks[r]} gave up on "
               f"{_call_name(int(msg[1]))} #{msg[0]} after {msg[3] / 1000:g} s (the group's timeout "
               f"is {_limit(limit)})")
    else:
        why = f"{where}: Timed out after {waited:.3g} s (the group's timeout is {_limit(limit)})"
    parts = [why]
    if silent:
        parts.append(f"not heard from rank{'s' if len(silent) > 1 else ''} "
                     f"{ranklists.by_host(silent, groups.registry.hosts)}: not in a call on this "
                     "group, or cut off from this rank")
    calls: dict[tuple[int, int], list[int]] = {}  # (call id, sequence number) -> global ranks
    for r, m in heard.items():
        calls.setdefault((int(m[1]), int(m[0])), []).append(pg.ranks[r])
    if calls:
        parts.append("heard from " + ", ".join(
            f"{ranklists.plural(rs)} ({_call_name(cid)} #{seq})"
            for (cid, seq), rs in sorted(calls.items(), key=lambda kv: min(kv[1]))[:ranklists.MOST_HOSTS]))
    parts.append("the group is now broken: later calls on it raise at once")
    return "; ".join(parts)
