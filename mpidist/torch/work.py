"""The torch ``Work`` that mpidist's process group returns, and its self-completing future.

A :class:`Work` wraps either a finished operation (the blocking path: its future is
already set) or a :class:`~mpidist.torch.progress.Pending` one that the progress thread
completes, so ``get_future()`` works for DDP, which waits on the future from C++.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as tdist

from ..core.waiting import seconds
from ..core.work import Work as MpiWork
from .progress import Pending, engine


class Work(tdist.Work):
    """A torch ``Work`` over mpidist work: ``wait``, ``is_completed``, ``get_future``, ``result``."""

    # finished work (:func:`done`, every blocking call) sets only ``_value``
    _future: torch.futures.Future | None = None
    _pending: Pending | None = None
    _timeout: float | None = None
    _source: Callable[[], int] | None = None

    def __init__(self, future: torch.futures.Future | None, pending: Pending | None = None,
                 timeout: float | None = None, source: Callable[[], int] | None = None,
                 value: Any = None) -> None:
        super().__init__()
        self._future = future
        self._value = value
        self._pending = pending
        self._timeout = timeout
        self._source = source

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until done, within the group's timeout (0 or ``None``) or this rank's ``timeout``.

        Past the group's, :class:`mpidist.GroupTimeoutError` on every waiting rank (see
        :meth:`.progress.Engine.wait`); past ``timeout``, a ``RuntimeError`` here only.
        """
        p = self._pending
        if p is None:
            return True
        if not p.done:
            engine.wait(p, seconds(timeout) if timeout else None)
        elif p.error is not None:
            raise p.error
        fut = self._future
        if not fut.done():  # the progress thread marks the work done just before it sets the future
            fut.wait()
        return True

    def synchronize(self) -> None:
        self.wait()

    def is_completed(self) -> bool:
        p = self._pending
        if p is None:
            return True
        if not p.done:
            engine.poll()
        return p.done and self._future.done()

    def is_success(self) -> bool:
        return self.is_completed() and (self._pending is None or self._pending.error is None)

    def exception(self) -> BaseException | None:
        return None if self._pending is None else self._pending.error

    def get_future(self) -> torch.futures.Future:
        if self._future is None:  # finished work: made on demand, most callers never ask
            self._future = torch.futures.Future()
            self._future.set_result(self._value)
        return self._future

    def result(self) -> list[torch.Tensor]:
        self.wait()
        value = self.get_future().value()
        return list(value) if isinstance(value, (list, tuple)) else [value]

    def _source_rank(self) -> int:
        self.wait()
        if self._source is None:
            raise RuntimeError("source_rank() is only defined for a recv from any source")
        return self._source()

    def source_rank(self) -> int:
        return self._source_rank()


class _Done(Work):
    """Finished work: the class defaults but ``_value``."""

    def __init__(self, value: Any) -> None:
        tdist.Work.__init__(self)
        self._value = value


def done(value: Any) -> Work:
    """A finished :class:`Work` whose future holds ``value``."""
    return _Done(value)


def pending(works: Sequence[MpiWork], value: Any, call: str, timeout: float | None,
            on_done: Callable[[], None] | None = None,
            source: Callable[[], int] | None = None) -> Work:
    """A :class:`Work` over started mpidist ``works``, completed by the progress thread."""
    fut: torch.futures.Future = torch.futures.Future()
    p = Pending(works, fut, value, call, on_done)
    engine.submit(p)
    return Work(fut.then(_value), p, timeout, source)


def _value(fut: torch.futures.Future) -> Any:
    """The value, or the error raised: a Python future's ``set_exception`` is a result that
    raises only in Python; raised in a ``then`` callback it becomes the future's C++ error,
    which DDP's reducer, waiting in C++, raises (it read the exception as a tensor list)."""
    return fut.value()
