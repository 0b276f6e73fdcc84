"""The flight recorder: each rank's last calls, written out when something goes wrong.

Off by default. ``MPIDIST_FLIGHT_RECORDER=N`` (or :func:`enable`) keeps, on every rank, a
ring of the last ``N`` collective calls: sequence number on the group, call, group, what
was passed (dtypes and shapes), start and end times and how the call ended. It is written
to ``MPIDIST_FLIGHT_DIR`` (default: the working directory) as ``mpidist-flight-rank<R>.json``
when a call times out, before the stall watch aborts the job, and on ``SIGUSR1``
(``kill -USR1 <pid>`` on every rank, or ``scancel --signal=USR1``). ``python -m mpidist.flight
DIR`` (:mod:`mpidist.flight`) merges the ranks' files into one report.

The ``SIGUSR1`` handler is chained: one installed before the recorder was enabled (PyTorch
Lightning's Slurm requeue, for one) runs after the record is written (:func:`_on_sigusr1`).
A record is written to a new file of a fresh name, readable by its owner only, and renamed
onto its final name, so a link planted in a shared folder is never written through.

The recorder is a hook on every declared call (:mod:`mpidist.core.registry`), so it costs nothing
while off.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, Callable

from ..core import errors, registry, settings, timeouts
from ..core.groups import resolve

ENV_SIZE, ENV_DIR = "MPIDIST_FLIGHT_RECORDER", "MPIDIST_FLIGHT_DIR"


class _Recorder:
    def __init__(self, size: int) -> None:
        self.ring: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)
        self.tls = threading.local()


_rec: _Recorder | None = None


def _record(call: registry.Call, body: Callable[..., Any], args: dict) -> Any:
    rec = _rec
    if rec is None or getattr(rec.tls, "inside", False):
        return body(**args)
    try:
        pg = resolve(args.get(call.group_arg), call.name) if call.group_arg else None
    except Exception:
        pg = None
    entry: dict[str, Any] = {"call": call.name, "state": "started", "start": time.time()}
    if pg is not None:  # the number the call takes on the group (ProcessGroup.seq), as in timeout reports
        entry.update(group=pg.group_name, ranks=list(pg.ranks), seq=pg.seq + 1)
        if call.fingerprint is not None:
            try:
                entry["args"] = call.fingerprint(pg, args, call.name)[0]
            except Exception as exc:  # too wrong to describe: the call itself will say why
                entry["args"] = {"unreadable": repr(exc)}
    if args.get("async_op"):
        entry["async"] = True
    rec.ring.append(entry)
    rec.tls.inside = True
    try:
        out = body(**args)
    except BaseException as exc:
        entry.update(state="failed", error=f"{type(exc).__name__}: {exc}", end=time.time())
        raise
    finally:
        rec.tls.inside = False
    entry.update(state="issued" if entry.get("async") else "completed", end=time.time())
    return out


#: The ``SIGUSR1`` handler that was in place when :func:`_on_sigusr1` was installed.
_previous: Any = None


def _on_sigusr1(signum: int, frame: FrameType | None) -> None:
    """Write this rank's record, then run the handler that was there before (chained, not replaced).

    A Python handler installed earlier (PyTorch Lightning's Slurm requeue, for one) still
    runs. ``SIG_DFL`` would end the process; it is not carried out, because ``kill -USR1``
    here asks a live job for its record. ``SIG_IGN``, or a handler set outside Python
    (``None``), leaves nothing further to do.
    """
    dump("SIGUSR1")
    previous = _previous
    if callable(previous):
        previous(signum, frame)


def _install_handler() -> None:
    """Make :func:`_on_sigusr1` the ``SIGUSR1`` handler, remembering the one it replaces."""
    global _previous
    current = signal.getsignal(signal.SIGUSR1)
    if current is not _on_sigusr1:  # enabled again: keep the handler that was there first
        _previous = current
        signal.signal(signal.SIGUSR1, _on_sigusr1)


def _remove_handler() -> None:
    """Put the earlier ``SIGUSR1`` handler back, unless ours was replaced since or it cannot be restored."""
    global _previous
    if signal.getsignal(signal.SIGUSR1) is _on_sigusr1 and _previous is not None:
        signal.signal(signal.SIGUSR1, _previous)
        _previous = None


def enable(size: int | None = None) -> None:
    """Start recording the last ``size`` calls (default ``MPIDIST_FLIGHT_RECORDER``); 0 stops.

    Called in the main thread, it also installs the ``SIGUSR1`` handler that writes the
    record, chained to the handler in place before (:func:`_on_sigusr1`); stopping puts
    that handler back.
    """
    global _rec
    if size is None:
        try:
            size = settings.integer(ENV_SIZE) or 0
        except ValueError as exc:
            raise errors.value_error("flight recorder", str(exc)) from None
    if size <= 0:
        _rec = None
        registry.set_hook("flight", None)
        timeouts.GIVE_UP_LISTENERS.pop("flight", None)
        if threading.current_thread() is threading.main_thread():
            _remove_handler()
        return
    _rec = _Recorder(size)
    registry.set_hook("flight", _record)
    timeouts.GIVE_UP_LISTENERS["flight"] = dump
    if threading.current_thread() is threading.main_thread():  # where Python lets a handler be set
        _install_handler()


def enable_from_env() -> None:
    """:func:`enable` when ``MPIDIST_FLIGHT_RECORDER`` is set (at ``init_process_group``)."""
    if settings.is_set(ENV_SIZE):
        enable()


def enabled() -> bool:
    return _rec is not None


def dump(reason: str) -> Path | None:
    """Write this rank's record (with ``reason``); the path, or ``None`` when not recording.

    The file is created under a fresh name in ``MPIDIST_FLIGHT_DIR`` (``tempfile.mkstemp``:
    exclusively, not through a link, mode ``0600``) and renamed onto
    ``mpidist-flight-rank<R>.json`` (``os.replace``, which replaces a link of that name
    instead of following it), so readers see a whole file or none.
    """
    rec = _rec
    if rec is None:
        return None
    folder = Path(settings.path(ENV_DIR))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"mpidist-flight-rank{errors.WORLD_RANK}.json"
    data = {"rank": errors.WORLD_RANK, "host": os.uname().nodename, "pid": os.getpid(),
            "reason": reason, "written": time.time(), "calls": list(rec.ring)}
    # a fresh name in the target folder (O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600): a link or
    # file someone planted in a shared folder is never opened; os.replace then renames onto
    # the final name, which replaces a link there rather than writing through it
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path
