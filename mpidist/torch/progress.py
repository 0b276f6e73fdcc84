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

Work on a group whose members all run on this node (its bell mask, :mod:`mpidist.core.bell`)
takes part in the node's bell, as mpidist's blocking waits do: it counts as a wait from its
submission to its completion (the submission rings), and the thread spends its pauses asleep on
the bell, where a peer's arrival wakes it at once; it spins only while every member is in a
wait (for the spin a blocking wait of those bytes would make, :func:`mpidist.core.waiting.spin_for`).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from typing import Any, Callable, Sequence

from ..core import bell, errors
from ..core.waiting import Backoff, poll, spin_for, spin_on
from ..core.work import Work as MpiWork

#: First and longest pause between two tests of the pending requests (seconds).
FIRST_PAUSE = float(os.environ.get("MPIDIST_TORCH_POLL_MIN", "20e-6"))
MAX_PAUSE = float(os.environ.get("MPIDIST_TORCH_POLL_MAX", "500e-6"))
#: Polls after a submission or a completion that yield the core (``sched_yield``) instead of
#: sleeping, as the bounded wait's first tests do (:data:`mpidist.core.timeouts.QUICK_TESTS`):
#: few, since the thread runs beside backward's compute.
QUICK_POLLS = 8
#: Work pending for longer than this (seconds) is checked against its group's timeout and for
#: peers' notices at each poll; younger work is only tested.
CHECK_AFTER = 0.05


