"""What a give-up says: the report a :class:`~mpidist.core.timeouts.GroupTimeoutError` carries.

One sentence per fact: the call, its sequence number and group; why this rank gave up (its own
deadline, or a peer's notice first); the ranks not heard from, by host; the ranks heard from, by
the call they were in. Rank lists are ranges (:mod:`mpidist.core.ranklists`), so a report's length
grows with the number of distinct calls and hosts, not with the ranks.
"""

from __future__ import annotations

import functools
import zlib
from typing import Any

import numpy as np

from . import groups, ranklists, registry
from .groups import ProcessGroup


def call_id(call: Any) -> int:
    """The number a notice carries for ``call`` (the same on every rank)."""
    return zlib.crc32(str(call).encode()) & 0x7FFFFFFF


@functools.lru_cache(maxsize=64)
def call_name(cid: int) -> str:
    """The registered call whose :func:`call_id` is ``cid``."""
    for name in registry.REGISTRY:
        if call_id(name) == cid:
            return name
    return f"call {cid}"


def _limit(limit: float | None) -> str:
    return "none" if limit is None else f"{limit:g} s"


def report(pg: ProcessGroup, call: Any, limit: float | None, waited: float,
           heard: dict[int, np.ndarray], first: dict[int, np.ndarray]) -> str:
    """The report of a give-up on ``pg``: ``heard`` maps group ranks to their notices, ``first``
    those that came before this rank's own deadline."""
    silent = [pg.ranks[r] for r in range(pg._size) if r != pg._rank and r not in heard]
    # a collective's number is the same on every member; a point-to-point call has none of its own
    number = (f"#{pg.seq}" if registry.collective(call)
              else f"(point to point, after call #{pg.seq})")
    where = f"{call} {number} on group {pg.group_name!r} (global ranks {ranklists.ranges(pg.ranks)})"
    if first and (limit is None or waited < limit):
        r, msg = min(first.items())
        why = (f"{where}: Timed out after {waited:.3g} s here, since rank {pg.ranks[r]} gave up on "
               f"{call_name(int(msg[1]))} #{msg[0]} after {msg[3] / 1000:g} s (the group's timeout "
               f"is {_limit(limit)})")
    else:
        why = f"{where}: Timed out after {waited:.3g} s (the group's timeout is {_limit(limit)})"
    parts = [why]
    if silent:
        parts.append(f"not heard from rank{'s' if len(silent) > 1 else ''} "
                     f"{ranklists.by_host(silent, groups.registry.hosts)}: not in a call on this "
                     "group, or cut off from this rank")
    calls: dict[tuple[int, int], list[int]] = {}  # (call id, sequence number) -> global ranks
    for r, m in heard.items():
        calls.setdefault((int(m[1]), int(m[0])), []).append(pg.ranks[r])
    if calls:
        parts.append("heard from " + ", ".join(
            f"{ranklists.plural(rs)} ({call_name(cid)} #{seq})"
            for (cid, seq), rs in sorted(calls.items(), key=lambda kv: min(kv[1]))[:ranklists.MOST_HOSTS]))
    parts.append("the group is now broken: later calls on it raise at once")
    return "; ".join(parts)
