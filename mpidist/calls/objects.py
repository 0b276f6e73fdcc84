"""Object collectives: picklable Python objects over MPI, as :mod:`mpidist.calls.pickles` messages.

Each call first exchanges a 512-byte slot per rank (the message's size, and the message
itself when it is small), then the messages that did not fit, with the nonblocking MPI
routines waited on within the group's timeout (:mod:`mpidist.core.timeouts`): a missing rank makes
every waiting rank raise, as in the array calls. An object that cannot be pickled raises on
every rank. (mpi4py's pickling calls, ``pkl5`` included,
block inside MPI and cannot.) A receive probes for its message (``MPI_Improbe``, safe with
several receiving threads) and takes exactly that message (``MPI_Imrecv``). Results are
written into the caller's lists, as torch does; arrays in them are views of the received
bytes. Objects only ever arrive over MPI from ranks of the same job; nothing here reads a socket.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from ..checks import debug
from ..checks.fingerprint import LENGTH, ROOT, agree
from ..core import errors, ranklists
from ..core.groups import NON_GROUP_MEMBER, ProcessGroup, group_rank_of, resolve
from ..core.registry import absent, define
from ..core.tags import MAX_TAG, OBJECTS, mpi_tag
from ..core.timeouts import QUICK_TESTS, until, wait
from .p2p import peer_rank
from .path import displacements, start
from .pickles import APART, INLINE, Pickled, datatype, load, pieces, read_head, unit_for, units


def _start(pg: ProcessGroup, sig: tuple | None = None) -> MPI.Intracomm:
    """The group's communicator, taken right before a collective's first MPI call, after the
    cross-rank check of the call's signature ``sig`` (:func:`mpidist.calls.path.start`)."""
    start(pg, sig)
    return pg.comm


def _p2p(pg: ProcessGroup) -> MPI.Intracomm:
    """The group's communicator for a point-to-point part: no call number, since
    ``ProcessGroup.seq`` counts collectives, which every member makes alike (the timeout's
    notices go by it); debug mode's record of the call is settled."""
    if debug.LEVEL:
        debug.check(pg, None)
    return pg.comm


#: The first exchange of every call carries a slot of this many bytes per rank: the head's
#: size, and the head itself when it fits (:data:`FITS` bytes), so that a small object takes
#: one collective, not two.
SLOT = 512
_AT = 64  # where the head starts in a slot (ALIGN: arrays in it stay aligned)
FITS = SLOT - _AT


#: The size a rank sends in place of its head's when its object could not be pickled.
FAILED = -1


def _pickled(obj: Any, apart: int = INLINE, channel: int = 0) -> Pickled | BaseException:
    """``obj`` pickled, or the error pickling raised (sent on as :data:`FAILED`, raised after)."""
    try:
        return Pickled(obj, apart, channel)
    except Exception as exc:  # noqa: BLE001 - every rank must hear of it before it is raised
        return exc


def _failed(pg: ProcessGroup, call: Any, sizes: Sequence[int], mine: Any, what: str) -> None:
    """Raise on every rank when a rank could not pickle: its own error there, a ValueError elsewhere."""
    bad = [pg.ranks[r] for r, n in enumerate(sizes) if n == FAILED]
    if not bad:
        return
    if isinstance(mine, BaseException):
        raise mine
    who = ranklists.plural(bad)
    raise errors.value_error(call, f"{who} could not pickle {what} (the error is raised there)")


def _slot(mine: Pickled | BaseException | None) -> np.ndarray:
    slot = np.empty(SLOT, np.uint8)
    size = 0 if mine is None else FAILED if isinstance(mine, BaseException) else mine.nbytes
    slot[:8].view(np.int64)[0] = size
    if isinstance(mine, Pickled) and mine.nbytes <= FITS:
        mine.copy_into(slot[_AT:])
    return slot


def _slots(pg: ProcessGroup, call: Any, comm: MPI.Intracomm, mine: Pickled | BaseException
           ) -> tuple[np.ndarray, list[int]]:
    """Every rank's slot (``MPI_Iallgather``), and every rank's head size."""
    every = np.empty((pg._size, SLOT), np.uint8)
    bufs = ([_slot(mine), MPI.BYTE], [every, MPI.BYTE])
    wait((comm.Iallgather(*bufs),), pg, call, bufs)
    return every, every[:, :8].copy().view(np.int64).ravel().tolist()


