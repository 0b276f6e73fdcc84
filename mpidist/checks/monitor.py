"""``monitored_barrier``: a barrier with a deadline that names the ranks that did not arrive.

MPI has no timeouts: a rank that never arrives leaves its peers blocked forever. Here every
other rank reports its arrival to group rank 0 with a nonblocking send; rank 0 polls the
matching ``MPI_Irecv``\\ s with ``MPI_Testsome`` (backing off between polls, so it never spins
a core an oversubscribed peer needs), then answers every rank "pass" or "fail". Missing ranks
are named in a ``RuntimeError`` raised on rank 0 and, through the answer, on every rank that
did arrive; a rank that hears nothing from rank 0 raises too. The messages use the group's
communicator with the tags :mod:`mpidist.core.tags` reserves for them (a private
``MPI_Comm_dup`` would be collective, so its creation would itself hang on a missing rank),
and carry a round number so a late arrival from a failed round never satisfies a later one.
"""

from __future__ import annotations

import time
import weakref
from datetime import timedelta
from typing import Any

import numpy as np
from mpi4py import MPI

from ..core import errors, ranklists
from ..core.groups import NON_GROUP_MEMBER, ProcessGroup, resolve
from ..core.registry import absent, define
from ..core.tags import ANSWER, ARRIVE
from ..core.waiting import Backoff, poll, positive_seconds

_PASS, _FAIL = 1, 2
# what a peer says after the verdict (second message on ARRIVE): it heard it, or gave up first
_HEARD, _GAVE_UP = 1, 2

_rounds: dict[ProcessGroup, int] = weakref.WeakKeyDictionary()
_orphans: list[Any] = []


def _poll(reqs: list[MPI.Request], done: set[int], deadline: float) -> None:
    """Test ``reqs`` until all are done or ``deadline`` passes; progress restarts the backoff."""
    backoff = Backoff()

    def all_done() -> bool:
        if len(done) == len(reqs):
            return True
        idx = MPI.Request.Testsome(reqs)
        if idx:
            done.update(idx)
            backoff.reset()
        return len(done) == len(reqs)

    poll(all_done, deadline, backoff)


def _drop(reqs: list[MPI.Request], done: set[int], sends: bool, buf: Any = None) -> None:
    """Release requests that will not complete: cancel receives, free sends (they finish alone)."""
    for i, req in enumerate(reqs):
        if i in done or req == MPI.REQUEST_NULL:
            continue
        if sends:
            req.Free()
            _orphans.append(buf)  # MPI may still read it: keep it alive (failure path only)
        else:
            req.Cancel()
            req.Wait()


@define(bounded=True, hooked=False)
def monitored_barrier(group: Any = None, timeout: timedelta | float | None = None,
                      wait_all_ranks: bool = False) -> None:
    """A barrier that names the ranks that did not arrive within ``timeout``.

    Becomes nonblocking ``MPI_Isend``/``MPI_Irecv`` between every rank and group rank 0
    on a private communicator. ``timeout`` (a ``timedelta`` or seconds) defaults to the
    group's. On a timeout rank 0 raises ``RuntimeError`` naming the first missing rank,
    or every missing rank with ``wait_all_ranks=True``; the ranks that did arrive raise
    the same report, and a rank that hears nothing from rank 0 raises too.

    Example: on 3 ranks where rank 2 never calls it, ``monitored_barrier(timeout=5)``
    raises on ranks 0 and 1 after 5 s: ``... rank 2 did not reach monitored_barrier ...``.
    """
    call = monitored_barrier.call
    if group is NON_GROUP_MEMBER:  # torch's rule: warn and return
        return absent(call)
    pg = resolve(group, call)
    limit = positive_seconds(timeout if timeout is not None else pg.timeout, call)
    if pg._size == 1:
        return
    comm = pg.comm
    rnd = _rounds[pg] = _rounds.get(pg, 0) + 1
    if pg._rank == 0:
        _monitor(comm, pg, rnd, limit, wait_all_ranks, call)
    else:
        _arrive(comm, pg, rnd, limit, call)


