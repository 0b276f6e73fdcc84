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
