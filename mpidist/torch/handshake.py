"""A bounded meeting of chosen processes before a call that MPI cannot bound.

``MPI_Comm_create_from_group`` waits until every process of the group calls it, for ever if one
never does. :func:`handshake` comes first: the processes meet with nonblocking point-to-point
messages within a timeout, and past it every one of them raises ``RuntimeError`` ("Timed out")
naming the processes not heard from, so that none enters the creation that another has left.

The messages travel on a communicator no group uses (:func:`prepare`), which the revoke of a
group's communicator under ULFM does not reach; every wait sleeps in the backoff of
:mod:`mpidist.core.waiting`. Processes are named by their ``MPI_COMM_WORLD`` ranks.
"""

from __future__ import annotations

import hashlib
from typing import Mapping

import numpy as np
from mpi4py import MPI

from ..core import errors, job
from ..core.timeouts import grace
from ..core.waiting import Backoff, deadline, poll
from ..start import spares

#: The handshake's tags on its communicator: arrivals at the first listed process, and its answers.
#: On the spares' control communicator (:mod:`mpidist.start.spares`) they differ from its own tag.
ARRIVE, ANSWER = spares.TAG + 1, spares.TAG + 2
#: What an arrival says: here, or gone (the caller's timeout passed first).
HERE, GONE = 1, 2
#: What the first listed process answers.
GO, TIMED_OUT, GAVE_UP, MISMATCH, FAILED = 0, 1, 2, 3, 4

#: The handshake's communicator when the job has no control communicator of its own.
_channel: list[MPI.Intracomm] = []
#: The handshake's sends until they complete, with their buffers (none is waited for: a process
#: that has not arrived takes its answer when it does, or never).
_sends: list[tuple[MPI.Request, np.ndarray]] = []


def prepare(comm: MPI.Intracomm) -> None:
    """Make the handshake's communicator, ``MPI_Comm_dup`` of ``comm`` (torch's new default group,
    collective over it), unless the job has one already: a job with spares has the control
    communicator every process made at start (so a spare called in makes no call here that the
    survivors would have to repeat)."""
    if job.control is not None:
        return
    dup = comm.Dup()
    dup.Set_errhandler(MPI.ERRORS_RETURN)
    old, _channel[:] = _channel[:], [dup]
    for c in old:
        try:
            c.Free()
        except MPI.Exception:
            pass  # under ULFM, a communicator with a dead member: gone either way


def channel(call: str) -> MPI.Intracomm:
    """The handshake's communicator (never revoked: no group's failure reaches it)."""
    if job.control is not None:
        return job.control
    if not _channel:
        raise errors.runtime_error(call, "torch's default group was not made on the 'mpidist' backend "
                                         "(init_process_group('mpidist') first)")
    return _channel[0]


def digest(ranks: list[int]) -> int:
    """A 64-bit digest of the ordered member list: members that listed other handles or another
    order are told so instead of making different groups."""
    return int.from_bytes(hashlib.blake2b(repr(ranks).encode(), digest_size=8).digest(), "little")


def _prune() -> None:
    """Drop the answers to latecomers that have gone out (or failed: the receiver died)."""
    keep = []
    for req, buf in _sends:
        try:
            if not req.Test():
                keep.append((req, buf))
        except MPI.Exception:
            pass
    _sends[:] = keep


def handshake(ranks: list[int], uuid: int, limit: float | None, call: str,
              who: Mapping[int, str]) -> None:
    """Meet the processes ``ranks`` (``MPI_COMM_WORLD`` ranks, in group order), all calling this
    with the same ``uuid``, within ``limit`` seconds (``None``: no limit); ``who`` names each
    rank in errors (the handle it was given by).

    The first listed process in ``MPI_COMM_WORLD`` order (the same for any order of the list)
    gathers an arrival from each of the others (``MPI_Irecv`` from each, tested with
    ``MPI_Testsome`` in a sleeping backoff) and answers each (``MPI_Isend``): go, or why not. A
    process whose own deadline passes first says it is gone and waits a grace period for the
    answer, so that no process enters ``MPI_Comm_create_from_group`` that another has left.
    Messages of an earlier handshake (another uuid) are read and dropped. Raises
    ``RuntimeError`` ("Timed out", naming those not heard from) past the deadline, or when the
    processes listed other ranks or another order.
    """
    if len(ranks) == 1:
        return
    comm = channel(call)
    where = job.translate(ranks, comm)
    lost = [who[r] for r, c in zip(ranks, where) if c == MPI.UNDEFINED]
    if lost:
        raise errors.value_error(call, f"handles {lost} name processes outside this job (spares still "
                                       "waiting, or started apart)")
    _prune()
    m = _Meeting(comm, dict(zip(ranks, where)), uuid, digest(ranks), limit, call, who)
    try:
        if MPI.COMM_WORLD.Get_rank() == min(ranks):
            m.gather([r for r in ranks if r != min(ranks)])
        else:
            m.arrive(min(ranks))
    except MPI.Exception as exc:
        raise errors.runtime_error(call, f"MPI failed in the handshake before MPI_Comm_create_from_group "
                                         f"({exc.Get_error_string()}); under ULFM list only live processes"
                                   ) from None


def _signed(word: int) -> int:
    """A uuid as sent (unsigned 64-bit) back as torch's signed one."""
    return word - (1 << 64) if word >= 1 << 63 else word


