"""The flight recorder: each rank's last calls, written out when something goes wrong.

Off by default. ``MPIDIST_FLIGHT_RECORDER=N`` (or :func:`enable`) keeps, on every rank, a
ring of the last ``N`` collective calls: sequence number on the group, call, group, what
was passed (dtypes and shapes), start and end times and how the call ended. It is written
to ``MPIDIST_FLIGHT_DIR`` (default: the working directory) as ``mpidist-flight-rank<R>.json``
when a call times out, before the stall watch aborts the job, and on ``SIGUSR1``
(``kill -USR1 <pid>`` on every rank, or ``scancel --signal=USR1``). ``python -m mpidist.flight
DIR`` (:mod:`mpidist.flight`) merges the ranks' files into one report.

The recorder is a hook on every declared call (:mod:`mpidist.core.registry`), so it costs nothing
while off.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ..core import errors, registry, timeouts
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


def enable(size: int | None = None) -> None:
    """Start recording the last ``size`` calls (default ``MPIDIST_FLIGHT_RECORDER``); 0 stops."""
    global _rec
    if size is None:
        raw = os.environ.get(ENV_SIZE, "0").strip() or "0"
        try:
            size = int(raw)
        except ValueError:
            raise errors.value_error("flight recorder", f"{ENV_SIZE}={raw!r} is not a count") from None
    if size <= 0:
        _rec = None
        registry.set_hook("flight", None)
        timeouts.GIVE_UP_LISTENERS.pop("flight", None)
        return
    _rec = _Recorder(size)
    registry.set_hook("flight", _record)
    timeouts.GIVE_UP_LISTENERS["flight"] = dump
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, lambda *_: dump("SIGUSR1"))


def enable_from_env() -> None:
    """:func:`enable` when ``MPIDIST_FLIGHT_RECORDER`` is set (at ``init_process_group``)."""
    if os.environ.get(ENV_SIZE, "").strip():
        enable()


def enabled() -> bool:
    return _rec is not None


def dump(reason: str) -> Path | None:
    """Write this rank's record (with ``reason``); the path, or ``None`` when not recording."""
    rec = _rec
    if rec is None:
        return None
    folder = Path(os.environ.get(ENV_DIR, "."))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"mpidist-flight-rank{errors.WORLD_RANK}.json"
    data = {"rank": errors.WORLD_RANK, "host": os.uname().nodename, "pid": os.getpid(),
            "reason": reason, "written": time.time(), "calls": list(rec.ring)}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
    return path
