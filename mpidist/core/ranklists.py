"""Rank lists in reports, short at any size: runs as ranges (``1–14, 16–1023``), ranks by host.

A report that named every rank would grow with the job (40,000 characters at 1,024 ranks);
these forms grow with the number of gaps and hosts instead, and are cut off past a few.
"""

from __future__ import annotations

from typing import Iterable, Sequence

#: Ranges, and hosts, named before the rest is summed up as "… (n more)".
MOST_RANGES = 8
MOST_HOSTS = 4


def ranges(ranks: Iterable[int], most: int = MOST_RANGES) -> str:
    """``[1, 2, 3, 5]`` as ``"1–3, 5"``; past ``most`` runs, the rest as a count."""
    runs: list[list[int]] = []
    for r in sorted(set(ranks)):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    text = ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in runs[:most])
    if len(runs) > most:
        text += f", … ({sum(b - a + 1 for a, b in runs[most:])} more)"
    return text


def plural(ranks: Sequence[int]) -> str:
    """``"rank 3"`` or ``"ranks 1–3, 5"``."""
    return f"rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)}"


def by_host(ranks: Iterable[int], hosts: Sequence[str], most: int = MOST_HOSTS) -> str:
    """Global ``ranks`` grouped by their host: ``"1–3 (node0), 4–7 (node1)"``, hosts in order of
    their lowest rank; past ``most`` hosts, the rest as a count of ranks and hosts."""
    on: dict[str, list[int]] = {}
    for r in sorted(set(ranks)):
        on.setdefault(hosts[r] if 0 <= r < len(hosts) else "?", []).append(r)
    named = [f"{ranges(rs)} ({host})" for host, rs in list(on.items())[:most]]
    rest = list(on.values())[most:]
    if rest:
        named.append(f"… ({sum(map(len, rest))} more on {len(rest)} more hosts)")
    return ", ".join(named)
