"""The default cross-rank check: ranks that disagree on a collective raise, on every rank.

MPI trusts every rank to pass the same count, datatype, op and root; when one does not, the
job computes a silently different result or hangs. This check is on unless
``MPIDIST_DEBUG=OFF``, and is cheap enough for that (measured in
``benchmarks/debug_overhead.py``):

* Every collective records its **signature** on its group: a small tuple of what must agree
  across ranks (the call, element count, dtype, op, root as a global rank, an all_gather's
  per-rank counts), declared as the call's ``signature=`` field names
  (:func:`mpidist.core.registry.define`). Recording is a list append.
* Some calls are **checked** before their MPI routine starts: the first :data:`FIRST` calls on
  each group, the first call of each kind on each group, and then every :data:`EVERY`-th call.
  The choice depends only on the group's call count and call kinds, so agreeing ranks make it
  alike. A check hashes the signatures recorded since the previous check (this call's
  included) and takes one ``MPI_Iallreduce`` (``MAX`` of the hash and its negation) of two
  int64: the hashes agree when the maximum equals the minimum. An all-to-all being checked
  also sends each peer the count it sends it (``MPI_Ialltoall``), and the ranks agree on
  whether every count matched what its receiver expects.
* On a mismatch the ranks ``MPI_Allgather`` their recorded signatures and every rank raises
  the same ``ValueError``, naming the first call that differs, its sequence number, the group,
  each differing field and which ranks passed which value. When that call is the one being
  checked, no rank has started its MPI routine: the data is untouched and the group stays
  usable. When it is an earlier, unchecked call, its results (and those after it) have
  already been returned and the message says so.

What is not caught: a mismatch in an unchecked call before the next check (its result is
returned first; a rooted call whose ranks disagree on the root may wait until the group's
timeout); an all-to-all's per-peer counts outside a checked call (MPI raises on a message
larger than its receiver's buffer, see :func:`mpidist.core.errors.from_mpi`); a rank that
raises on its own argument checks before reaching the call (its peers wait in the
collective until the group's timeout: ``MPIDIST_DEBUG=DETAIL`` checks every call and
catches those too); and point-to-point calls.
"""

from __future__ import annotations

import hashlib
import marshal
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from ..core import ranklists, registry
from ..core.groups import ProcessGroup
from ..core.timeouts import allgather, wait

#: Whether the check is on (``MPIDIST_DEBUG=OFF`` turns it off; see :func:`enable`).
ON: bool = True
#: The first calls on each group that are each checked.
FIRST = 8
#: After those, one call in this many is checked (with every call recorded since the last).
EVERY = 32


class Record:
    """A group's collectives counted (``n``), their signatures since the last check, the call
    kinds checked, and the count at which the next check is due.

    ``n`` counts collectives only: point-to-point calls, which only some ranks make, leave it
    alone, as ``ProcessGroup.seq`` does, so it is the same on every rank.
    """

    __slots__ = ("n", "sigs", "seen", "due")

    def __init__(self) -> None:
        self.n = 0
        self.sigs: list[tuple] = []
        self.seen: set[Any] = set()
        self.due = 1


def enable(on: bool = True, every: int | None = None) -> None:
    """Turn the default check on or off on this rank (every rank of a job must do the same).

    ``every`` sets :data:`EVERY` (``1`` checks every call).
    """
    global ON, EVERY
    ON = bool(on)
    if every is not None:
        EVERY = max(int(every), 1)


def record_of(pg: ProcessGroup) -> Record:
    rec = pg.signatures
    if rec is None:
        rec = pg.signatures = Record()
    return rec


def note(pg: ProcessGroup, sig: tuple, pairs: tuple[Sequence[int], Sequence[int]] | None = None) -> None:
    """Record ``sig`` (``(call name, value, ...)``) as the next collective on ``pg``; check when due.

    ``pairs``: for an all-to-all, the counts this rank sends to and expects from each peer.
    Raises the same ``ValueError`` on every rank when the ranks disagree.
    """
    rec = pg.signatures or record_of(pg)
    rec.n += 1
    rec.sigs.append(sig)
    if rec.n >= rec.due or sig[0] not in rec.seen:
        check(pg, rec, pairs)


def check(pg: ProcessGroup, rec: Record, pairs: tuple[Sequence[int], Sequence[int]] | None = None) -> None:
    """Agree with the group on the signatures recorded since the last check (see the module)."""
    sigs = rec.sigs
    call = sigs[-1][0]
    rec.seen.add(call)
    rec.due = rec.n + (1 if rec.n < FIRST else EVERY)
    ok = agreed(pg, call, digest_of(sigs))
    if ok and pairs is not None:
        ok = _pairs_agree(pg, call, pairs)
    if ok:
        sigs.clear()
        return
    mine = [(s[0], _fields(s[0]), s[1:]) for s in sigs]
    sigs.clear()
    every = allgather(pg, call, (mine, pairs))  # bounded: a rank out of step may never come
    raise ValueError(describe(pg, rec.n, [m for m, _ in every], [p for _, p in every]))


