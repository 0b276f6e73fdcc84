"""``python -m mpidist.flight DIR``: the flight recorder's files merged into one report.

The ranks write ``mpidist-flight-rank<R>.json`` (:mod:`mpidist.checks.flight`, on with
``MPIDIST_FLIGHT_RECORDER=N``). The report gives, for each group, the last call each rank
started and finished, the rank that stopped first, and any rank that called something else
at the same sequence number (the one that diverged). It only reads files: nothing is sent between ranks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .core.ranklists import plural, ranges


def merge(files: list[Path]) -> str:
    """The report over the ranks' record files: per group, who stopped first, who diverged."""
    ranks = [json.loads(f.read_text()) for f in files]
    ranks.sort(key=lambda d: d["rank"])
    lines = [f"{len(ranks)} rank(s): " + ", ".join(
        f"{ranges(rs)} ({why})" for why, rs in _by(ranks, lambda d: d["reason"]).items())]
    by_group: dict[str, dict[int, list[dict]]] = {}
    for d in ranks:
        for c in d["calls"]:
            if "group" in c:
                by_group.setdefault(c["group"], {}).setdefault(d["rank"], []).append(c)
    for name, per_rank in sorted(by_group.items()):
        members = next(iter(per_rank.values()))[-1]["ranks"]
        lines.append(f"group {name!r} (global ranks {ranges(members)}):")
        last: dict[int, dict] = {r: cs[-1] for r, cs in per_rank.items()}
        said = _by([{"rank": r, **c} for r, c in sorted(last.items())],
                   lambda c: f"last {c['call']} #{c['seq']} {c['state']}")
        lines += [f"  {plural(rs)}: {what}" for what, rs in said.items()]
        silent = [r for r in members if r not in per_rank and r in {d["rank"] for d in ranks}]
        if silent:
            lines.append(f"  {plural(silent)}: no call recorded on this group")
        lines += _verdict(per_rank, last, silent)
    return "\n".join(lines)


def _by(items: list[dict], key: object) -> dict[str, list[int]]:
    """The ``rank`` of each item, grouped by ``key(item)`` in order of first appearance."""
    out: dict[str, list[int]] = {}
    for d in items:
        out.setdefault(key(d), []).append(d["rank"])  # type: ignore[operator]
    return out


def _verdict(per_rank: dict[int, list[dict]], last: dict[int, dict], silent: list[int]) -> list[str]:
    out = []
    calls_at: dict[int, dict[int, str]] = {}
    for r, cs in per_rank.items():
        for c in cs:
            calls_at.setdefault(c["seq"], {})[r] = c["call"]
    for seq in sorted(calls_at):
        names = calls_at[seq]
        if len(set(names.values())) > 1:
            detail = ", ".join(f"{plural(rs)} {n}" for n, rs in _by(
                [{"rank": r, "call": n} for r, n in sorted(names.items())], lambda c: c["call"]).items())
            out.append(f"  diverged at #{seq}: {detail}")
            break
    if silent:
        out.append(f"  stopped first: {plural(silent)} (no call on this group)")
    elif last:
        low = min(c["seq"] for c in last.values())
        behind = sorted(r for r, c in last.items() if c["seq"] == low)
        if low < max(c["seq"] for c in last.values()):
            out.append(f"  stopped first: {plural(behind)} (last call #{low}; the others went further)")
        stuck = sorted(r for r, c in last.items() if c["state"] in ("started", "failed"))
        if stuck:
            out.append(f"  not completed: {plural(stuck)}")
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
