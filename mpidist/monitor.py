"""Hang diagnosis: ``monitored_barrier`` and the stall watch.

MPI has no timeouts: a rank that never arrives leaves its peers blocked forever.

* :func:`monitored_barrier` is a barrier with a deadline. Every other rank reports its
  arrival to group rank 0 with a nonblocking send; rank 0 polls the matching
  ``MPI_Irecv``\\ s with ``MPI_Testsome``, sleeping between polls with a growing pause (it
  never spins a core an oversubscribed peer needs), then answers every rank "pass" or
  "fail". Missing ranks are named in a ``RuntimeError`` raised on rank 0 and, through
  the answer, on every rank that did arrive; a rank that hears nothing from rank 0 raises
  too. The messages use the group's communicator with the two MPI tags above the user
  and object ranges (a private ``MPI_Comm_dup`` would be collective, so its creation
  would itself hang on a missing rank), and carry a round number so a late arrival from
  a failed round never satisfies a later one.
* The stall watch is a daemon thread that samples ``sys._current_frames()`` every
  fraction of a second. A thread whose innermost Python frame is inside mpidist, in the
  same call (the same frame object) across samples, is blocked there; once that lasts
  ``MPIDIST_STALL_WARN_S`` seconds (default 60; ``0`` turns the watch off) the watch
  prints which call on which rank has waited how long, and once it passes the group's
  ``timeout`` it aborts the job with that report (``MPI_Abort``), unless the call bounds
  its own wait (``Work.wait``, ``monitored_barrier``). The collectives do nothing for
  it: no slot to write, no clock to read, so the fast path costs the same watched or not.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
import weakref
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
from mpi4py import MPI

from . import errors, groups
from .groups import ProcessGroup, resolve
from .p2p import MAX_TAG
from .work import seconds

_FIRST_SLEEP = 50e-6
_MAX_SLEEP = 5e-3
_PASS, _FAIL = 1, 2
# what a peer says after the verdict (second message on ARRIVE): it heard it, or gave up first
_HEARD, _GAVE_UP = 1, 2

_rounds: dict[ProcessGroup, int] = weakref.WeakKeyDictionary()
_orphans: list[Any] = []
#: MPI tags of the arrival and answer messages: the pair above every user and object tag.
ARRIVE = 2 * (MAX_TAG + 1)
ANSWER = ARRIVE + 1


def _poll(reqs: list[MPI.Request], done: set[int], deadline: float) -> None:
    """Test ``reqs`` with backoff sleeps until all are done or ``deadline`` passes."""
    pause = _FIRST_SLEEP
    while len(done) < len(reqs):
        idx = MPI.Request.Testsome(reqs)
        if idx:
            done.update(idx)
            pause = _FIRST_SLEEP
            continue
        now = time.monotonic()
        if now >= deadline:
            return
        time.sleep(min(pause, deadline - now))
        pause = min(pause * 2, _MAX_SLEEP)


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
    call = "monitored_barrier"
    pg = resolve(group, call)
    if timeout is not None and not isinstance(timeout, (timedelta, int, float)):
        raise errors.type_error(call, f"timeout must be a timedelta or seconds, got {timeout!r}")
    limit = seconds(timeout if timeout is not None else pg.timeout)
    if limit is None or limit <= 0:
        raise errors.value_error(call, f"timeout must be positive, got {timeout!r}")
    if pg._size == 1:
        return
    comm = pg.comm
    rnd = _rounds[pg] = _rounds.get(pg, 0) + 1
    if pg._rank == 0:
        _monitor(comm, pg, rnd, limit, wait_all_ranks, call)
    else:
        _arrive(comm, pg, rnd, limit, call)


def _monitor(comm: MPI.Intracomm, pg: ProcessGroup, rnd: int, limit: float, wait_all: bool,
             call: str) -> None:
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
        who = ", ".join(map(str, shown))
        raise errors.runtime_error(
            call, f"rank{'s' if len(shown) > 1 else ''} {who} did not reach monitored_barrier "
            f"within {limit:g} s (group {pg.group_name!r}, global ranks {list(pg.ranks)})"
        )
    if gave_up:
        raise errors.runtime_error(
            call, f"this rank (group rank 0, which monitors the barrier) came late: rank(s) "
            f"{', '.join(map(str, gave_up))} gave up waiting for it within {limit:g} s "
            f"(group {pg.group_name!r}, global ranks {list(pg.ranks)})"
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


def _arrive(comm: MPI.Intracomm, pg: ProcessGroup, rnd: int, limit: float, call: str) -> None:
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
            f"{', '.join(map(str, missing))} did not reach monitored_barrier within {limit:g} s "
            f"(group {pg.group_name!r}, global ranks {list(pg.ranks)})"
        )


# ---------------------------------------------------------------- the stall watch

_PKG = str(Path(__file__).resolve().parent)
_SELF_BOUNDED = {"wait_all", "monitored_barrier", "_monitor", "_arrive"}


def stall_warn_s() -> float:
    """``MPIDIST_STALL_WARN_S`` as seconds (default 60); ``0`` turns the watch off."""
    raw = os.environ.get("MPIDIST_STALL_WARN_S", "60").strip().lower()
    if raw in ("", "off", "none"):
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"MPIDIST_STALL_WARN_S={raw!r} is not a number of seconds") from None
    return max(value, 0.0)


def _chain(frame: FrameType | None) -> list[FrameType]:
    """The mpidist frames at the top of a stack, innermost first (empty if not inside mpidist)."""
    out = []
    while frame is not None and frame.f_code.co_filename.startswith(_PKG):
        out.append(frame)
        frame = frame.f_back
    return out


def _describe(chain: list[FrameType]) -> tuple[str, ProcessGroup | None, bool]:
    """(call name, its group, whether the call bounds its own wait) for a blocked stack."""
    entry = chain[-1]
    name = entry.f_code.co_name
    pg = None
    bounded = False
    for f in chain:
        loc = f.f_locals
        code = f.f_code.co_name
        if code in _SELF_BOUNDED and (code != "wait_all" or loc.get("timeout") is not None):
            bounded = True
        if pg is None and isinstance(loc.get("pg"), ProcessGroup):
            pg = loc["pg"]
        me = loc.get("self")
        if f is entry and me is not None and hasattr(me, "_call"):
            name = f"{type(me).__name__}.{name} ({me._call})"
    return name, pg, bounded


class StallWatch:
    """The watch thread: samples the other threads' stacks every ``period`` seconds."""

    def __init__(self, warn_s: float) -> None:
        self.warn_s = warn_s
        self.period = min(1.0, max(0.01, warn_s / 10))
        self.seen: dict[int, tuple[FrameType, float, bool]] = {}  # thread id -> (entry, since, warned)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="mpidist-stall-watch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(self.period):
            if groups.registry.world is None or MPI.Is_finalized():
                self.seen.clear()
                continue
            self.sample(time.monotonic())

    def sample(self, now: float) -> None:
        me = threading.get_ident()
        seen: dict[int, tuple[FrameType, float, bool]] = {}
        for tid, top in sys._current_frames().items():
            chain = _chain(top) if tid != me else []
            if not chain:
                continue
            entry = chain[-1]
            old = self.seen.get(tid)
            since, warned = (old[1], old[2]) if old is not None and old[0] is entry else (now, False)
            waited = now - since
            if waited >= self.warn_s:
                name, pg, bounded = _describe(chain)
                pg = pg or groups.registry.world
                limit = seconds(pg.timeout) if pg is not None else None
                if not warned:
                    _say(report(name, pg, waited, chain))
                    warned = True
                if limit is not None and waited >= limit and not bounded:
                    from . import failure

                    failure.abort(report(name, pg, waited, chain) + f"\nthe group's timeout of "
                                  f"{limit:g} s has passed; aborting the MPI job (MPI_Abort)")
            seen[tid] = (entry, since, warned)
        self.seen = seen


