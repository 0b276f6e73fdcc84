"""Time: timeouts as seconds, and the one backoff every waiting loop in mpidist uses.

A rank that waits for a peer must not spin a core the peer may need (ranks are often
oversubscribed), yet should notice completion quickly: :class:`Backoff` sleeps for a pause
that starts short and doubles up to a ceiling, and every loop that polls MPI (the bounded
waits of :mod:`mpidist.timeouts`, ``monitored_barrier``, the exit watch) takes its pauses
from it. A wait for a call's own completion first yields the core between tests for a while
(``spin``): MPI makes progress on a nonblocking collective only while it is tested, and a
sleep between the steps of a large message would cost more than the message itself.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta
from typing import Any, Callable

#: The first and the longest pause of a :class:`Backoff`, in seconds.
FIRST_PAUSE = 20e-6
LONGEST_PAUSE = 1e-3
#: How long a wait for a call's completion tests back to back, yielding the core in between,
#: before it starts to sleep (seconds): as long as MPI's own blocking calls would poll, for the
#: waits that end soon; the ones that do not (a late peer) then cost no CPU.
SPIN = 0.5
#: The first part of that spin polls without even yielding, as MPI's blocking calls do.
BUSY = 100e-6


def seconds(timeout: Any) -> float | None:
    """A timeout (``timedelta``, seconds, or ``None``) as float seconds."""
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return float(timeout)


class Backoff:
    """Sleeps of growing length: ``first``, doubling up to ``longest``; :meth:`reset` starts over.

    For the first ``spin`` seconds it does not sleep: it returns at once (the first
    :data:`BUSY` seconds), then yields the core (``sched_yield``).
    """

    __slots__ = ("first", "longest", "pause", "spin_until", "busy_until")

    def __init__(self, first: float = FIRST_PAUSE, longest: float = LONGEST_PAUSE,
                 spin: float = 0.0) -> None:
        self.first = first
        self.longest = longest
        self.pause = first
        now = time.monotonic()
        self.spin_until = now + spin if spin else 0.0
        self.busy_until = now + min(spin, BUSY) if spin else 0.0

    def reset(self) -> None:
        self.pause = self.first

    def sleep(self, deadline: float | None = None) -> bool:
        """Sleep the next pause (never past ``deadline``); ``False`` once the deadline has passed."""
        now = time.monotonic()
        if now < self.spin_until and (deadline is None or now < deadline):
            if now >= self.busy_until:
                os.sched_yield()
            return True
        if deadline is not None:
            if now >= deadline:
                return False
            time.sleep(min(self.pause, deadline - now))
        else:
            time.sleep(self.pause)
        self.pause = min(self.pause * 2, self.longest)
        return True


#: Threads now waiting in :func:`poll` under a deadline: the stall watch leaves them alone.
bounded_waits: set[int] = set()


def poll(done: Callable[[], bool], deadline: float | None,
         backoff: Backoff | None = None) -> bool:
    """Call ``done()`` until it is true (``True``) or ``deadline`` passes (``False``), backing off."""
    if done():
        return True
    b = backoff or Backoff()
    me = threading.get_ident()
    if deadline is not None:
        bounded_waits.add(me)
    try:
        while not done():
            if not b.sleep(deadline):
                return done()
        return True
    finally:
        bounded_waits.discard(me)


def deadline(timeout: float | None) -> float | None:
    """The monotonic time ``timeout`` seconds from now (``None``: no deadline)."""
    return None if timeout is None else time.monotonic() + timeout
