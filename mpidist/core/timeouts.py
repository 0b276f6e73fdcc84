"""Group timeouts that raise: the bounded wait every call ends in, and the broken group.

MPI has no timeouts, and a blocking MPI routine cannot be interrupted. So a call on a
group of more than one rank starts the nonblocking ``I*`` routine and waits here:
:func:`wait` tests the requests once (the common case ends there) and otherwise polls them,
backing off, until they complete or the group's ``timeout`` passes.

Past the deadline the rank gives up, and tells its peers (:mod:`mpidist.core.notices`: straight
to every peer in a group of up to 64 ranks, through ``ceil(log2 n)`` neighbours that pass news
on in a larger one), then listens for a short grace period. A peer that is
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

import marshal
import os
import time
from typing import Any, Callable, Sequence

import numpy as np
from mpi4py import MPI

from . import errors, faults, groups, notices, waiting
from .groups import ProcessGroup
from .reports import call_id, report
from .tags import NOTICE
from .waiting import SPIN, TESTS_PER_YIELD, Backoff, longest_for, nbytes_of, poll, seconds, spin_for, spin_on

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
         limit: float | None = None) -> None:
    """Complete ``reqs`` of ``call`` on ``pg`` within the group's timeout (or ``limit``, this
    call's own in its place: ``barrier(timeout=)``).

    Raises :class:`GroupTimeoutError` on every waiting rank past the deadline, or once a peer
    has given up on the group; ``keep`` (the buffers of the abandoned requests) stays
    referenced by the broken group. An explicit ``timeout`` (``Work.wait(timeout)``) is this
    rank's own: past it a ``RuntimeError`` says so and the requests stay pending.
    """
    test = waiting.tester(reqs, statuses)
    try:
        for _ in range(QUICK_TESTS // TESTS_PER_YIELD):
            for _ in range(TESTS_PER_YIELD):
                if test():
                    return
            _yield()
        # then the spin on the bare test: a peer's notice is looked for only once it has passed
        # (within milliseconds, where the timeout is seconds), since the look costs more than a
        # test and ranks that share cores pay for every instruction between two of them
        if timeout is not None:
            limit = timeout
        elif limit is None:
            limit = seconds(pg.timeout)
        start = time.monotonic()
        end = start + spin_for(nbytes_of(keep))
        if spin_on(test, end if limit is None else min(end, start + limit)):
            return
        until(test, pg, call, (reqs, keep), timeout, statuses, 0.0, start, limit)
    except MPI.Exception as exc:
        raise failure(pg, call, exc, (reqs, keep), statuses) from None


def allgather(pg: ProcessGroup, call: Any, obj: Any) -> list[Any]:
    """Every rank's ``obj`` (ints, strings, None and tuples or lists of them; numpy's integers
    become Python's), in group rank order: ``MPI_Iallgather`` of the sizes, then
    ``MPI_Iallgatherv`` of the ``marshal`` bytes (no pickles: nothing a peer sends runs here),
    each in the bounded wait -- for a check that describes a disagreement, where a rank that is
    not in step must not hang the others."""
    data = np.frombuffer(marshal.dumps(_plain(obj)), np.uint8)
    sizes = np.zeros(pg._size, np.int64)
    wait((pg.comm.Iallgather([np.array([data.size], np.int64), MPI.INT64_T], [sizes, MPI.INT64_T]),),
         pg, call, sizes)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    out = np.empty(int(sizes.sum()), np.uint8)
    wait((pg.comm.Iallgatherv([data, MPI.BYTE], [out, (sizes, starts), MPI.BYTE]),), pg, call, (data, out))
    return [marshal.loads(out[a:a + n].tobytes()) for a, n in zip(starts.tolist(), sizes.tolist())]


def _plain(obj: Any) -> Any:
    if isinstance(obj, (list, tuple, np.ndarray)):
        return tuple(_plain(x) for x in obj)
    if isinstance(obj, np.generic):
        return obj.item()
    return obj if obj is None or isinstance(obj, (bool, int, float, str, bytes)) else repr(obj)


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
          spin: float = SPIN, start: float | None = None, limit: float | None = None) -> None:
    """Poll ``ready()`` until it is true, bounded as :func:`wait` (which it serves).

    Also for what is not a request: a receive that must first probe for its message's size.
    An MPI error ``ready()`` raises becomes mpidist's (:func:`failure`). ``start``: when the
    wait began (the deadline counts from there), if before this call. ``limit``: the group's
    timeout for this call, if not the group's.
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
    backoff = Backoff(longest=longest_for(nbytes_of(keep)), spin=spin)
    tests = [0]

    def finished() -> bool:
        if ready():
            return True
        tests[0] += 1
        if tests[0] % 64 == 1 and comm.Iprobe(MPI.ANY_SOURCE, NOTICE):  # a peer gave up?
            notices.take(comm, heard, notices.group_token(pg), asked)
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


def expired(pg: ProcessGroup, call: Any, keep: Any, start: float) -> BaseException | None:
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
            notices.take(pg.comm, heard, notices.group_token(pg), asked)
    except MPI.Exception as exc:
        return failure(pg, call, exc, keep)
    limit = seconds(pg.timeout)
    waited = time.monotonic() - start
    if not heard and (limit is None or waited < limit):
        return None
    try:
        _give_up(pg, call, keep, limit, waited, heard, asked)
    except (GroupTimeoutError, ValueError) as exc:
        return exc
    return None  # unreachable: _give_up raises


def _give_up(pg: ProcessGroup, call: Any, keep: Any, limit: float | None, waited: float,
             heard: dict[int, np.ndarray], asked: set[int]) -> None:
    first = dict(heard)  # notices that arrived before this rank's own deadline
    notice = np.array([pg.seq, call_id(call), notices.GAVE_UP, int(waited * 1000), notices.group_token(pg)],
                      np.int64)
    ex = notices.Exchange(pg, heard, asked, notice, grace(limit))
    ex.tell(now=True)
    poll(ex.step, ex.most)
    ex.step()
    ex.tell(now=True)
    for req in ex.sends:
        req.Free()  # a peer that never listens never takes it: let MPI finish it alone
    notices.LAST_GIVE_UP.update(messages=len(ex.sends), entries=ex.entries)
    groups.break_group(pg, (keep, notice, ex.sent))
    text = report(pg, call, limit, waited, heard, first)
    for listener in list(GIVE_UP_LISTENERS.values()):
        listener(f"timeout: {text}")
    raise GroupTimeoutError(errors.message(call, text))
