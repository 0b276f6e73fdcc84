"""The notices of the give-up: what a rank that gives up on a group's call tells its peers.

A rank past its deadline (:func:`mpidist.core.timeouts.wait`) sends a notice (its call, its
sequence number on the group and "gave up") on the tag :mod:`mpidist.core.tags` reserves for it,
then listens for a short grace period (:class:`Exchange`). In a group of up to
:data:`DIRECT_UP_TO` ranks the notice goes straight to every peer (n - 1 messages, one hop). In a
larger one it goes to the ``ceil(log2 n)`` ranks ``r + 1, r + 2, r + 4, ...`` (mod n) of the group
(:func:`neighbours`) and carries what its sender has heard of other ranks; each rank passes on,
to the same neighbours, what it learns that it did not know, and the ranks still unheard of
half-way through the grace period are asked directly.
"""

from __future__ import annotations

import time
import zlib

import numpy as np
from mpi4py import MPI

from . import groups
from .groups import ProcessGroup
from .tags import NOTICE

#: What a notice says of its sender: it gave up, or it answers one that did.
GAVE_UP, WAITING = 1, 2
NOTICE_LEN = 5  # sequence number, call id, state, seconds waited (milliseconds), group token
#: A notice message: the group token and its kind (news, or an ask for the receiver's notice),
#: then one entry per rank it tells of (group rank, then the first four fields of the notice).
_HEAD, _ENTRY = 2, 5
_NEWS, _ASK = 0, 1
#: What the last give-up of this process sent: ``messages`` (point-to-point sends) and ``entries``
#: (ranks' notices they carried, summed over the sends), for ``benchmarks/scale.py``.
LAST_GIVE_UP: dict[str, int] = {"messages": 0, "entries": 0}
#: Groups of up to this many ranks send a give-up's notice straight to every peer (n - 1 messages);
#: larger ones use :func:`neighbours`, whose O(log² n) are the fewer from about here (docs/benchmarks.md).
DIRECT_UP_TO = 64
#: A rank that gave up listens until a grace period after the last news new to it (ranks slow to be
#: scheduled are still heard of), at most this many grace periods in all.
MOST_GRACES = 4
#: Rate-limited news messages after the first waves; later news waits for the last message.
LATE_NEWS = 8


def group_token(pg: ProcessGroup) -> int:
    """What a notice says of its group, the same on every member: MPI reuses a freed
    communicator's context for a new one, and a notice still in flight from a group given up on
    would otherwise be taken as given up on the new group (seen at 4 ranks in the suite)."""
    return zlib.crc32(f"{groups.registry.generation}/{pg.group_name}/{pg.ranks}".encode()) & 0x7FFFFFFF


def take(comm: MPI.Intracomm, heard: dict[int, np.ndarray], token: int,
                  asked: set[int] | None = None) -> int:
    """Receive every notice message that has arrived and note each rank it tells of (group
    rank -> its notice, as :data:`NOTICE_LEN`); drop stale ones (another group's token).
    The senders of asks go into ``asked``. Returns how many ranks were new."""
    status = MPI.Status()
    me, new = comm.Get_rank(), 0
    while comm.Iprobe(MPI.ANY_SOURCE, NOTICE, status):
        msg = np.zeros(status.Get_count(MPI.INT64_T), np.int64)
        comm.Recv([msg, MPI.INT64_T], status.Get_source(), NOTICE)
        if msg.size < _HEAD + _ENTRY or msg[0] != token:
            continue
        if msg[1] == _ASK and asked is not None:
            asked.add(status.Get_source())
        for e in msg[_HEAD:].reshape(-1, _ENTRY):
            if int(e[0]) not in heard and e[0] != me:
                heard[int(e[0])] = np.array([e[1], e[2], e[3], e[4], token], np.int64)
                new += 1
    return new


def neighbours(me: int, n: int) -> list[int]:
    """The group ranks a notice goes to from ``me``: ``me + 2**j`` (mod ``n``) for ``2**j < n``.

    Every rank is within ``ceil(log2 n)`` hops of every other, along several paths, so one rank
    that is not listening holds back no news but its own (``tests/core/test_notices.py``)."""
    return [(me + (1 << j)) % n for j in range(max(n - 1, 0).bit_length())]


