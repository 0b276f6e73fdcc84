"""One thread at a time on a group: the error a second thread gets.

The generated call entry (:mod:`mpidist.core.registry`) holds a group's lock for the length of a
call; a thread that finds it held by another gets :class:`ConcurrentCallError` from :func:`busy`.
"""

from __future__ import annotations

import threading
from typing import Any

from . import errors


class ConcurrentCallError(RuntimeError):
    """A thread entered a call on a group while another thread of this process was in a call on it.

    MPI matches a communicator's collectives by the order each rank makes them; two threads that
    share a group make them in an order no rank controls, so mpidist lets one thread at a time use
    a group. Give each thread its own group (``new_group`` over the same ranks).
    """


def busy(pg: Any, call: Any) -> None:
    """Raise :class:`ConcurrentCallError` for ``call`` on ``pg``, which another thread holds."""
    held, ident = pg.holder or ("a call", 0)
    other = {t.ident: t.name for t in threading.enumerate()}.get(ident, f"thread {ident}")
    raise ConcurrentCallError(errors.message(
        str(call), f"group {pg.group_name!r} is in {held} on thread {other!r}, and thread "
        f"{threading.current_thread().name!r} entered {call} on it: a group serves one thread at a "
        "time, since MPI matches its collectives by the order each rank makes them; give each thread "
        "its own group (new_group over the same ranks)"))