class _Meeting:
    """One handshake as this process sees it."""

    def __init__(self, comm: MPI.Intracomm, place: dict[int, int], uuid: int, check: int,
                 limit: float | None, call: str, who: Mapping[int, str]) -> None:
        self.comm, self.place, self.check = comm, place, check
        self.limit, self.call, self.who = limit, call, who
        self.word = uuid & (2**64 - 1)  # the uuid as sent (torch's is a signed 64-bit int)
        self.end = deadline(limit)

    def gather(self, others: list[int]) -> None:
        """The first listed process: arrivals from ``others``, then the answer to each."""
        comm, place = self.comm, self.place
        inbox = np.zeros((len(others), 3), np.uint64)  # uuid, digest, HERE/GONE
        reqs = [comm.Irecv([inbox[i], MPI.UINT64_T], place[r], ARRIVE) for i, r in enumerate(others)]
        here: dict[int, int] = {}  # index in others -> its digest
        gone: set[int] = set()
        elsewhere: dict[int, int] = {}  # a listed process that arrived with another uuid -> that uuid

        def progress() -> bool:
            for i in MPI.Request.Testsome(reqs) or ():
                u, d, kind = (int(x) for x in inbox[i])
                if u == self.word and kind == GONE:
                    gone.add(i)
                    continue
                if u == self.word:
                    here[i] = d
                elif kind == HERE:
                    elsewhere[others[i]] = u
                # an earlier handshake's message was dropped; after an arrival, listen for "gone"
                reqs[i] = comm.Irecv([inbox[i], MPI.UINT64_T], place[others[i]], ARRIVE)
            return bool(gone) or len(here) == len(others)

        failed = None
        try:
            poll(progress, self.end, Backoff())
            progress()  # a "gone" queued behind the arrival that completed the count
        except MPI.Exception as exc:  # under ULFM: a listed process died; the others are told
            failed = exc
        for req in reqs:
            try:
                if req:
                    req.Cancel()
                    req.Wait()
            except MPI.Exception:
                pass
        absent = [r for i, r in enumerate(others) if i not in here]
        wrong = [others[i] for i, d in here.items() if d != self.check]
        if wrong:
            verdict, named = MISMATCH, wrong
        elif failed is not None:
            verdict, named = FAILED, absent
        elif gone:
            verdict, named = GAVE_UP, [others[i] for i in sorted(gone)] + absent
        else:
            verdict, named = (TIMED_OUT, absent) if absent else (GO, [])
        answer = np.array([self.word, self.check, verdict, len(named), *named], np.uint64)
        for r in others:  # kept until sent: one that has not arrived takes its answer when it does
            try:
                _sends.append((comm.Isend([answer, MPI.UINT64_T], place[r], ANSWER), answer))
            except MPI.Exception:
                pass  # under ULFM: that process died; it waits for nothing
        if failed is not None:
            raise failed
        if verdict != GO:
            raise self.refusal(verdict, named, {r: u for r, u in elsewhere.items() if r in named})

    def arrive(self, first: int) -> None:
        """Any other listed process: say so to the first, then take its answer."""
        leader = self.place[first]
        for kind in (HERE, GONE):
            note = np.array([self.word, self.check, kind], np.uint64)
            _sends.append((self.comm.Isend([note, MPI.UINT64_T], leader, ARRIVE), note))
            answer = self.answer(leader, self.end if kind == HERE else deadline(grace(self.limit)))
            if answer is not None:
                break
        else:
            raise self.refusal(TIMED_OUT, [first])
        verdict, named = int(answer[2]), [int(r) for r in answer[4:4 + int(answer[3])]]
        if verdict == GO and int(answer[1]) != self.check:
            verdict, named = MISMATCH, [first]
        if verdict != GO:
            raise self.refusal(verdict, named)

    def answer(self, leader: int, end: float | None) -> np.ndarray | None:
        """The first process's answer for this uuid (``MPI_Improbe`` + ``MPI_Mrecv``; answers of
        earlier handshakes dropped), or ``None`` past ``end``."""
        got: list[np.ndarray] = []
        status = MPI.Status()

        def arrived() -> bool:
            while (msg := self.comm.Improbe(leader, ANSWER, status)) is not None:
                buf = np.empty(status.Get_count(MPI.UINT64_T), np.uint64)
                msg.Recv([buf, MPI.UINT64_T])
                if buf.size >= 4 and int(buf[0]) == self.word:
                    got.append(buf)
                    return True
            return False

        return got[0] if poll(arrived, end, Backoff()) else None

    def refusal(self, verdict: int, ranks: list[int], elsewhere: Mapping[int, int] | None = None
                ) -> RuntimeError:
        """The error for ``verdict`` naming ``ranks``; ``elsewhere``: those of them that arrived
        with another uuid (an earlier handshake's, or a mistake), by the uuid they sent."""
        who = [self.who.get(r, f"rank {r} of MPI_COMM_WORLD") for r in ranks]
        if verdict == MISMATCH:
            text = (f"the processes listed other handles or another order: {who} differ from the first "
                    "listed process; every process passes the same uuid and handles")
        elif verdict == FAILED:
            text = (f"MPI failed while the first listed process waited for {who} (under ULFM: a "
                    "listed process died); list only live processes")
        else:
            waited = "no limit" if self.limit is None else f"{self.limit:g} s"
            text = (f"Timed out ({waited}) waiting for {who}" + (" (gave up)" if verdict == GAVE_UP else "")
                    + f"; every listed process calls {self.call} with the same uuid and handles within "
                    "the timeout")
            if elsewhere:
                sent = ", ".join(f"{self.who.get(r, r)} with uuid {_signed(u)}" for r, u in elsewhere.items())
                text += f"; heard instead from {sent}, not {_signed(self.word)}"
        return errors.runtime_error(self.call, text)