def _monitor(comm: MPI.Intracomm, pg: ProcessGroup, rnd: int, limit: float, wait_all: bool,
             call: Any) -> None:
    deadline = time.monotonic() + limit
    peers = list(range(1, pg._size))
    inbox = np.zeros((pg._size, 2), np.int64)
    reqs = [comm.Irecv([inbox[r], MPI.INT64_T], r, ARRIVE) for r in peers]
    done: set[int] = set()
    while True:
        _poll(reqs, done, deadline)
        # from a round that failed, or a peer's word on an earlier verdict
        stale = [i for i in done if inbox[peers[i], 0] != rnd or inbox[peers[i], 1] != 0]
        if not stale:
            break
        for i in stale:
            done.discard(i)
            reqs[i] = comm.Irecv([inbox[peers[i]], MPI.INT64_T], peers[i], ARRIVE)
    _drop(reqs, done, sends=False)
    missing = [pg.ranks[peers[i]] for i in range(len(peers)) if i not in done]
    verdict = np.zeros(2 + pg._size, np.int64)
    verdict[:2] = rnd, _PASS if not missing else _FAIL
    verdict[2:][[pg._to_group[g] for g in missing]] = 1
    answers = [comm.Isend([verdict, MPI.INT64_T], r, ANSWER) for r in peers]
    sent: set[int] = set()
    _poll(answers, sent, time.monotonic() + min(limit, 1.0))
    _drop(answers, sent, sends=True, buf=verdict)
    gave_up = _gave_up(comm, pg, [peers[i] for i in sorted(done)], rnd, limit)
    if missing:
        shown = missing if wait_all else missing[:1]
        who = ranklists.ranges(shown)
        raise errors.runtime_error(
            call, f"rank{'s' if len(shown) > 1 else ''} {who} did not reach monitored_barrier "
            f"within {limit:g} s (group {pg.group_name!r}, global ranks {ranklists.ranges(pg.ranks)})"
        )
    if gave_up:
        raise errors.runtime_error(
            call, f"this rank (group rank 0, which monitors the barrier) came late: rank(s) "
            f"{ranklists.ranges(gave_up)} gave up waiting for it within {limit:g} s "
            f"(group {pg.group_name!r}, global ranks {ranklists.ranges(pg.ranks)})"
        )


def _gave_up(comm: MPI.Intracomm, pg: ProcessGroup, peers: list[int], rnd: int, limit: float) -> list[int]:
    """The global ranks among ``peers`` that gave up on rank 0 before its verdict reached them.

    Every peer that arrived says, after the verdict, whether it heard it; a peer's own wait
    is bounded, so its word comes within that bound.
    """
    word = np.zeros((pg._size, 2), np.int64)
    reqs = [comm.Irecv([word[r], MPI.INT64_T], r, ARRIVE) for r in peers]
    done: set[int] = set()
    deadline = time.monotonic() + limit + max(1.0, 0.1 * limit)
    while True:
        _poll(reqs, done, deadline)
        stale = [i for i in done if word[peers[i], 0] != rnd or word[peers[i], 1] == 0]
        if not stale:
            break
        for i in stale:
            done.discard(i)
            reqs[i] = comm.Irecv([word[peers[i]], MPI.INT64_T], peers[i], ARRIVE)
    _drop(reqs, done, sends=False)
    return [pg.ranks[r] for i, r in enumerate(peers) if i not in done or word[r, 1] == _GAVE_UP]


def _tell_monitor(comm: MPI.Intracomm, rnd: int, what: int) -> None:
    """Tell rank 0 whether this rank heard round ``rnd``'s verdict (bounded; never blocks for long)."""
    buf = np.array([rnd, what], np.int64)
    reqs = [comm.Isend([buf, MPI.INT64_T], 0, ARRIVE)]
    done: set[int] = set()
    _poll(reqs, done, time.monotonic() + 1.0)
    _drop(reqs, done, sends=True, buf=buf)


def _arrive(comm: MPI.Intracomm, pg: ProcessGroup, rnd: int, limit: float, call: Any) -> None:
    arrival = np.array([rnd, 0], np.int64)
    verdict = np.zeros(2 + pg._size, np.int64)
    reqs = [comm.Isend([arrival, MPI.INT64_T], 0, ARRIVE), comm.Irecv([verdict, MPI.INT64_T], 0, ANSWER)]
    done: set[int] = set()
    # rank 0 answers within `limit` of its own arrival; allow it time to answer
    deadline = time.monotonic() + limit + max(1.0, 0.1 * limit)
    while True:
        _poll(reqs, done, deadline)
        if 1 in done and verdict[0] != rnd:  # a stale answer from a round this rank missed
            done.discard(1)
            reqs[1] = comm.Irecv([verdict, MPI.INT64_T], 0, ANSWER)
            continue
        break
    if 1 not in done:
        status = MPI.Status()
        reqs[1].Cancel()
        reqs[1].Wait(status)
        if not status.Is_cancelled() and verdict[0] == rnd:
            done.add(1)  # the verdict came as this rank gave up: it counts
    if 1 not in done:
        _drop(reqs[:1], {0} & done, sends=True, buf=arrival)
        _tell_monitor(comm, rnd, _GAVE_UP)  # so that rank 0, arriving late, raises too
        raise errors.runtime_error(
            call, f"rank {pg.ranks[0]} (group rank 0, which monitors the barrier) did not answer "
            f"within {limit:g} s (group {pg.group_name!r})"
        )
    if 0 not in done:
        reqs[0].Wait()
    _tell_monitor(comm, rnd, _HEARD)
    if verdict[1] != _PASS:
        missing = [pg.ranks[r] for r in np.flatnonzero(verdict[2:])]
        raise errors.runtime_error(
            call, f"rank {pg.ranks[0]}, which monitors the barrier, reports that rank(s) "
            f"{ranklists.ranges(missing)} did not reach monitored_barrier within {limit:g} s "
            f"(group {pg.group_name!r}, global ranks {ranklists.ranges(pg.ranks)})"
        )
