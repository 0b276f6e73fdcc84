"""Fail fast: an uncaught exception on any rank aborts the whole MPI job.

MPI has no failure detection: when one rank dies with an exception while the others
wait in a collective, they wait forever. ``init_process_group`` installs a
``sys.excepthook`` (and ``threading.excepthook``) that prints ``[rank N]`` with the
traceback and calls ``MPI_Abort`` on ``MPI_COMM_WORLD``, so the launcher ends every
rank. Opt out with ``init_process_group(..., abort_on_error=False)`` or
``MPIDIST_ABORT_ON_ERROR=0``.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from types import TracebackType
from typing import Any

from mpi4py import MPI

_saved: dict[str, Any] = {}


def enabled_by_env() -> bool:
    return os.environ.get("MPIDIST_ABORT_ON_ERROR", "1").strip().lower() not in ("0", "false", "no", "off")


def abort(text: str, code: int = 1) -> None:
    """Print ``text`` to stderr with this rank's prefix, then ``MPI_Abort`` the world."""
    rank = MPI.COMM_WORLD.Get_rank()
    sys.stdout.flush()
    sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in text.rstrip("\n").split("\n")))
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(code)


def _report(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None,
            where: str) -> None:
    lines = "".join(traceback.format_exception(exc_type, exc, tb))
    abort(f"uncaught {exc_type.__name__} {where}; aborting the MPI job (MPI_Abort)\n{lines}")


def _excepthook(exc_type: type[BaseException], exc: BaseException,
                tb: TracebackType | None) -> None:
    _report(exc_type, exc, tb, "in the main thread")


def _thread_hook(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    _report(args.exc_type, args.exc_value, args.exc_traceback, f"in thread {name!r}")


def install() -> None:
    """Route uncaught exceptions to :func:`abort` (idempotent)."""
    if _saved:
        return
    _saved["sys"] = sys.excepthook
    _saved["threading"] = threading.excepthook
    sys.excepthook = _excepthook
    threading.excepthook = _thread_hook


def uninstall() -> None:
    """Restore the hooks that were in place before :func:`install`."""
    if not _saved:
        return
    sys.excepthook = _saved.pop("sys")
    threading.excepthook = _saved.pop("threading")


def installed() -> bool:
    return bool(_saved)