class Pending:
    """One torch-level operation: its mpidist works and the torch future to complete."""

    __slots__ = ("works", "future", "value", "call", "done", "error", "event", "on_done", "start",
                 "bell", "ticket", "spin", "alone", "on_bell")

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
        #: the bell mask of its one group (0: none, or works on several groups)
        self.bell = self.works[0].bell if self.works else 0
        if self.bell and any(w.bell != self.bell for w in self.works):
            self.bell = 0
        #: the bell's ticket of its last call (0: none, or a point-to-point call)
        self.ticket = self.works[-1].ticket if self.bell else 0
        self.spin = self.alone = -1.0  # the spins for its bytes (spin_of), worked out when first asked
        self.on_bell = False  # a thread waits for it asleep on the bell (Engine.wait)

    def spin_of(self) -> tuple[float, float]:
        """How long a wait for it spins while every member waits
        (:func:`~mpidist.core.waiting.spin_for`), and while one does not
        (:func:`~mpidist.core.bell.alone_for`), for its bytes."""
        if self.spin < 0:
            nbytes = sum(w.nbytes for w in self.works)
            self.spin, self.alone = spin_for(nbytes), bell.alone_for(nbytes)
        return self.spin, self.alone

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
        if self.on_bell:
            bell.ring()
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
        self._submitted = 0  # submissions so far: news for the thread asleep on the bell
        self._napping = False  # the thread sleeps on the bell, not on the condition

    def submit(self, p: Pending) -> None:
        if p.bell:
            bell.enter(p.ticket)  # counts this rank in until the work completes (poll() leaves), and rings
        with self._cv:
            self._pending.append(p)
            self._submitted += 1
            self._cv.notify()
            if self._thread is None:
                self._stop = False
                self._thread = threading.Thread(target=self._run, name="mpidist-torch-progress",
                                                daemon=True)
                self._thread.start()
        if not p.bell and self._napping:
            bell.ring()  # the thread sleeps on the bell, not on the condition

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
                for p in finished:
                    if p.bell:
                        bell.leave()
        finally:
            self._poll_lock.release()
        for p in finished:
            p.settle()
        return len(finished)

    def _run(self) -> None:
        pause = FIRST_PAUSE
        quick = 0  # polls since the last submission or completion, each followed by a yield
        spin_until = 0.0  # on the bell: spin while every member waits, until then
        state = None  # on the bell: what the naps have seen of the group since then
        while True:
            with self._cv:
                while not self._pending and not self._stop:
                    self._cv.wait()
                    pause, quick = FIRST_PAUSE, 0
                if self._stop:
                    return
                mask, spin, gone = self._bell()
            if quick == 0:
                spin_until = time.monotonic() + spin
                state = bell.watch() if mask else None
            if self.poll():
                pause, quick = FIRST_PAUSE, 0
                continue
            if quick < QUICK_POLLS:
                # as the bounded wait: a small call completes within microseconds of its submission
                quick += 1
                os.sched_yield()
                continue
            if mask:
                state = state if state is not None else bell.watch()
                seen = self._nap(mask, pause, spin_until, gone, state)
                if seen is None:  # news: a submission or a completion
                    pause, quick = FIRST_PAUSE, 0
                elif seen == bell.RANG:  # a member arrived: test, and spin again while all wait
                    pause, quick = FIRST_PAUSE, 0
                else:
                    pause = min(pause * 2, MAX_PAUSE)
                continue
            with self._cv:
                if self._pending and not self._stop:
                    # a submission notifies and cuts the pause short
                    if self._cv.wait(pause):
                        pause, quick = FIRST_PAUSE, 0
                    else:
                        pause = min(pause * 2, MAX_PAUSE)

    def _bell(self) -> tuple[int, float, float]:
        """The pending work's bell mask (every member of each group; 0 where any has none), the
        longest spin among them while every member waits, and the longest once each member has
        arrived (:func:`mpidist.core.bell.alone_for` their bytes). Under the condition's lock."""
        mask, spin, gone = 0, 0.0, 0.0
        for p in self._pending:
            if not p.bell:
                return 0, 0.0, 0.0
            mask |= p.bell
            s, g = p.spin_of()
            spin, gone = max(spin, s), max(gone, g)
        return mask, spin, gone

    def _news(self) -> Callable[[], bool]:
        """A test for news since now: a submission, or work that finished (polled)."""
        submitted = self._submitted
        return lambda: self._submitted != submitted or self.poll() > 0

    def _nap(self, mask: int, pause: float, spin_until: float, gone: float,
             state: bytearray) -> int | None:
        """One pause on the bell (:func:`mpidist.core.bell.nap`, seeing the group with ``state``;
        the work of several groups goes by whom it has seen, without a ticket): ``None`` on news (a
        submission, or work finished), else :data:`~mpidist.core.bell.RANG`, or ``SLEPT`` (also
        after a spin)."""
        news = self._news()
        self._napping = True
        try:
            seen = bell.nap(news, pause, mask, time.monotonic() < spin_until, state, 0, gone)
        finally:
            self._napping = False
        if seen == bell.SPIN:
            return None if spin_on(news, spin_until, mask, gone, 0, state) else bell.SLEPT
        return seen

    def wait(self, p: Pending, timeout: float | None = None) -> None:
        """Block until ``p`` is settled, helping with the polling; raise its error.

        The group's timeout is enforced by :meth:`poll` for every pending operation, waited on
        or not (DDP waits on futures). An explicit ``timeout`` is this rank's own: past it a
        ``RuntimeError`` says so and the work stays waitable.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if p.bell and not p.done:
            # as a blocking wait: asleep on the bell, and whoever wakes first completes the work
            # (handing it over from the progress thread would cost a wake-up more)
            p.on_bell = True

            def done() -> bool:
                if not p.done:
                    self.poll()
                return p.done

            spin, gone = p.spin_of()
            if not poll(done, deadline, Backoff(bell_mask=p.bell, respin=spin, gone=gone, ticket=p.ticket)):
                raise errors.runtime_error(
                    p.call, f"timed out after {timeout:.3g} s waiting for the operation to complete")
        pause = FIRST_PAUSE
        while not p.done:
            self.poll()
            if p.done:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise errors.runtime_error(
                    p.call, f"timed out after {timeout:.3g} s waiting for the operation to complete"
                )
            p.event.wait(pause)
            pause = min(pause * 2, MAX_PAUSE)
        if p.error is not None:
            raise p.error

    def stop(self) -> None:
        """End the progress thread (at exit, before mpi4py finalises MPI)."""
        with self._cv:
            self._stop = True
            self._cv.notify()
            if self._napping:
                bell.ring()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)


engine = Engine()
atexit.register(engine.stop)
