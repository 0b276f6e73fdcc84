"""Fail fast: an uncaught exception or an early exit on any rank ends the whole MPI job.

MPI has no failure detection: when one rank dies with an exception while the others
wait in a collective, they wait forever. ``init_process_group`` installs a
``sys.excepthook`` (and ``threading.excepthook``) that prints ``[rank N]`` with the
traceback and calls ``MPI_Abort`` on ``MPI_COMM_WORLD``, so the launcher ends every
rank. Opt out with ``init_process_group(..., abort_on_error=False)`` or
``MPIDIST_ABORT_ON_ERROR=0``.

A rank that *returns* early (``sys.exit(0)``, the end of ``main``) is the harder case:
measured with MPICH's hydra, it blocks in ``MPI_Finalize`` while its peers block in
their collective, and the job hangs until something kills it (``os._exit`` is seen by
hydra, which kills the job, but the exit status can then be 0). So, while the default
group is initialised, every rank runs an *exit watch* on a private duplicate of
``MPI_COMM_WORLD``:

- at interpreter exit (``atexit``) a rank sends an exit notice to every peer, then
  waits, sleeping rather than spinning, until every peer has sent its own; a rank
  still missing after ``MPIDIST_EXIT_TIMEOUT`` seconds (default: the group's
  ``timeout``) ends the job with ``MPI_Abort``;
- a watcher thread on every rank (needs ``MPI_THREAD_MULTIPLE``, mpidist's default)
  receives those notices; when a peer has exited while this rank's main thread sits
  inside an mpidist communication call for :data:`STALL` seconds, the peer can never
  complete it, so the watcher aborts the job at once, naming the exited rank and the
  call that would hang. A rank that is still computing is left alone: ranks may
  legitimately finish at different times.

``destroy_process_group()`` ends the watch (after it, an early exit is the caller's
own choice, and MPI's ``MPI_Finalize`` waits for the peers as usual).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback
from types import FrameType, TracebackType
from typing import Any

import numpy as np
from mpi4py import MPI

from ..core import errors, faults, groups, job, ranklists, registry, settings
from ..core.waiting import Backoff, seconds

_saved: dict[str, Any] = {}

#: Seconds a rank's main thread must stay inside a communication call, after a peer has
#: exited, before the watcher concludes it can never finish.
STALL = 2.0
#: Seconds between the watcher's checks (it sleeps in between, it never spins).
POLL = 0.1


def enabled_by_env() -> bool:
    """``MPIDIST_ABORT_ON_ERROR`` (default on)."""
    try:
        return bool(settings.flag("MPIDIST_ABORT_ON_ERROR"))
    except ValueError as exc:
        raise errors.value_error("init_process_group", str(exc)) from None


def abort(text: str, code: int = 1) -> None:
    """Print ``text`` to stderr with this rank's prefix, then ``MPI_Abort`` the world."""
    say(text)
    # the launcher forwards our stderr asynchronously and kills every rank on MPI_Abort:
    # give it a moment to pass the report on, or the reason for the abort can be lost
    time.sleep(0.3)
    MPI.COMM_WORLD.Abort(code)
    # Measured with MPICH 5: MPI_Abort called from a thread other than the main one can
    # return, and the rank would carry on into its next collective; never let it.
    os._exit(code)


def say(text: str) -> None:
    """Write ``text`` to stderr, every line prefixed with ``[rank N]``, and flush."""
    rank = job.world.Get_rank()
    sys.stdout.flush()
    sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in text.rstrip("\n").split("\n")))
    sys.stderr.flush()


def _report(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None,
            where: str) -> None:
    lines = "".join(traceback.format_exception(exc_type, exc, tb))
    abort(f"uncaught {exc_type.__name__} {where}; aborting the MPI job (MPI_Abort)\n{lines}")


def _excepthook(exc_type: type[BaseException], exc: BaseException,
                tb: TracebackType | None) -> None:
    _report(exc_type, exc, tb, "in the main thread")