def digest(obj: Any) -> int:
    """A 62-bit hash of ``obj`` (tuples and lists of ints and strings), the same on every rank:
    of its ``marshal`` bytes (format 2, which has no back-references), as Python's ``hash`` of a
    string differs between processes."""
    return int.from_bytes(hashlib.blake2b(marshal.dumps(obj, 2), digest_size=8).digest(), "little") >> 2


class _Codes(dict):
    """Each signature's :func:`digest`, computed once per distinct signature in this process."""

    def __missing__(self, sig: tuple) -> int:
        if len(self) >= 4096:  # many distinct sizes (variable-length batches): start again
            self.clear()
        code = self[sig] = digest(sig)
        return code


_CODES = _Codes()


def digest_of(sigs: list[tuple]) -> int:
    """The hash of a run of signatures, the same on every rank: Python's hash of the tuple of
    their cached digests (a tuple of ints hashes alike in every process; strings do not).

    A run of one signature object (what the C all_reduce records in a loop) is hashed without
    looking each one up: ``list.count`` compares by identity first."""
    first = sigs[0]
    if sigs.count(first) == len(sigs):
        return hash((_CODES[first],) * len(sigs)) >> 2
    return hash(tuple(map(_CODES.__getitem__, sigs))) >> 2


def _fields(name: str) -> tuple[str, ...]:
    call = registry.REGISTRY.get(name)
    return call.signature if call is not None else ()


def agreed(pg: ProcessGroup, call: Any, h: int) -> bool:
    """Do all ranks of ``pg`` hold the same ``h``? (``MPI_Iallreduce``, ``MAX`` of ``h`` and ``-h``,
    within the group's timeout; every rank gets the same answer.)"""
    both = np.array([h, -h], np.int64)
    wait((pg.comm.Iallreduce(MPI.IN_PLACE, [both, MPI.INT64_T], MPI.MAX),), pg, call, both)
    return bool(both[0] == -both[1])


def _pairs_agree(pg: ProcessGroup, call: Any, pairs: tuple[Sequence[int], Sequence[int]]) -> bool:
    """Does what each rank sends each peer match what that peer expects? (``MPI_Ialltoall`` of
    the counts, then ``MPI_Iallreduce`` of a flag: every rank gets the same answer.)"""
    sends = np.asarray(pairs[0], np.int64)
    arrive = np.empty_like(sends)
    bufs = ([sends, MPI.INT64_T], [arrive, MPI.INT64_T])
    wait((pg.comm.Ialltoall(*bufs),), pg, call, bufs)
    bad = np.array([int(not np.array_equal(arrive, np.asarray(pairs[1], np.int64)))], np.int64)
    wait((pg.comm.Iallreduce(MPI.IN_PLACE, [bad, MPI.INT64_T], MPI.MAX),), pg, call, bad)
    return not bad[0]


def ranks(rs: list[int]) -> str:
    """``rank 3`` or ``ranks 0–2, 5``: runs as ranges, so that a report stays short at any size."""
    return ranklists.plural(rs)


def by_value(pairs: list[tuple[int, Any]], verb: str) -> str:
    """``ranks 0, 1 passed 4, rank 2 passed 5``: ranks grouped by the value they gave."""
    groups: dict[str, list[int]] = {}
    for r, v in pairs:
        groups.setdefault(str(v), []).append(r)
    return ", ".join(f"{ranks(rs)} {verb} {v}" for v, rs in groups.items())


def describe(pg: ProcessGroup, last: int, every: list[list[tuple]], pairs: list[Any]) -> str:
    """The message every rank raises: the first recorded call where the ranks differ (``last``:
    the number of the call being checked)."""
    world = list(pg.ranks)
    n = max(len(m) for m in every)
    first_seq = last - n + 1
    i = next((k for k in range(n) if len({repr(m[k]) if k < len(m) else "" for m in every}) > 1), n - 1)
    seq = first_seq + i
    entry = [(world[r], m[i] if i < len(m) else ("-", (), ())) for r, m in enumerate(every)]
    head = f"{entry[0][1][0]} #{seq} on group {pg.group_name!r}"
    if len({e[0] for _, e in entry}) > 1:
        text = f"{head}: the ranks called different collectives: " \
               + by_value([(r, f"{e[0]} #{seq}") for r, e in entry], "called")
    else:
        names = entry[0][1][1]
        parts = [f"'{f}': " + by_value([(r, e[2][k]) for r, e in entry], "passed")
                 for k, f in enumerate(names) if len({repr(e[2][k]) for _, e in entry}) > 1]
        if not parts and pairs[0] is not None:
            parts = [f"rank {world[src]} sends {p[0][dst]} elements to rank {world[dst]}, which expects "
                     f"{q[1][src]}" for src, p in enumerate(pairs) for dst, q in enumerate(pairs)
                     if p[0][dst] != q[1][src]]
        text = f"{head}: " + "; ".join(parts or ["the ranks' arguments differ"])
    if seq < last:
        text += (f" (found by the check at call #{last}, which did not start; calls #{seq} to "
                 f"#{last - 1} returned results that may differ between ranks)")
    return text