def report(name: str, pg: ProcessGroup | None, waited: float, chain: list[FrameType]) -> str:
    """The stall report: which call, on which rank and group, has waited how long, and where."""
    from . import debug

    where = ""
    if pg is not None:
        seq = debug.last_seq(pg)
        where = f" on group {pg.group_name!r} (global ranks {list(pg.ranks)}" + \
                (f", last checked call #{seq})" if seq else ")")
    stack = "".join(traceback.format_stack(chain[-1].f_back, limit=3)) if chain[-1].f_back else ""
    warn = _watch.warn_s if _watch else stall_warn_s()
    return (f"mpidist stall: rank {errors.WORLD_RANK} has waited {waited:.1f} s in {name}{where}; "
            f"a peer has not reached the matching call (stall warning after {warn:g} s, "
            f"MPIDIST_STALL_WARN_S)\ncalled from:\n{stack}")


def _say(text: str) -> None:
    sys.stderr.write("".join(f"[rank {errors.WORLD_RANK}] {line}\n" for line in text.rstrip().split("\n")))
    sys.stderr.flush()


_watch: StallWatch | None = None


def start_stall_watch(warn_s: float | None = None) -> StallWatch | None:
    """Start the stall watch once per process (``warn_s`` defaults to ``MPIDIST_STALL_WARN_S``)."""
    global _watch
    warn = stall_warn_s() if warn_s is None else float(warn_s)
    if _watch is not None:
        _watch.warn_s = warn or _watch.warn_s
        return _watch
    if warn <= 0:
        return None
    _watch = StallWatch(warn)
    return _watch


def stop_stall_watch() -> None:
    """Stop the stall watch thread (a later :func:`start_stall_watch` starts a new one)."""
    global _watch
    w, _watch = _watch, None
    if w is not None:
        w.stop.set()
        if w.thread is not threading.current_thread():
            w.thread.join()