def _thread_hook(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    _report(args.exc_type, args.exc_value, args.exc_traceback, f"in thread {name!r}")


def exit_timeout(default: float | None) -> float:
    """Seconds an exiting rank waits for its peers: ``MPIDIST_EXIT_TIMEOUT``, else ``default``."""
    try:
        limit = settings.seconds("MPIDIST_EXIT_TIMEOUT")
    except ValueError as exc:
        raise errors.value_error("init_process_group", str(exc)) from None
    if limit is not None:
        return limit
    return 1800.0 if default is None else float(default)


def _comm_frame(frame: FrameType | None) -> FrameType | None:
    """The frame of the declared call (:mod:`mpidist.core.registry`) the stack is inside, else ``None``."""
    found = registry.outermost_call(frame)
    return None if found is None else found[1]


class ExitWatch:
    """Exit notices between the ranks of a private duplicate of ``MPI_COMM_WORLD``."""

    def __init__(self, limit: float, base: MPI.Intracomm | None = None) -> None:
        self.comm = (base or job.world).Dup()  # collective: every rank installs together
        self.limit = limit
        me, n = self.comm.Get_rank(), self.comm.Get_size()
        self.peers = [r for r in range(n) if r != me]
        self.inbox = np.zeros(n, dtype=np.int32)
        self.recvs = {r: self.comm.Irecv([self.inbox[r:r + 1], MPI.INT], source=r, tag=0)
                      for r in self.peers}
        self.exited: dict[int, float] = {}
        self.dead: set[int] = set()  # peers that died (ULFM): their groups' calls raise instead
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        if MPI.Query_thread() == MPI.THREAD_MULTIPLE and self.peers:
            self.thread = threading.Thread(target=self._watch, name="mpidist-exit-watch", daemon=True)
            self.thread.start()

    def _collect(self) -> None:
        for r in [r for r in self.recvs if r not in self.exited]:
            try:
                if self.recvs[r].Test():
                    self.exited[r] = time.monotonic()
            except MPI.Exception as exc:  # under ULFM: rank r died; it sends no notice
                if not faults.is_failure(exc):
                    raise
                faults.seen = True
                self.exited[r] = time.monotonic()
                self.dead.add(r)

    def _watch(self) -> None:
        main = threading.main_thread().ident
        blocked_since: float | None = None
        while not self.stop.wait(POLL):
            self._collect()
            frame = _comm_frame(sys._current_frames().get(main))
            now = time.monotonic()
            ended = {r: t for r, t in self.exited.items() if r not in self.dead}
            if frame is None or not ended:
                blocked_since = None
                continue
            if blocked_since is None:
                blocked_since = now
            if now - max(blocked_since, min(ended.values())) >= STALL:
                gone = ranklists.ranges(ended)
                abort(
                    f"rank(s) {gone} ended (returned or called sys.exit) while this rank waits in "
                    f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno}), which "
                    "can then never complete; aborting the MPI job (MPI_Abort) so that no rank hangs. "
                    "Every rank must make the same collective calls; call destroy_process_group() "
                    "on every rank at the end. (For a job that goes on when a rank dies, see "
                    "'python -m mpidist info' and docs/survive.md.)", 1,
                )

    def halt(self) -> None:
        """Stop the watcher thread (the caller then owns the requests)."""
        self.stop.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()

    def finish(self) -> None:
        """At exit: tell every peer, then wait (sleeping) for theirs, or abort on timeout."""
        self.halt()
        one = np.ones(1, dtype=np.int32)
        sends = [self.comm.Isend([one, MPI.INT], dest=r, tag=0) for r in self.peers]
        limit = self.limit
        start = time.monotonic()
        told = False
        backoff = Backoff(longest=POLL)
        while True:
            self._collect()
            missing = [r for r in self.peers if r not in self.exited]
            if not missing:
                break
            waited = time.monotonic() - start
            if waited >= limit:
                abort(
                    f"this rank has finished, but rank(s) {ranklists.ranges(missing)} did not "
                    f"finish within {limit:g} s (MPIDIST_EXIT_TIMEOUT, default the group's timeout); "
                    "aborting the MPI job (MPI_Abort) so that no rank hangs", 1,
                )
            if not told and waited >= 1.0:
                say(f"finished with the process group still initialised; waiting up to {limit:g} s "
                    f"for rank(s) {ranklists.ranges(missing)} to finish")
                told = True
            backoff.sleep()
        for r, req in zip(self.peers, sends):
            if r in self.dead:
                continue  # under ULFM a send to the dead fails; nothing waits for it
            try:
                req.Wait()
            except MPI.Exception as exc:
                if not faults.is_failure(exc):
                    raise

    def close(self) -> None:
        """Cancel the pending receives and free the communicator (collective, as destroy is)."""
        self.halt()
        try:
            self._collect()
            for r, req in self.recvs.items():
                if r not in self.exited:
                    req.Cancel()
                    req.Wait()
            self.comm.Free()
        except MPI.Exception as exc:
            if not faults.is_failure(exc):
                raise


_watch: ExitWatch | None = None


def _at_exit() -> None:
    global _watch
    w, _watch = _watch, None
    if w is not None and not MPI.Is_finalized():
        w.finish()


def install() -> None:
    """Route uncaught exceptions to :func:`abort` and start the exit watch (idempotent).

    Collective over ``MPI_COMM_WORLD`` the first time (``MPI_Comm_dup``); the exit
    timeout defaults to the default group's ``timeout``.
    """
    global _watch
    if _saved:
        return
    world = groups.registry.world
    limit = exit_timeout(seconds(world.timeout) if world is not None else None)
    _saved["sys"] = sys.excepthook
    _saved["threading"] = threading.excepthook
    sys.excepthook = _excepthook
    threading.excepthook = _thread_hook
    _watch = ExitWatch(limit)
    atexit.register(_at_exit)


def _keep_traceback_hook(exc_type: type[BaseException], exc: BaseException,
                         tb: TracebackType | None) -> None:
    # torch.distributed wraps sys.excepthook and points sys.stderr at a StringIO while the
    # wrapped hook runs; MPI_Abort would then swallow the traceback.
    if sys.__stderr__ is not None:
        sys.stderr = sys.__stderr__
    _excepthook(exc_type, exc, tb)


def install_for_torch() -> None:
    """:func:`install` for a job of several ranks (unless ``MPIDIST_ABORT_ON_ERROR=0``), in a
    way that keeps the traceback when torch.distributed wraps ``sys.excepthook``."""
    if not enabled_by_env() or job.world.Get_size() == 1:
        return
    install()
    keep_traceback()


def restart(base: MPI.Intracomm) -> None:
    """Move the exit watch onto ``base`` (the world after ``shrink_group``; collective over it)."""
    global _watch
    old, _watch = _watch, None
    if old is not None:
        old.close()
    _watch = ExitWatch(old.limit if old is not None else exit_timeout(None), base)


def keep_traceback() -> None:
    """When the abort hook is in place, make it write the traceback past torch's wrapper."""
    if sys.excepthook is _excepthook:
        sys.excepthook = _keep_traceback_hook


def uninstall() -> None:
    """Restore the hooks that were in place before :func:`install`; end the exit watch."""
    global _watch
    if not _saved:
        return
    sys.excepthook = _saved.pop("sys")
    threading.excepthook = _saved.pop("threading")
    atexit.unregister(_at_exit)
    w, _watch = _watch, None
    if w is not None and not MPI.Is_finalized():
        w.close()


def installed() -> bool:
    return bool(_saved)
