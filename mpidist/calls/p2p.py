"""Point-to-point: send/recv, isend/irecv, P2POp and batch_isend_irecv on MPI messages.

Peers are global ranks (``dst``/``src``) or group ranks (``group_dst``/``group_src``/
``group_peer``), as in torch. Tags follow :mod:`mpidist.core.tags`.
"""

from __future__ import annotations

from typing import Any, Callable

from mpi4py import MPI

from .. import gpu
from ..core import errors
from ..core.buffers import as_buffer
from ..core.groups import NON_GROUP_MEMBER, ProcessGroup, group_rank_of, resolve
from ..core.registry import absent, define
from ..core.tags import mpi_tag
from ..core.timeouts import wait
from ..core.work import Work


def peer_rank(pg: ProcessGroup, global_rank: Any, grp_rank: Any, call: Any, what: str,
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


def _check_count(arr: Any, status: MPI.Status, call: Any, pg: ProcessGroup, d: Any) -> None:
    got = status.Get_count(d.mpi)
    if got != arr.size:
        sender = pg.ranks[status.Get_source()]
        raise errors.value_error(
            call, f"received {got} elements from rank {sender} into 'tensor' of {arr.size}; "
            "sender and receiver must pass arrays of the same size"
        )


def _truncated(exc: Exception, arr: Any, call: Any) -> Exception:
    """A receive's truncation said in the receiver's terms (``exc``: :func:`errors.from_mpi`'s)."""
    if getattr(exc, "mpi_error_class", None) == MPI.ERR_TRUNCATE:
        return errors.value_error(
            call, f"the incoming message is larger than 'tensor' ({arr.size} elements)"
        )
    return exc


@define(gpu_direct=True, hooked=False)
def send(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0,
         group_dst: int | None = None) -> None:
    """Send ``tensor`` to rank ``dst`` (global) or ``group_dst`` (``MPI_Send``)."""
    call = send.call
    if group is NON_GROUP_MEMBER:  # torch's rule: warn and return
        return absent(call)
    pg = resolve(group, call)
    staging: list = []
    arr, d = as_buffer(tensor, call, "tensor", False, staging)
    try:
        buf = [arr, d.mpi]
        wait((pg.comm.Isend(buf, peer_rank(pg, dst, group_dst, call, "dst"), mpi_tag(tag, call)),),
             pg, call, buf)
    finally:
        gpu.release(staging)  # a staged GPU buffer goes back to the pool once sent


@define(gpu_direct=True, hooked=False)
def recv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0,
         group_src: int | None = None) -> int:
    """Receive into ``tensor`` from ``src`` (any rank when ``None``); return the sender's global rank.

    Becomes ``MPI_Recv`` (``MPI_ANY_SOURCE`` without a source).
    """
    call = recv.call
    if group is NON_GROUP_MEMBER:  # torch's rule: warn and return
        return absent(call)
    pg = resolve(group, call)
    staging: list = []
    arr, d = as_buffer(tensor, call, "tensor", True, staging)
    try:
        source = peer_rank(pg, src, group_src, call, "src", any_source=True)
        status = MPI.Status()
        buf = [arr, d.mpi]
        try:
            wait((pg.comm.Irecv(buf, source, mpi_tag(tag, call)),), pg, call, buf, [status])
        except (ValueError, errors.MPICallError) as exc:
            raise _truncated(exc, arr, call) from exc
        _check_count(arr, status, call, pg, d)
    except BaseException:
        gpu.release(staging)
        raise
    finish = gpu.completion(staging, None, tensor)  # a staged GPU buffer: copy the message back
    if finish is not None:
        finish()
    return pg.ranks[status.Get_source()]


@define(gpu_direct=True, hooked=False)
def isend(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0,
          group_dst: int | None = None) -> Work:
    """Start sending ``tensor`` (``MPI_Isend``); the returned Work completes the send."""
    call = isend.call
    if group is NON_GROUP_MEMBER:  # torch's rule: warn and return
        return absent(call)
    pg = resolve(group, call)
    staging: list = []
    arr, d = as_buffer(tensor, call, "tensor", False, staging)
    try:
        req = pg.comm.Isend([arr, d.mpi], peer_rank(pg, dst, group_dst, call, "dst"), mpi_tag(tag, call))
    except BaseException:
        gpu.release(staging)
        raise
    return Work((req,), call, gpu.completion(staging, None, None), tensor, pg, keep=arr)


@define(gpu_direct=True, hooked=False)
def irecv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0,
          group_src: int | None = None) -> Work:
    """Start receiving into ``tensor`` (``MPI_Irecv``); ``src=None`` receives from any rank.

    ``work.source_rank()`` gives the sender's group rank once done.
    """
    call = irecv.call
    if group is NON_GROUP_MEMBER:  # torch's rule: warn and return
        return absent(call)
    pg = resolve(group, call)
    staging: list = []
    arr, d = as_buffer(tensor, call, "tensor", True, staging)
    try:
        source = peer_rank(pg, src, group_src, call, "src", any_source=True)
        req = pg.comm.Irecv([arr, d.mpi], source, mpi_tag(tag, call))
    except BaseException:
        gpu.release(staging)
        raise
    status = MPI.Status()
    check = gpu.completion(staging, lambda: _check_count(arr, status, call, pg, d), tensor)
    return Work((req,), call, check, tensor, pg, keep=arr, statuses=[status])


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


@define(group_arg="", hooked=False)
def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[Work]:
    """Start every operation of ``p2p_op_list`` at once; return one Work per operation."""
    call = batch_isend_irecv.call
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