def _exchange(pg: ProcessGroup, call: Any, obj: Any, root: int | None,
              sig: tuple | None = None) -> list[Any] | None:
    """Every rank's ``obj``, on every rank (``root=None``) or on ``root`` (else ``None``).

    One ``MPI_Iallgather`` of the slots; if a head did not fit in its slot, then
    ``MPI_Iallgatherv`` (``MPI_Igatherv`` to ``root``) of every head.
    """
    comm = _start(pg, sig)
    mine = _pickled(obj)
    every, sizes = _slots(pg, call, comm, mine)
    _failed(pg, call, sizes, mine, "its object")
    if max(sizes) <= FITS:
        return [load(every[r], _AT) for r in range(pg._size)] if root in (None, pg._rank) else None
    whole, offsets = _gatherv(pg, call, comm, mine, sizes, root)
    return [load(whole, off) for off in offsets] if root in (None, pg._rank) else None


def _gatherv(pg: ProcessGroup, call: Any, comm: MPI.Intracomm, mine: Pickled,
             sizes: list[int], root: int | None) -> tuple[np.ndarray, list[int]]:
    """Every rank's head back to back (``MPI_Iallgatherv``, or ``MPI_Igatherv`` to ``root``),
    and where each starts. Off the root the bytes are empty."""
    unit = unit_for(sum(sizes))
    counts = [units(s, unit) for s in sizes]
    offsets = [d * unit for d in displacements(counts)]
    here = root is None or pg._rank == root
    whole = np.empty(sum(counts) * unit if here else 0, np.uint8)
    with datatype(unit) as dt:
        bufs = ([mine.head(unit), counts[pg._rank], dt], [whole, (counts, displacements(counts)), dt])
        if root is None:
            req = comm.Iallgatherv(*bufs)
        else:
            req = comm.Igatherv(bufs[0], bufs[1] if here else None, root)
        wait((req,), pg, call, bufs)
    return whole, offsets


def allgather(pg: ProcessGroup, call: Any, obj: Any) -> list[Any]:
    """Every rank's ``obj`` on every rank, in rank order (for mpidist's own exchanges too)."""
    return _exchange(pg, call, obj, None, (str(call),))


