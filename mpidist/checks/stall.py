"""The stall watch: a report when a rank waits in mpidist for long, an abort past the timeout.

A daemon thread samples ``sys._current_frames()`` every fraction of a second. A thread whose
innermost Python frame is inside mpidist, in the same call (the same frame object) across
samples, is blocked there; once that lasts ``MPIDIST_STALL_WARN_S`` seconds (default 60;
``0`` turns the watch off) the watch prints which call on which rank has waited how long,
and once it passes the group's ``timeout`` it aborts the job with that report
(``MPI_Abort``), unless the call bounds its own wait (a declared ``bounded`` call, or a
wait under a deadline: :data:`mpidist.core.waiting.bounded_waits`). The call and its group come
from the call registry (:mod:`mpidist.core.registry`). The collectives do nothing for the watch: no
slot to write, no clock to read, so the fast path costs the same watched or not.

The watch holds the frames of its last sample, and with them their locals. It stops at
interpreter exit (``atexit``), before finalization: a daemon thread whose sample held the last
reference to a returned frame freed that frame's objects on its own thread, and a torch process
group freed there during finalization released the GIL in its destructor, could not take it
back, and aborted the process ("terminate called without an active exception").
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
import traceback
from pathlib import Path
from types import FrameType

from mpi4py import MPI

from ..core import errors, groups, ranklists, registry, settings, waiting
from ..core.groups import ProcessGroup, resolve
from ..core.waiting import seconds
from . import debug, failure, flight, rollcall

_PKG = str(Path(__file__).resolve().parent)


def stall_warn_s() -> float:
    """``MPIDIST_STALL_WARN_S`` as seconds (default 60); ``0`` turns the watch off."""
    return settings.seconds("MPIDIST_STALL_WARN_S") or 0.0  # declared with a default: never None


def _mpidist_frames(frame: FrameType | None) -> list[FrameType]:
    """The frames of the mpidist call a stack is in, innermost first (empty if in none).

    Up to the outermost declared call (whose body may sit in mpi4py, as the object calls do),
    else the run of mpidist frames at the top of the stack.
    """
    found = registry.outermost_call(frame)
    out = []
    while frame is not None and (found is not None or frame.f_code.co_filename.startswith(_PKG)):
        out.append(frame)
        if found is not None and frame is found[1]:
            break
        frame = frame.f_back
    return out


def _describe(frames: list[FrameType], tid: int) -> tuple[str, ProcessGroup | None, bool]:
    """(call name, its group, whether the wait is bounded) for thread ``tid`` blocked in ``frames``."""
    found = registry.outermost_call(frames[0])
    bounded = tid in waiting.bounded_waits
    if found is None:
        return frames[-1].f_code.co_name, None, bounded
    call, frame = found
    try:
        pg = resolve(frame.f_locals.get(call.group_arg), call.name) if call.group_arg else None
    except Exception:
        pg = None
    return call.name, pg, bounded or call.bounded


class StallWatch:
    """The watch thread: samples the other threads' stacks every ``period`` seconds."""

    def __init__(self, warn_s: float) -> None:
        self.warn_s = warn_s
        self.period = min(1.0, max(0.01, warn_s / 10))
        self.seen: dict[int, tuple[FrameType, float, bool]] = {}  # thread id -> (entry, since, warned)
        self.roll_calls: dict[int, rollcall.RollCall] = {}  # thread id -> its stalled call's roll call
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
            frames = _mpidist_frames(top) if tid != me else []
            if not frames:
                continue
            entry = frames[-1]
            old = self.seen.get(tid)
            since, warned = (old[1], old[2]) if old is not None and old[0] is entry else (now, False)
            if not warned:
                self._end_roll_call(tid)
            waited = now - since
            if waited >= self.warn_s:
                name, pg, bounded = _describe(frames, tid)
                pg = pg or groups.registry.world
                limit = seconds(pg.timeout) if pg is not None else None
                if not warned:
                    _say(report(name, pg, waited, frames))
                    warned = True
                    if pg is not None:
                        self.roll_calls[tid] = rollcall.RollCall(pg, name, waited)
                if limit is not None and waited >= limit and not bounded:
                    flight.dump(f"stall abort in {name}")
                    failure.abort(report(name, pg, waited, frames, self.roll_calls.get(tid))
                                  + f"\nthe group's timeout of {limit:g} s has passed; aborting the MPI "
                                  "job (MPI_Abort)")
            seen[tid] = (entry, since, warned)
        self.seen = seen
        for tid in [t for t in self.roll_calls if t not in seen]:
            self._end_roll_call(tid)

    def _end_roll_call(self, tid: int) -> None:
        call = self.roll_calls.pop(tid, None)
        if call is not None:
            call.close()


def report(name: str, pg: ProcessGroup | None, waited: float, frames: list[FrameType],
           roll_call: rollcall.RollCall | None = None) -> str:
    """The stall report: which call, on which rank and group, has waited how long, and where.

    With the call's ``roll_call`` it also names the ranks (and hosts) not heard from.
    """
    where = ""
    if pg is not None:
        seq = debug.last_seq(pg)
        where = f" on group {pg.group_name!r} (global ranks {ranklists.ranges(pg.ranks)}" + \
                (f", last call #{seq})" if seq else ")")
    stack = "".join(traceback.format_stack(frames[-1].f_back, limit=3)) if frames[-1].f_back else ""
    warn = _watch.warn_s if _watch else stall_warn_s()
    known = roll_call.describe() if roll_call is not None else \
        "a peer has not reached the matching call, or the network to a peer has failed"
    return (f"mpidist stall: rank {errors.WORLD_RANK} has waited {waited:.1f} s on "
            f"{rollcall.host_of(errors.WORLD_RANK)} in {name}{where}; {known} "
            f"(stall warning after {warn:g} s, "
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
    """Stop the stall watch thread (a later :func:`start_stall_watch` starts a new one), and drop
    the frames it sampled here, on the calling thread."""
    global _watch
    w, _watch = _watch, None
    if w is not None:
        w.stop.set()
        if w.thread is not threading.current_thread():
            w.thread.join()
        w.seen = {}


# registered after mpi4py's MPI_Finalize (imported above), so it runs before it
atexit.register(stop_stall_watch)
