"""The flight recorder: each rank's last calls, written out when something goes wrong.

Off by default. ``MPIDIST_FLIGHT_RECORDER=N`` (or :func:`enable`) keeps, on every rank, a
ring of the last ``N`` collective calls: sequence number on the group, call, group, what
was passed (dtypes and shapes), start and end times and how the call ended. It is written
to ``MPIDIST_FLIGHT_DIR`` (default: the working directory) as ``mpidist-flight-rank<R>.json``
when a call times out, before the stall watch aborts the job, and on ``SIGUSR1``
(``kill -USR1 <pid>`` on every rank, or ``scancel --signal=USR1``). Then::

    python -m mpidist.flight DIR

merges every rank's file into a report: for each group, the last call each rank started
and finished, the rank that stopped first, and any rank that called something else at the
same sequence number (the one that diverged).

The recorder is a hook on every declared call (:mod:`mpidist.calls`), so it costs nothing
while off.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from . import calls, errors
from .groups import resolve

ENV_SIZE, ENV_DIR = "MPIDIST_FLIGHT_RECORDER", "MPIDIST_FLIGHT_DIR"


class _Recorder:
    def __init__(self, size: int) -> None:
        self.ring: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)
        self.tls = threading.local()


_rec: _Recorder | None = None


def _record(call: calls.Call, body: Callable[..., Any], args: dict) -> Any:
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
        calls.set_hook("flight", None)
        return
    _rec = _Recorder(size)
    calls.set_hook("flight", _record)
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


# ---------------------------------------------------------------- the merged report

def merge(files: list[Path]) -> str:
    """The report over the ranks' record files: per group, who stopped first, who diverged."""
    ranks = [json.loads(f.read_text()) for f in files]
    ranks.sort(key=lambda d: d["rank"])
    lines = [f"{len(ranks)} rank(s): " + ", ".join(f"{d['rank']} ({d['reason']})" for d in ranks)]
    by_group: dict[str, dict[int, list[dict]]] = {}
    for d in ranks:
        for c in d["calls"]:
            if "group" in c:
                by_group.setdefault(c["group"], {}).setdefault(d["rank"], []).append(c)
    for name, per_rank in sorted(by_group.items()):
        members = next(iter(per_rank.values()))[-1]["ranks"]
        lines.append(f"group {name!r} (global ranks {members}):")
        last: dict[int, dict] = {r: cs[-1] for r, cs in per_rank.items()}
        for r in sorted(last):
            c = last[r]
            lines.append(f"  rank {r}: last {c['call']} #{c['seq']} {c['state']}")
        silent = [r for r in members if r not in per_rank and r in {d["rank"] for d in ranks}]
        for r in silent:
            lines.append(f"  rank {r}: no call recorded on this group")
        lines += _verdict(per_rank, last, silent)
    return "\n".join(lines)


def _verdict(per_rank: dict[int, list[dict]], last: dict[int, dict], silent: list[int]) -> list[str]:
    out = []
    calls_at: dict[int, dict[int, str]] = {}
    for r, cs in per_rank.items():
        for c in cs:
            calls_at.setdefault(c["seq"], {})[r] = c["call"]
    for seq in sorted(calls_at):
        names = calls_at[seq]
        if len(set(names.values())) > 1:
            detail = ", ".join(f"rank {r} {n}" for r, n in sorted(names.items()))
            out.append(f"  diverged at #{seq}: {detail}")
            break
    if silent:
        out.append(f"  stopped first: rank(s) {silent} (no call on this group)")
    elif last:
        low = min(c["seq"] for c in last.values())
        behind = sorted(r for r, c in last.items() if c["seq"] == low)
        if low < max(c["seq"] for c in last.values()):
            out.append(f"  stopped first: rank(s) {behind} (last call #{low}; the others went further)")
        stuck = sorted(r for r, c in last.items() if c["state"] in ("started", "failed"))
        if stuck:
            out.append(f"  not completed: rank(s) {stuck}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mpidist.flight", description=merge.__doc__)
    ap.add_argument("folder", help="where the ranks wrote mpidist-flight-rank*.json")
    a = ap.parse_args(argv)
    files = sorted(Path(a.folder).glob("mpidist-flight-rank*.json"))
    if not files:
        print(f"no mpidist-flight-rank*.json in {a.folder}", file=sys.stderr)
        return 1
    print(merge(files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