def _bcast(pg: ProcessGroup, call: Any, comm: MPI.Intracomm, obj: Any, root: int) -> Any:
    """The root's ``obj`` on every rank: ``MPI_Ibcast`` of a slot (the head's size, and the head
    if it fits), then of the head if it did not, then of each large buffer, into an array of
    its own."""
    mine = _pickled(obj, APART) if pg._rank == root else None
    slot = _slot(mine)
    wait((comm.Ibcast([slot, MPI.BYTE], root),), pg, call, slot)
    size = int(slot[:8].view(np.int64)[0])
    sizes = [0] * pg._size
    sizes[root] = size
    _failed(pg, call, sizes, mine, "object_list")
    if size <= FITS:
        head, at = slot, _AT
    else:
        unit = unit_for(size)
        head, at = (mine.head(unit) if mine is not None else np.empty(units(size, unit) * unit, np.uint8)), 0
        with datatype(unit) as dt:
            wait((comm.Ibcast([head, head.size // unit, dt], root),), pg, call, head)
    if mine is not None:
        bufs = mine.apart
        layout = mine.layout
    else:
        layout = read_head(head, at, APART)
        bufs = [np.empty(n, np.uint8) for n in layout.apart()]
    if bufs:
        msgs = [p for b in bufs for p in pieces(b)]
        wait([comm.Ibcast([m, MPI.BYTE], root) for m in msgs], pg, call, msgs)
    return obj if mine is not None else load(head, at, bufs, layout)


def _list(obj: Any, call: Any, arg: str, length: int | None = None) -> list:
    if not isinstance(obj, list):
        raise errors.type_error(call, f"argument '{arg}' must be a list, got {errors.type_name(obj)}")
    if length is not None and len(obj) != length:
        raise errors.value_error(
            call, f"argument '{arg}' has {len(obj)} entries; the group has {length} ranks"
        )
    return obj


@define(fingerprint=agree(src=ROOT, object_list=LENGTH), signature=("length", "src"))
def broadcast_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                          device: Any = None, group_src: int | None = None) -> None:
    """Replace every rank's ``object_list`` contents with ``src``'s.

    Becomes ``MPI_Ibcast`` of the pickle (its size first, unless it is small), then of each
    large array in it. Every rank passes a list of the same length; only ``src``'s contents
    matter.
    """
    call = broadcast_object_list.call
    pg = resolve(group, call)
    root = group_rank_of(pg, src, group_src, call, "src")
    _list(object_list, call, "object_list")
    comm = _start(pg, (call.name, len(object_list), pg.ranks[root]))
    received = _bcast(pg, call, comm, object_list if pg._rank == root else None, root)
    if pg._rank != root:
        if len(received) != len(object_list):
            raise errors.value_error(
                call, f"the source sent {len(received)} objects but 'object_list' has "
                f"{len(object_list)} entries"
            )
        object_list[:] = received


@define(fingerprint=agree())
def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """Every rank's ``obj`` into ``object_list[rank]`` on every rank.

    Becomes ``MPI_Iallgather`` of a slot per rank (the pickle's size, and the pickle if it is
    small), then, for larger ones, ``MPI_Iallgatherv`` of the pickles.
    """
    call = all_gather_object.call
    pg = resolve(group, call)
    _list(object_list, call, "object_list", pg._size)
    object_list[:] = allgather(pg, call, obj)


@define(fingerprint=agree(dst=ROOT), signature=("dst",))
def gather_object(obj: Any, object_gather_list: list[Any] | None = None, dst: int | None = None,
                  group: Any = None, group_dst: int | None = None) -> None:
    """Every rank's ``obj`` into ``object_gather_list`` on ``dst``.

    Becomes ``MPI_Iallgather`` of a slot per rank (the pickle's size, and the pickle if it is
    small: every rank must know the sizes, as in torch), then, for larger ones,
    ``MPI_Igatherv`` of the pickles. Only the destination passes a list (of group size); the
    others pass ``None``.
    """
    call = gather_object.call
    pg = resolve(group, call)
    root = group_rank_of(pg, dst, group_dst, call, "dst")
    if pg._rank == root:
        if object_gather_list is None:
            raise errors.value_error(call, "object_gather_list is required on the destination rank")
        _list(object_gather_list, call, "object_gather_list", pg._size)
    elif object_gather_list:
        raise errors.value_error(call, "object_gather_list must be given only on the destination rank")
    got = _exchange(pg, call, obj, root, (call.name, pg.ranks[root]))
    if got is not None:
        object_gather_list[:] = got


@define(fingerprint=agree(src=ROOT), signature=("src",))
def scatter_object_list(scatter_object_output_list: list[Any],
                        scatter_object_input_list: list[Any] | None = None,
                        src: int | None = None, group: Any = None,
                        group_src: int | None = None) -> None:
    """``src``'s ``scatter_object_input_list[i]`` into rank i's ``scatter_object_output_list[0]``.

    Becomes ``MPI_Ibcast`` of the pickles' sizes, then ``MPI_Iscatterv`` of the pickles; from
    ``SCATTER_APART`` bytes in all, ``MPI_Isend`` of each rank's pickle, its large buffers
    sent as they are (``MPI_Iscatterv`` needs them copied into one buffer first).
    """
    call = scatter_object_list.call
    pg = resolve(group, call)
    root = group_rank_of(pg, src, group_src, call, "src")
    out = _list(scatter_object_output_list, call, "scatter_object_output_list")
    if not out:
        raise errors.value_error(call, "scatter_object_output_list must have at least one entry")
    if pg._rank == root:
        if scatter_object_input_list is None:
            raise errors.value_error(call, "scatter_object_input_list is required on the source rank")
        _list(scatter_object_input_list, call, "scatter_object_input_list", pg._size)
    comm = _start(pg, (call.name, pg.ranks[root]))
    sizes = np.zeros(pg._size, np.int64)
    failed: list[BaseException] = []
    if pg._rank == root:
        each = [_pickled(o) for o in scatter_object_input_list]
        failed = [p for p in each if isinstance(p, BaseException)]
        sizes[:] = FAILED if failed else [p.nbytes for p in each]
    wait((comm.Ibcast([sizes, MPI.INT64_T], root),), pg, call, sizes)
    _failed(pg, call, [FAILED if r == root and sizes[0] == FAILED else 0 for r in range(pg._size)],
            failed[0] if failed else None, "scatter_object_input_list")
    if int(sizes.sum()) >= SCATTER_APART:
        if pg._rank != root:
            out[0] = _recv(pg, call, root, MPI.Status())
            return
        sent = [_post(comm, call, o, r) for r, o in enumerate(scatter_object_input_list) if r != root]
        mine = each[root].head()  # the source's own object: a copy, as every other rank's
        wait([q for reqs, _ in sent for q in reqs], pg, call, [m for _, msgs in sent for m in msgs])
        out[0] = load(mine)
        return
    unit = unit_for(int(sizes.sum()))
    counts = [units(int(s), unit) for s in sizes]
    mine = np.empty(counts[pg._rank] * unit, np.uint8)
    with datatype(unit) as dt:
        send = None
        if pg._rank == root:  # MPI_Scatterv sends from one buffer: the heads copied into it
            whole = np.empty(sum(counts) * unit, np.uint8)
            for p, at in zip(each, displacements(counts)):
                p.copy_into(whole[at * unit:])
            send = [whole, (counts, displacements(counts)), dt]
        bufs = (send, [mine, dt])
        wait((comm.Iscatterv(*bufs, root),), pg, call, bufs)
    out[0] = load(mine)


_channels = itertools.count()


#: A scatter_object_list whose pickles take this many bytes in all sends each rank its own
#: (16 MiB to each of 2 ranks: 14 ms through one ``MPI_Iscatterv``, which needs the pickles
#: copied into one fresh buffer first, against 3 ms for mpi4py's ``pkl5``).
SCATTER_APART = 1 << 20


def _send(pg: ProcessGroup, call: Any, obj: Any, peer: int) -> None:
    """``obj`` to ``peer`` (:func:`_post`), waited on."""
    reqs, msgs = _post(_p2p(pg), call, obj, peer)
    wait(reqs, pg, call, msgs)


def _post(comm: MPI.Intracomm, call: Any, obj: Any, peer: int) -> tuple[list[MPI.Request], list]:
    """Start sending ``obj`` to ``peer``: its head (``MPI_Isend`` on the object tag), then each
    large buffer on a tag of its own message (so no other receive can take them). The requests,
    and the messages they send from."""
    channel = mpi_tag(1 + next(_channels) % MAX_TAG, call, OBJECTS)
    mine = Pickled(obj, APART, channel)
    unit = unit_for(mine.nbytes)
    head = mine.head(unit)
    with datatype(unit) as dt:  # freed once the sends start: MPI lets them finish
        msgs = [[head, head.size // unit, dt]] + [[p, MPI.BYTE] for b in mine.apart for p in pieces(b)]
        reqs = [comm.Isend(msgs[0], peer, mpi_tag(0, call, OBJECTS))]
        reqs += [comm.Isend(m, peer, channel) for m in msgs[1:]]
    return reqs, msgs


def _recv(pg: ProcessGroup, call: Any, source: int, status: MPI.Status) -> Any:
    """The next object from ``source``: the head, whatever its size (``MPI_Improbe``,
    ``MPI_Imrecv``), then the buffers sent apart, from its sender on its channel."""
    comm = _p2p(pg)
    tag = mpi_tag(0, call, OBJECTS)
    found: list[MPI.Message] = []

    def probed() -> bool:
        for _ in range(QUICK_TESTS):
            m = comm.Improbe(source, tag, status)
            if m is not None:
                found.append(m)
                return True
        return False

    if not probed():
        until(probed, pg, call)
    nbytes = status.Get_elements(MPI.BYTE)
    unit = unit_for(nbytes)
    head = np.empty(nbytes, np.uint8)
    with datatype(unit) as dt:
        wait((found[0].Irecv([head, nbytes // unit, dt]),), pg, call, head)
    layout = read_head(head, 0, APART)
    bufs = [np.empty(n, np.uint8) for n in layout.apart()]
    if bufs:
        sender, channel = status.Get_source(), int(layout.index[2])
        msgs = [p for b in bufs for p in pieces(b)]
        wait([comm.Irecv([m, MPI.BYTE], sender, channel) for m in msgs], pg, call, msgs)
    return load(head, 0, bufs, layout)


@define(hooked=False)
def send_object_list(object_list: list[Any], dst: int | None = None, group: Any = None,
                     device: Any = None, group_dst: int | None = None, use_batch: bool = False) -> None:
    """Send the objects of ``object_list`` to ``dst`` (``MPI_Isend`` of one pickle).

    ``use_batch`` is accepted for torch's signature: torch's batched path exists to avoid
    two-rank communicators, which MPI's point-to-point never makes.
    """
    call = send_object_list.call
    if group is NON_GROUP_MEMBER:  # torch's rule: warn and return
        return absent(call)
    pg = resolve(group, call)
    peer = peer_rank(pg, dst, group_dst, call, "dst")
    _list(object_list, call, "object_list")
    _send(pg, call, list(object_list), peer)


@define(hooked=False)
def recv_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                     device: Any = None, group_src: int | None = None, use_batch: bool = False) -> int:
    """Receive objects into ``object_list`` (same length as sent); return the sender's global rank.
    ``use_batch`` is accepted as in :func:`send_object_list`.

    Becomes ``MPI_Improbe`` and ``MPI_Imrecv``; ``src=None`` receives from any rank
    (``MPI_ANY_SOURCE``).
    """
    call = recv_object_list.call
    if group is NON_GROUP_MEMBER:  # torch's rule: warn and return
        return absent(call)
    pg = resolve(group, call)
    source = peer_rank(pg, src, group_src, call, "src", any_source=True)
    _list(object_list, call, "object_list")
    status = MPI.Status()
    received = _recv(pg, call, source, status)
    sender = pg.ranks[status.Get_source()]
    if len(received) != len(object_list):
        raise errors.value_error(
            call, f"rank {sender} sent {len(received)} objects but 'object_list' has "
            f"{len(object_list)} entries"
        )
    object_list[:] = received
    return sender

