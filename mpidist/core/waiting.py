"""Time: timeouts as seconds, and the one backoff every waiting loop in mpidist uses.

A rank that waits for a peer must not spin a core the peer may need (ranks are often
oversubscribed), yet should notice completion quickly: :class:`Backoff` sleeps for a pause
that starts short and doubles up to a ceiling, and every loop that polls MPI (the bounded
waits of :mod:`mpidist.core.timeouts`, ``monitored_barrier``, the exit watch) takes its pauses
from it. A wait for a call's own completion first yields the core between tests for a while
(``spin``), as MPI's own blocking ``MPI_Wait`` does: MPI makes progress on a nonblocking
collective only while it is tested, a sleep between the steps of a large message would cost
more than the message itself, and a test that does not yield keeps a peer that shares the
core from running (see ``docs/benchmarks.md``, "Where ranks share cores").
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Sequence

from mpi4py import MPI

from . import errors

#: The first and the longest pause of a :class:`Backoff`, in seconds.
FIRST_PAUSE = 20e-6
LONGEST_PAUSE = 1e-3
#: How long a wait for a call's completion tests back to back, yielding the core in between,
#: before it starts to sleep (seconds): ``SPIN_LEAST``, plus ``SPIN_PER_BYTE`` for each byte the
#: call moves, up to ``SPIN_MOST``. MPI moves a message on one node only while it is tested, so a
#: large one needs the spin for as long as its bytes take; a wait longer than that is for a peer
#: still computing, which a spinning rank would take a share of the core from. ``SPIN``: the spin
#: of a wait that moves no bytes of its own (a probe for a message). The measurements behind these
#: are in docs/benchmarks.md, "Where ranks share cores".
SPIN = 0.01
SPIN_LEAST = 0.003
SPIN_PER_BYTE = 1 / 256e6  # 1 MiB: 7 ms; 16 MiB: 68 ms
SPIN_MOST = 1.0


#: Past its spin a wait for a call that moves more than this many bytes sleeps shorter pauses,
#: in proportion: a large message moves a few shared-memory cells per test, and one that its peers
#: left to move (they did their part and went on) would crawl at one test a pause.
PAUSE_BYTES = 256 << 10


def longest_for(nbytes: int) -> float:
    """The longest pause of a wait, past its spin, for a call that moves ``nbytes`` bytes."""
    if nbytes <= PAUSE_BYTES:
        return LONGEST_PAUSE
    return max(FIRST_PAUSE, LONGEST_PAUSE * PAUSE_BYTES / nbytes)


def spin_for(nbytes: int) -> float:
    """The spin before sleeping for a call that moves ``nbytes`` bytes."""
    return min(SPIN_MOST, SPIN_LEAST + nbytes * SPIN_PER_BYTE)


def nbytes_of(keep: Any, depth: int = 3) -> int:
    """Bytes of the buffers in ``keep`` (arrays, memoryviews, and lists or tuples of them)."""
    size = getattr(keep, "nbytes", None)
    if isinstance(size, int):
        return size
    if depth and isinstance(keep, (list, tuple)):
        return sum(nbytes_of(k, depth - 1) for k in keep)
    return 0


def seconds(timeout: Any) -> float | None:
    """A timeout (``timedelta``, seconds, or ``None``) as float seconds."""
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return float(timeout)


def positive_seconds(timeout: Any, call: Any) -> float:
    """A call's own ``timeout`` (``timedelta`` or seconds) as float seconds, refused unless positive."""
    if isinstance(timeout, bool) or not isinstance(timeout, (timedelta, int, float)):
        raise errors.type_error(call, f"timeout must be a timedelta or seconds, got {timeout!r}")
    limit = seconds(timeout)
    if not limit > 0:  # NaN too
        raise errors.value_error(call, f"timeout must be positive, got {timeout!r}")
    return limit


class Backoff:
    """Sleeps of growing length: ``first``, doubling up to ``longest``; :meth:`reset` starts over.

    ``spin``: seconds that :func:`poll` first tests back to back, yielding the core
    (``sched_yield``, which returns at once where no other thread waits for it) instead of sleeping.
    """

    __slots__ = ("first", "longest", "pause", "spin_until")

    def __init__(self, first: float = FIRST_PAUSE, longest: float = LONGEST_PAUSE,
                 spin: float = 0.0) -> None:
        self.first = first
        self.longest = longest
        self.pause = first
        self.spin_until = time.monotonic() + spin if spin else 0.0

    def reset(self) -> None:
        self.pause = self.first

    def grow(self) -> None:
        """The next pause: twice this one, up to ``longest`` (for a loop that sleeps its own way)."""
        self.pause = min(self.pause * 2, self.longest)

    def sleep(self, deadline: float | None = None) -> bool:
        """Sleep the next pause (never past ``deadline``); ``False`` once the deadline has passed."""
        now = time.monotonic()
        if deadline is not None:
            if now >= deadline:
                return False
            time.sleep(min(self.pause, deadline - now))
        else:
            time.sleep(self.pause)
        self.grow()
        return True


#: Threads now waiting in :func:`poll` under a deadline: the stall watch leaves them alone.
bounded_waits: set[int] = set()
#: Tests back to back between two yields of the core while a wait spins: one test per yield
#: hands the core on before a peer that shares it has anything to answer, and every yield is a
#: system call (docs/benchmarks.md, "Where ranks share cores").
TESTS_PER_YIELD = 4
#: Yields between two looks at the clock while :func:`poll` spins.
CLOCK_EVERY = 4


def spin_on(done: Callable[[], bool], end: float) -> bool:
    """Test ``done()``, yielding the core after every :data:`TESTS_PER_YIELD` tests, until it is
    true (``True``) or ``end`` passes (``False``)."""
    yield_ = os.sched_yield
    while True:
        for _ in range(CLOCK_EVERY):
            for _ in range(TESTS_PER_YIELD):
                if done():
                    return True
            yield_()
        if time.monotonic() >= end:
            return False


def poll(done: Callable[[], bool], deadline: float | None,
         backoff: Backoff | None = None) -> bool:
    """Call ``done()`` until it is true (``True``) or ``deadline`` passes (``False``): first
    yielding between tests for the backoff's ``spin``, then sleeping its pauses."""
    if done():
        return True
    b = backoff or Backoff()
    me = threading.get_ident()
    if deadline is not None:
        bounded_waits.add(me)
    try:
        if b.spin_until:
            if spin_on(done, b.spin_until if deadline is None else min(b.spin_until, deadline)):
                return True
        while not done():
            if not b.sleep(deadline):
                return done()
        return True
    finally:
        bounded_waits.discard(me)


def deadline(timeout: float | None) -> float | None:
    """The monotonic time ``timeout`` seconds from now (``None``: no deadline)."""
    return None if timeout is None else time.monotonic() + timeout


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
