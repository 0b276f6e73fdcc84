"""Who a stalled call still waits for: a roll call among the stalled ranks of a group.

A blocked MPI call cannot say which peer it waits for, and "a peer has not reached the
matching call" is wrong when the network to that peer has failed. So when the stall
watch sees a call blocked, the watch thread sends a small roll-call message to every
other member of the call's group (nonblocking, on a private duplicate of the world made
at ``init_process_group``, so no user or mpidist message can match it) and collects the
ones that arrive. A peer that
is stalled too answers the same way; one that never reached an mpidist call, or that the
network cannot reach, stays silent. The report then names the ranks not heard from and
their hosts (gathered once at ``init_process_group``: ``mpidist.core.groups.registry.hosts``).

Needs ``MPI_THREAD_MULTIPLE`` (the default): the watch thread talks MPI while the main
thread is blocked inside MPI. At a lower thread level the roll call is skipped and the
report says so.
"""

from __future__ import annotations

import time
from typing import Any

from mpi4py import MPI

from ..core import groups, job, ranklists

TAG = 0
#: Messages sent more than this before this rank's own stall began are from an earlier stall.
_STALE_S = 1.0
#: How long a fresh roll call waits for the answers of peers that stalled at the same moment.
_GRACE_S = 2.0

_comm: list[MPI.Intracomm] = []  # the roll call's own duplicate of the world


def start(base: MPI.Intracomm | None = None) -> None:
    """Make the roll call's communicator (``MPI_Comm_dup`` of ``base``, by default
    ``MPI_COMM_WORLD``; collective, once per init and after the world shrinks)."""
    old = _comm[:]
    _comm[:] = [(base or job.world).Dup()]
    for comm in old:
        try:
            comm.Free()
        except MPI.Exception:
            pass  # under ULFM, a communicator with a dead member


def host_of(global_rank: int) -> str:
    hosts = groups.registry.hosts
    return hosts[global_rank] if 0 <= global_rank < len(hosts) else "?"


class RollCall:
    """One stalled call's roll call on group ``pg`` (global ranks ``pg.ranks``)."""

    def __init__(self, pg: Any, call: str, waited: float) -> None:
        self.pg = pg
        self.call = call
        self.began = time.time() - waited  # when this rank's stall began (wall clock: compared across ranks)
        self.sent = time.monotonic()
        self.heard: dict[int, str] = {}  # global rank -> the call it was stalled in
        self.sends: list[MPI.Request] = []
        self.enabled = MPI.Query_thread() == MPI.THREAD_MULTIPLE and bool(_comm)
        if not self.enabled:
            return
        comm = _comm[0]
        me = comm.Get_rank()
        note = (time.time(), call)
        try:
            self.sends = [comm.isend(note, r, TAG) for r in pg.ranks if r != me]
        except MPI.Exception:
            self.enabled = False

    def poll(self) -> None:
        """Receive whatever roll-call messages have arrived (never blocks)."""
        if not self.enabled or not _comm:
            return
        comm = _comm[0]
        status = MPI.Status()
        try:
            while comm.iprobe(MPI.ANY_SOURCE, TAG, status):
                sent, call = comm.recv(source=status.Get_source(), tag=TAG)
                if sent >= self.began - _STALE_S:  # else: left over from an earlier stall
                    self.heard[status.Get_source()] = call
        except MPI.Exception:
            self.enabled = False

    def describe(self, grace: float = _GRACE_S) -> str:
        """The peers heard from (stalled too) and those not heard from, with their hosts.

        A roll call younger than ``grace`` seconds first waits that long for answers (the
        peers start theirs at about the same moment).
        """
        if not self.enabled:
            return "who it waits for is unknown (the roll call needs MPI_THREAD_MULTIPLE)"
        me = job.world.Get_rank()
        peers = [r for r in self.pg.ranks if r != me]
        self.poll()
        while any(r not in self.heard for r in peers) and time.monotonic() < self.sent + grace:
            time.sleep(0.05)
            self.poll()
        silent = [r for r in peers if r not in self.heard]
        if not silent:
            other = {r: c for r, c in self.heard.items() if c != self.call}
            where = "; ".join(f"rank {r} ({host_of(r)}) waits in {c}" for r, c in other.items())
            if where:
                return f"every peer is stalled in an mpidist call too, not all in {self.call}: {where}"
            return f"every peer is stalled in {self.call} too: the fault is inside MPI or its network"
        hosts = ranklists.by_host(silent, groups.registry.hosts)
        heard = f"; heard from {ranklists.plural(list(self.heard))}" if self.heard else ""
        return (f"it still waits for rank{'s' if len(silent) > 1 else ''} {hosts}: not heard from "
                "since the stall began, so they have not reached an mpidist call, or the network to "
                f"them has failed{heard}")

    def close(self) -> None:
        """Let go of the unanswered sends (a peer that never receives them leaves them pending)."""
        for req in self.sends:
            if req != MPI.REQUEST_NULL:
                try:
                    if not req.Test():
                        req.Cancel()
                        req.Free()
                except MPI.Exception:
                    pass
        self.sends = []
