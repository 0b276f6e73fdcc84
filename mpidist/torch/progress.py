"""Completion of nonblocking torch work: one progress thread that tests pending MPI requests.

DDP waits on ``work.get_future()`` from C++, so a torch future must complete without
anybody calling ``wait()``. One daemon thread per process tests the pending mpidist
works (``MPI_Testall`` through ``mpidist.Work.is_completed``) with a sleep that starts
short and doubles while nothing finishes, so it never spins a core of an oversubscribed
machine; a new submission wakes it at once. Threads that wait on a work take part in
the polling (whoever holds the poll lock tests), and futures are completed outside that
lock so a callback may itself wait on other work. A ``wait()`` is bounded by the group's
timeout as mpidist's own calls are (:mod:`mpidist.timeouts`).
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any, Callable, Sequence

from ..waiting import Backoff, poll
from ..work import Work as MpiWork

#: First and longest pause between two tests of the pending requests (seconds).
FIRST_PAUSE = float(os.environ.get("MPIDIST_TORCH_POLL_MIN", "20e-6"))
MAX_PAUSE = float(os.environ.get("MPIDIST_TORCH_POLL_MAX", "500e-6"))


class Pending:
    """One torch-level operation: its mpidist works and the torch future to complete."""

    __slots__ = ("works", "future", "value", "call", "done", "error", "event", "on_done")

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

    def settle(self) -> None:
        """Complete the torch future (outside the poll lock: callbacks may wait on work)."""
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

    def poll(self) -> bool:
        """Test every pending operation once; settle the finished ones. ``False`` if busy."""
        if not self._poll_lock.acquire(blocking=False):
            return False
        try:
            with self._cv:
                snapshot = list(self._pending)
            finished = [p for p in snapshot if p.test()]
            if finished:
                with self._cv:
                    self._pending = [p for p in self._pending if p not in finished]
        finally:
            self._poll_lock.release()
        for p in finished:
            p.settle()
        return True

    def _run(self) -> None:
        pause = FIRST_PAUSE
        while True:
            with self._cv:
                while not self._pending and not self._stop:
                    self._cv.wait()
                    pause = FIRST_PAUSE
                if self._stop:
                    return
            before = len(self._pending)
            self.poll()
            with self._cv:
                if len(self._pending) < before:
                    pause = FIRST_PAUSE
                elif self._pending and not self._stop:
                    # a submission notifies and cuts the pause short
                    if self._cv.wait(pause):
                        pause = FIRST_PAUSE
                    else:
                        pause = min(pause * 2, MAX_PAUSE)

    def wait(self, p: Pending, timeout: float | None = None) -> None:
        """Block until ``p`` is settled, helping with the polling; raise its error.

        Bounded as mpidist's own calls are (:func:`mpidist.timeouts.until`): past the group's
        timeout this rank tells its peers, the group is broken and
        :class:`~mpidist.timeouts.GroupTimeoutError` names the ranks not heard from; a peer's
        notice ends the wait at once. An explicit ``timeout`` is this rank's own: past it a
        ``RuntimeError`` says so and the work stays waitable.
        """
        def settled() -> bool:
            self.poll()
            return p.done

        if not settled():
            first = p.works[0] if p.works else None
            if first is not None:
                first.until(settled, p.works, timeout)
            else:  # tested complete by another thread, which settles it next
                poll(lambda: p.done, None, Backoff(longest=MAX_PAUSE))
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