class Exchange:
    """One rank's side of the give-up exchange: what it has heard, what it has passed on.

    Up to :data:`DIRECT_UP_TO` ranks, the rank's own notice goes once to every peer and nothing
    is passed on or asked: every peer that listens tells this rank itself (n - 1 messages).
    Above it:

    - News goes to :func:`neighbours`: at once for the first ``len(neighbours) + 1`` messages
      (the waves in which it spreads), then at most once per eighth of the grace period, at most
      :data:`LATE_NEWS` times, and whatever is left when the rank stops listening.
    - Half-way through the grace period the rank asks each peer it has not heard of, directly;
      a peer that is listening answers with its own notice. Where silent ranks cut every path
      from a peer, that peer is still heard of, so a report names exactly the ranks that did
      not answer.

    Messages a rank sends there: at most ``L * min(n, L + 12)`` notices (``L = ceil(log2 n)``), plus
    one ask per peer it had not heard of by then and one answer per peer that asked it --
    O(log² n) where a few ranks are silent, however many give up at however many moments.
    """

    def __init__(self, pg: ProcessGroup, heard: dict[int, np.ndarray], asked: set[int],
                 own: np.ndarray, grace_s: float) -> None:
        self.comm, self.token = pg.comm, int(own[4])
        self.me = pg._rank
        self.peers = [r for r in range(pg._size) if r != self.me]
        self.direct = pg._size <= DIRECT_UP_TO
        self.to = self.peers if self.direct else neighbours(self.me, pg._size)
        self.heard, self.asked, self.answered = heard, asked, set()
        self.told: set[int] = set()  # ranks already passed on to the neighbours
        self.sends: list[MPI.Request] = []
        self.sent: list[np.ndarray] = []  # the messages, alive until MPI has sent them
        self.own = own
        self.entries = 0
        self.at_once = len(self.to) + 1
        self.news = 0  # messages of news sent (each to every neighbour)
        self.every = grace_s / 8
        self.next_at = 0.0
        now = time.monotonic()
        self.grace, self.most = grace_s, now + MOST_GRACES * grace_s
        self.until = now + grace_s  # moved on by news new to this rank, up to ``most``
        # told directly, every listening peer has told this rank directly: nobody to ask
        self.ask_at: float | None = None if self.direct else now + grace_s / 2

    def _send(self, kind: int, entries: list[tuple[int, np.ndarray]], to: list[int]) -> None:
        msg = np.empty(_HEAD + _ENTRY * len(entries), np.int64)
        msg[0], msg[1] = self.token, kind
        for i, (r, m) in enumerate(entries):
            msg[_HEAD + _ENTRY * i:_HEAD + _ENTRY * (i + 1)] = (r, m[0], m[1], m[2], m[3])
        self.entries += len(entries) * len(to)
        self.sent.append(msg)
        # one buffer for every destination: MPI only reads a send's buffer
        self.sends += [self.comm.Isend([msg, MPI.INT64_T], r, NOTICE) for r in to]

    def tell(self, now: bool = False) -> None:
        """Send the neighbours one message with every rank heard of and not yet passed on
        (unless the message rate says wait, and ``now`` does not override it)."""
        if len(self.told) == len(self.heard) + 1 or (self.direct and self.told):
            return  # nothing new (own notice told first), or every peer told directly
        if not now and self.news >= self.at_once and (
                time.monotonic() < self.next_at or self.news >= self.at_once + LATE_NEWS):
            return  # the rest waits for the last message, however long the rank listens on
        new = [(self.me, self.own)] if self.me not in self.told else []
        new += [(r, m) for r, m in sorted(self.heard.items()) if r not in self.told]
        self.told.update(r for r, _ in new)
        self.news += 1
        if self.news >= self.at_once:
            self.next_at = time.monotonic() + self.every
        self._send(_NEWS, new, self.to)

    def step(self) -> bool:
        """Take what has arrived, pass on what is new, answer and ask; ``True`` once every peer
        is heard of, or the listening is over (:data:`MOST_GRACES`)."""
        now = time.monotonic()
        if self.comm.Iprobe(MPI.ANY_SOURCE, NOTICE) and take(
                self.comm, self.heard, self.token, self.asked):
            # news still coming: its senders' peers may be slow, not gone; listen (and hold the
            # asks) a while longer
            self.until = min(self.most, now + self.grace)
            if self.ask_at is not None:
                self.ask_at = max(self.ask_at, min(now, self.most - self.grace) + self.grace / 2)
        if self.asked - self.answered:
            self._send(_NEWS, [(self.me, self.own)], sorted(self.asked - self.answered))
            self.answered |= self.asked
        done = all(r in self.heard for r in self.peers)
        if not done and self.ask_at is not None and now >= self.ask_at:
            self.ask_at = None
            self._send(_ASK, [(self.me, self.own)], [r for r in self.peers if r not in self.heard])
        over = done or now >= self.until
        self.tell(now=over)  # a rank that stops listening passes on all it knows first
        return over
