"""Completion of nonblocking torch work: one progress thread that tests pending MPI requests.

DDP waits on ``work.get_future()`` from C++, so a torch future must complete without anybody
calling ``wait()``. One daemon thread per process tests the pending mpidist works (``MPI_Testall``
through ``mpidist.Work.is_completed``): a few times yielding the core after each submission or
completion (a small call completes within microseconds), then with a sleep that starts short and
doubles while nothing finishes, so it never spins a core that backward's threads or an
oversubscribed peer need; a new submission wakes it at once. Threads that wait on a work take part
in the polling (whoever holds the poll lock tests), and futures are completed outside that lock so
a callback may itself wait on other work. Whoever polls also ends pending work past its group's
timeout, or on a peer's notice, as mpidist's own calls end
(:func:`mpidist.core.timeouts.expired`): the future gets the error, so DDP, which waits on futures
from C++, raises as under gloo.

The pauses are :class:`mpidist.core.waiting.Backoff`'s, as every other wait's.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from typing import Any, Callable, Sequence

from ..core import errors, settings
from ..core.waiting import Backoff
from ..core.work import Work as MpiWork

#: First and longest pause between two tests of the pending requests (seconds).
FIRST_PAUSE = settings.seconds("MPIDIST_TORCH_POLL_MIN") or 0.0  # declared with a default
MAX_PAUSE = settings.seconds("MPIDIST_TORCH_POLL_MAX") or 0.0
#: Polls after a submission or a completion that yield the core (``sched_yield``) instead of
#: sleeping, as the bounded wait's first tests do (:data:`mpidist.core.timeouts.QUICK_TESTS`):
#: few, since the thread runs beside backward's compute.
QUICK_POLLS = 8
#: Work pending for longer than this (seconds) is checked against its group's timeout and for
#: peers' notices at each poll; younger work is only tested.
CHECK_AFTER = 0.05


class Pending:
    """One torch-level operation: its mpidist works and the torch future to complete."""

    __slots__ = ("works", "future", "value", "call", "done", "error", "event", "on_done", "start")

    def __init__(self, works: Sequence[MpiWork], future: Any, value: Any, call: str,
                 on_done: Callable[[], None] | None = None) -> None:
        self.works = list(works)
        self.future = future
        self.value = value
        self.call = call
        self.done = False
        self.error: BaseException | None = None
        self.event = threading.Event()
        self.on_done = on_done
        self.start = time.monotonic()

    def test(self) -> bool:
        """``True`` once every request is complete (post-steps run here, exactly once)."""
        try:
            while self.works:
                if not self.works[0].is_completed():
                    return False
                self.works.pop(0)
            if self.on_done is not None:
                self.on_done()
        except BaseException as exc:  # noqa: BLE001 - handed to the future and to wait()
            self.error = exc
            self.works = []
        return True

    def expired(self) -> bool:
        """``True`` once the group's timeout has passed (or a peer gave up): then the error is
        :class:`~mpidist.core.timeouts.GroupTimeoutError`, the peers were told and the group is broken."""
        if not self.works or time.monotonic() - self.start < CHECK_AFTER:
            return False
        error = self.works[0].expired(self.start, self.works)
        if error is None:
            return False
        self.error, self.works = error, []
        return True

    def settle(self) -> None:
        """Complete the torch future (outside the poll lock: callbacks may wait on work).

        ``done`` is set first, so that a callback that waits on this very work returns; so a
        waiter can see ``done`` before the future is set, and :meth:`.work.Work.wait` waits
        for the future too."""
        self.done = True
        self.event.set()
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(self.value)


class Engine:
    """The pending list, the poll lock and the progress thread that drains them."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._poll_lock = threading.Lock()
        self._pending: list[Pending] = []
        self._thread: threading.Thread | None = None
        self._stop = False

    def submit(self, p: Pending) -> None:
        with self._cv:
            self._pending.append(p)
            self._cv.notify()
            if self._thread is None:
                self._stop = False
                self._thread = threading.Thread(target=self._run, name="mpidist-torch-progress",
                                                daemon=True)
                self._thread.start()

    def poll(self) -> int:
        """Test every pending operation once; settle the finished ones; how many (0 if busy)."""
        if not self._poll_lock.acquire(blocking=False):
            return 0
        try:
            with self._cv:
                snapshot = list(self._pending)
            finished = [p for p in snapshot if p.test() or p.expired()]
            if finished:
                with self._cv:
                    self._pending = [p for p in self._pending if p not in finished]
        finally:
            self._poll_lock.release()
        for p in finished:
            p.settle()
        return len(finished)

    def _run(self) -> None:
        backoff = Backoff(FIRST_PAUSE, MAX_PAUSE)
        quick = 0  # polls since the last submission or completion, each followed by a yield
        while True:
            with self._cv:
                while not self._pending and not self._stop:
                    self._cv.wait()
                    backoff.reset()
                    quick = 0
                if self._stop:
                    return
            if self.poll():
                backoff.reset()
                quick = 0
                continue
            if quick < QUICK_POLLS:
                # as the bounded wait: a small call completes within microseconds of its submission
                quick += 1
                os.sched_yield()
                continue
            with self._cv:
                if self._pending and not self._stop:
                    # a submission notifies and cuts the pause short
                    if self._cv.wait(backoff.pause):
                        backoff.reset()
                        quick = 0
                    else:
                        backoff.grow()

    def wait(self, p: Pending, timeout: float | None = None) -> None:
        """Block until ``p`` is settled, helping with the polling; raise its error.

        The group's timeout is enforced by :meth:`poll` for every pending operation, waited on
        or not (DDP waits on futures). An explicit ``timeout`` is this rank's own: past it a
        ``RuntimeError`` says so and the work stays waitable.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        backoff = Backoff(FIRST_PAUSE, MAX_PAUSE)
        while not p.done:
            self.poll()
            if p.done:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise errors.runtime_error(
                    p.call, f"timed out after {timeout:.3g} s waiting for the operation to complete"
                )
            p.event.wait(backoff.pause)
            backoff.grow()
        if p.error is not None:
            raise p.error

    def stop(self) -> None:
        """End the progress thread (at exit, before mpi4py finalises MPI)."""
        with self._cv:
            self._stop = True
            self._cv.notify()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)


engine = Engine()
atexit.register(engine.stop)
