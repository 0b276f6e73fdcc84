"""Work: the handle an ``async_op=True`` call returns — MPI request(s) plus a completion step.

``wait()`` completes the requests and then runs the call's post-steps (AVG's divide,
copies out of a staging buffer, unpickling) exactly once. The group's timeout bounds the
wait (:func:`mpidist.core.timeouts.wait`: polling with a backoff, never spinning a core that an
oversubscribed peer needs); past it the wait raises and the group is broken.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Sequence

from mpi4py import MPI

from . import errors, timeouts
from .groups import ProcessGroup
from .registry import define
from .waiting import nbytes_of, seconds, tester


def _done_already() -> bool:
    return True


class Work:
    """A pending operation. ``wait()`` blocks until it is done and returns ``True``.

    ``is_completed()`` tests without blocking, ``exception()`` gives the error a failed
    completion raised, ``result()`` the output arrays, ``get_future()`` a :class:`Future`.
    """

    __slots__ = ("_reqs", "_post", "_output", "_call", "_pg", "_done", "_exc",
                 "_statuses", "_keep", "_test", "limit")

    def __init__(self, reqs: Sequence[MPI.Request], call: Any, post: Callable[[], None] | None,
                 output: Any, pg: ProcessGroup, keep: Any = None,
                 statuses: list[MPI.Status] | None = None) -> None:
        self._reqs = list(reqs)
        self._post = post
        self._output = output
        self._call = call
        self._pg = pg
        self._done = False
        self._exc: BaseException | None = None
        self._statuses = statuses
        self._keep = keep  # buffers MPI is still reading or writing
        self._test = tester(self._reqs, statuses)
        #: The group's timeout for this work (``barrier(timeout=)``); ``None``: the group's own.
        self.limit: float | None = None

    def _finish(self) -> None:
        self._done = True
        self._reqs = []
        self._keep = None
        self._test = _done_already
        post, self._post = self._post, None
        if post is not None:
            try:
                post()
            except BaseException as exc:
                self._exc = exc
                raise

    def expired(self, start: float, keep: Any) -> BaseException | None:
        """The error to hand on once this work's group timeout has passed since ``start``
        (or a peer gave up); see :func:`mpidist.core.timeouts.expired`. For the torch backend,
        whose works a progress thread completes."""
        return timeouts.expired(self._pg, self._call, keep, start)

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers it still moves (what sets its wait's spin)."""
        return nbytes_of(self._keep)

    def is_completed(self) -> bool:
        """``True`` once the operation is done (``MPI_Test``/``MPI_Testall``; runs the post-step)."""
        try:
            if not self._done and self._test():
                self._finish()
        except MPI.Exception as exc:
            self._exc = timeouts.failure(self._pg, self._call, exc, (self._reqs, self._keep), self._statuses)
            raise self._exc from None
        return self._done

    def is_success(self) -> bool:
        return self.is_completed() and self._exc is None

    @define("Work.wait", group_arg="", hooked=False)
    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Block until done, within the group's timeout or this ``timeout``.

        Past the group's, :class:`~mpidist.core.timeouts.GroupTimeoutError` (a ``RuntimeError``) is
        raised on every rank that waits and the group is broken; past an explicit
        ``timeout``, a ``RuntimeError`` on this rank, and the work can be waited on again.
        """
        if self._exc is not None:
            raise self._exc
        if not self._done:
            try:
                timeouts.wait(self._reqs, self._pg, self._call, self._keep, self._statuses,
                              seconds(timeout) if timeout is not None else None, self.limit)
            except timeouts.GroupTimeoutError as exc:
                self._exc = exc
                raise
            self._finish()
        return True

    def synchronize(self) -> None:
        self.wait()

    def exception(self) -> BaseException | None:
        return self._exc

    def result(self) -> list[Any]:
        """The output arrays (waits first), as torch's ``Work.result()``."""
        self.wait()
        out = self._output
        if out is None:
            return []
        return list(out) if isinstance(out, (list, tuple)) else [out]

    def source_rank(self) -> int:
        """For an ``irecv`` from any source: the sender's rank in the group."""
        self.wait()
        if not self._statuses:
            raise errors.runtime_error(self._call, "source_rank() is only defined for irecv")
        return self._statuses[0].Get_source()

    def get_future(self) -> Future:
        """A :class:`Future` completed by this work; its value is :meth:`result`."""
        return Future(self)

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        return f"<mpidist.Work {self._call} {state}>"


class Future:
    """torch.futures-style future over a :class:`Work` (or a chain of ``then`` callbacks).

    Without a progress thread, callbacks run when the future is waited on or polled
    (``done()``), in the calling thread.
    """

    __slots__ = ("_work", "_parent", "_fn", "_value", "_has_value", "_callbacks")

    def __init__(self, work: Work | None = None, parent: Future | None = None,
                 fn: Callable[[Future], Any] | None = None) -> None:
        self._work = work
        self._parent = parent
        self._fn = fn
        self._value: Any = None
        self._has_value = False
        self._callbacks: list[Callable[[Future], Any]] = []

    def _complete(self) -> None:
        if self._work is not None:
            self._value = self._work.result()
        else:
            assert self._parent is not None and self._fn is not None
            self._parent.wait()
            self._value = self._fn(self._parent)
        self._has_value = True
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)

    def done(self) -> bool:
        if self._has_value:
            return True
        ready = self._work.is_completed() if self._work is not None else self._parent.done()
        if ready:
            self._complete()
        return self._has_value

    def wait(self) -> Any:
        if not self._has_value:
            self._complete()
        return self._value

    def value(self) -> Any:
        return self.wait()

    def then(self, callback: Callable[[Future], Any]) -> Future:
        """A new future whose value is ``callback(self)`` once this one is done."""
        return Future(parent=self, fn=callback)

    def add_done_callback(self, callback: Callable[[Future], Any]) -> None:
        if self._has_value:
            callback(self)
        else:
            self._callbacks.append(callback)



def completed(call: Any, output: Any = None) -> Work:
    """A :class:`Work` that is already done (a call that finished before returning)."""
    w = Work((), call, None, output, None)  # type: ignore[arg-type]  # nothing left to wait for
    w._done = True
    return w
