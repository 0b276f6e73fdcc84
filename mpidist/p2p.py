"""Point-to-point: send/recv, isend/irecv, P2POp and batch_isend_irecv on MPI messages.

Peers are global ranks (``dst``/``src``) or group ranks (``group_dst``/``group_src``/
``group_peer``), as in torch. User tags travel as even MPI tags and object messages
(:mod:`mpidist.objects`) as odd ones, so an any-source ``recv`` of an array never
matches a pickled object on the same communicator.
"""

from __future__ import annotations

from typing import Any, Callable

from mpi4py import MPI

from . import errors
from .buffers import as_buffer, complete
from .groups import ProcessGroup, group_rank_of, resolve
from .work import Work, seconds

#: Largest tag a user may pass (half of MPI's ``MPI_TAG_UB``: tags are shared with objects;
#: the top pair of MPI tags belongs to ``monitored_barrier``).
MAX_TAG = (MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) - 1) // 2 - 1


def mpi_tag(tag: Any, call: str, channel: int = 0) -> int:
    """The MPI tag for user tag ``tag`` on ``channel`` (0 arrays, 1 objects)."""
    if isinstance(tag, bool) or not isinstance(tag, int):
        raise errors.type_error(call, f"tag must be an int, got {tag!r}")
    if not 0 <= tag <= MAX_TAG:
        raise errors.value_error(call, f"tag={tag} is outside 0..{MAX_TAG}")
    return 2 * tag + channel


def peer_rank(pg: ProcessGroup, global_rank: Any, grp_rank: Any, call: str, what: str,
              any_source: bool = False) -> int:
    """The group rank of the peer; ``MPI.ANY_SOURCE`` when a receive names none."""
    if any_source and global_rank is None and grp_rank is None:
        return MPI.ANY_SOURCE
    r = group_rank_of(pg, global_rank, grp_rank, call, what)
    if r == pg._rank:
        raise errors.value_error(
            call, f"{what} is this rank itself; send and receive need a different peer"
        )
    return r


def _check_count(arr: Any, status: MPI.Status, call: str, pg: ProcessGroup, d: Any) -> None:
    got = status.Get_count(d.mpi)
    if got != arr.size:
        sender = pg.ranks[status.Get_source()]
        raise errors.value_error(
            call, f"received {got} elements from rank {sender} into 'tensor' of {arr.size}; "
            "sender and receiver must pass arrays of the same size"
        )


def _truncated(exc: MPI.Exception, arr: Any, call: str) -> Exception:
    if exc.Get_error_class() == MPI.ERR_TRUNCATE:
        return errors.value_error(
            call, f"the incoming message is larger than 'tensor' ({arr.size} elements)"
        )
    return exc


def send(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0,
         group_dst: int | None = None) -> None:
    """Send ``tensor`` to rank ``dst`` (global) or ``group_dst`` (``MPI_Send``)."""
    call = "send"
    pg = resolve(group, call)
    arr, d = as_buffer(tensor, call, "tensor", False)
    finish = complete(None, None)  # a staged GPU buffer goes back to the pool once sent
    pg.comm.Send([arr, d.mpi], peer_rank(pg, dst, group_dst, call, "dst"), mpi_tag(tag, call))
    if finish is not None:
        finish()


def recv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0,
         group_src: int | None = None) -> int:
    """Receive into ``tensor`` from ``src`` (any rank when ``None``); return the sender's global rank.

    Becomes ``MPI_Recv`` (``MPI_ANY_SOURCE`` without a source).
    """
    call = "recv"
    pg = resolve(group, call)
    arr, d = as_buffer(tensor, call, "tensor", True)
    source = peer_rank(pg, src, group_src, call, "src", any_source=True)
    status = MPI.Status()
    finish = complete(None, tensor)  # a staged GPU buffer: copy the message back to the device
    try:
        pg.comm.Recv([arr, d.mpi], source, mpi_tag(tag, call), status)
    except MPI.Exception as exc:
        raise _truncated(exc, arr, call) from exc
    _check_count(arr, status, call, pg, d)
    if finish is not None:
        finish()
    return pg.ranks[status.Get_source()]


def isend(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0,
          group_dst: int | None = None) -> Work:
    """Start sending ``tensor`` (``MPI_Isend``); the returned Work completes the send."""
    call = "isend"
    pg = resolve(group, call)
    arr, d = as_buffer(tensor, call, "tensor", False)
    req = pg.comm.Isend([arr, d.mpi], peer_rank(pg, dst, group_dst, call, "dst"),
                        mpi_tag(tag, call))
    return Work((req,), call, complete(None, None), tensor, seconds(pg.timeout), keep=arr)


def irecv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0,
          group_src: int | None = None) -> Work:
    """Start receiving into ``tensor`` (``MPI_Irecv``); ``src=None`` receives from any rank.

    ``work.source_rank()`` gives the sender's group rank once done.
    """
    call = "irecv"
    pg = resolve(group, call)
    arr, d = as_buffer(tensor, call, "tensor", True)
    source = peer_rank(pg, src, group_src, call, "src", any_source=True)
    status = MPI.Status()
    req = pg.comm.Irecv([arr, d.mpi], source, mpi_tag(tag, call))
    return Work((req,), call, complete(lambda: _check_count(arr, status, call, pg, d), tensor), tensor,
                seconds(pg.timeout), keep=arr, statuses=[status])


class P2POp:
    """One operation for :func:`batch_isend_irecv`: ``P2POp(isend, tensor, peer)``.

    ``op`` is :func:`isend` or :func:`irecv`; ``peer`` is a global rank, ``group_peer``
    a group rank.
    """

    __slots__ = ("op", "tensor", "peer", "group", "tag", "group_peer")

    def __init__(self, op: Callable[..., Work], tensor: Any, peer: int | None = None,
                 group: Any = None, tag: int = 0, group_peer: int | None = None) -> None:
        if op not in (isend, irecv):
            name = getattr(op, "__name__", repr(op))
            raise errors.value_error(
                "P2POp", f"op must be mpidist.isend or mpidist.irecv, got {name}"
            )
        self.op, self.tensor, self.peer = op, tensor, peer
        self.group, self.tag, self.group_peer = group, tag, group_peer

    def __repr__(self) -> str:
        return f"P2POp({self.op.__name__}, peer={self.peer}, group_peer={self.group_peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[Work]:
    """Start every operation of ``p2p_op_list`` at once; return one Work per operation."""
    call = "batch_isend_irecv"
    if not isinstance(p2p_op_list, (list, tuple)) or not p2p_op_list:
        raise errors.value_error(call, "p2p_op_list must be a non-empty list of P2POp")
    for i, p in enumerate(p2p_op_list):
        if not isinstance(p, P2POp):
            raise errors.type_error(call, f"p2p_op_list[{i}] must be a P2POp, got {p!r}")
    works = []
    for p in p2p_op_list:
        if p.op is isend:
            works.append(isend(p.tensor, p.peer, p.group, p.tag, group_dst=p.group_peer))
        else:
            works.append(irecv(p.tensor, p.peer, p.group, p.tag, group_src=p.group_peer))
    return works
