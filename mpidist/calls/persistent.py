"""Persistent requests for small blocking collectives: built once per group and shape, then started.

A nonblocking collective (``MPI_Iallreduce``) builds its schedule at every call; for a message of a
few bytes that costs more than the message. A persistent collective (MPI 4.0:
``MPI_Allreduce_init``, ``MPI_Bcast_init``, ``MPI_Barrier_init``) builds it once, and each call
is ``MPI_Start`` and the bounded wait (:func:`mpidist.core.timeouts.wait`), which keeps the
group's timeout. Measured with MPICH, 8 B all_reduce, ratio to the blocking ``MPI_Allreduce`` in
the same job: ``MPI_Iallreduce`` 1.34-1.47x at 2 ranks, ``MPI_Start`` 0.84-0.92x
(docs/benchmarks.md, "Persistent requests for small calls").

A persistent request reads and writes the buffer it was made with, so a call copies its data
in and the result out; below :data:`SMALL` bytes that costs less than it saves (at 64 KiB it
costs 1.18x, at 1 MiB 1.5x, so larger calls keep the nonblocking routine).

MPI orders the ``*_init`` calls with the group's other collectives, so every rank must make and
drop them at the same points: a group's requests are keyed by what the ranks agree on (shape,
dtype, op or root), made at a key's first call, and the oldest is freed once a group holds
:data:`MOST`, the same on every rank that makes the same calls.

**Off unless asked for** (``MPIDIST_PERSISTENT=1``, or :func:`enable` on every rank), because of
what happens when ranks disagree. Two ranks that pass different counts to the same nonblocking
``MPI_Iallreduce`` still complete it, and the default cross-rank check
(:mod:`mpidist.checks.signature`) names the call at its next check. Two different persistent
requests never match one another (MPICH 5.0.2: a 2-element request started against a
3-element one waits for ever, as does one started against an ``MPI_Iallreduce``), so with
persistent requests an unchecked call whose ranks disagree on its count, dtype or op waits
until the group's timeout and raises ``GroupTimeoutError`` there (the group is then broken).
Programs whose ranks are known to agree gain the latency (``MPIDIST_DEBUG=DETAIL``, which
checks every call first, keeps the nonblocking routine). An MPI without persistent collectives (before 4.0) is
detected at the first call and not asked again.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..core.buffers import DType
from ..core.groups import ProcessGroup, free_persistent, registry
from ..core.timeouts import failure, wait
from .ops import divide

#: Largest call (bytes) that goes through a persistent request.
SMALL = 4096
#: Most persistent requests kept per group (each holds one buffer of at most ``SMALL`` bytes).
MOST = 32
#: Whether persistent requests are used (``MPIDIST_PERSISTENT=1``; see :func:`enable`).
ON: bool = os.environ.get("MPIDIST_PERSISTENT", "0").strip().lower() in ("1", "on", "true", "yes")

IN_PLACE = MPI.IN_PLACE


def enable(on: bool = True) -> None:
    """Use persistent requests for small calls, or not (every rank of a job must do the same:
    the groups' requests are freed, and made again at their next calls)."""
    global ON
    ON = bool(on)
    for pg in list(registry.live.values()):
        free_persistent(pg)


#: ``id`` of each predefined MPI op: the only ops a persistent request is made for (they live as
#: long as the process, so their ``id`` names them; a user's op may be freed and its id reused).
PREDEFINED = {id(o) for o in (MPI.SUM, MPI.PROD, MPI.MIN, MPI.MAX, MPI.BAND, MPI.BOR, MPI.BXOR,
                              MPI.LAND, MPI.LOR, MPI.LXOR)}


def _cache(pg: ProcessGroup) -> dict | None:
    """The group's persistent requests (key -> entry); ``None`` where they are off or unsupported."""
    cache = pg.persistent
    if cache is None:
        cache = pg.persistent = {}
    return cache if ON and cache is not False else None


def _entry(pg: ProcessGroup, key: Any, init: Callable[[np.ndarray], MPI.Prequest],
           like: np.ndarray, *facts: Any) -> tuple | None:
    """``(request, buffer, *facts)`` for ``key``: cached, or the request made now by
    ``init(buffer)`` with a buffer like ``like``; ``None`` where persistent requests are off, or
    this MPI has none (then never asked again on ``pg``)."""
    cache = _cache(pg)
    if cache is None:
        return None
    entry = cache.get(key)
    if entry is not None:
        return entry
    buf = np.empty_like(like)
    try:
        req = init(buf)
    except (NotImplementedError, MPI.Exception):  # MPI before 4.0: the same on every rank
        pg.persistent = False
        return None
    if len(cache) >= MOST:  # the oldest goes: the same one on every rank
        cache.pop(next(iter(cache)))[0].Free()
    entry = cache[key] = (req, buf, *facts)
    return entry


def _run(pg: ProcessGroup, call: Any, req: MPI.Prequest, buf: np.ndarray) -> None:
    """Start ``req`` and wait for it within the group's timeout, as every call does; an MPI
    error raised as mpidist's (a dead peer under ULFM: ``ProcessFailureError``)."""
    try:
        try:
            req.Start()
            if not req.Test():
                wait((req,), pg, call, buf)
        except MPI.Exception as exc:
            raise failure(pg, call, exc, buf) from None
    except BaseException:
        _set_aside(pg, req, buf)
        raise


def _set_aside(pg: ProcessGroup, req: MPI.Prequest, buf: np.ndarray) -> None:
    """After a call on ``req`` raised: keep it (it may still be active, and a collective's request
    cannot be freed or cancelled) out of the cache; on a group now broken, free the others."""
    cache = pg.persistent
    if not cache:
        return
    for key, entry in list(cache.items()):
        if entry[0] is req:
            del cache[key]
    pg._abandoned.append((req, buf))
    if pg.comm is None:  # broken: no call will start them again
        free_persistent(pg, False)


def all_reduce_request(pg: ProcessGroup, arr: np.ndarray, d: DType, op: Any, p: Any,
                       sig: tuple) -> tuple | None:
    """The persistent request (``MPI_Allreduce_init``) for a blocking all_reduce of ``arr`` with
    ``op`` (a ``ReduceOp`` planned as ``p``), made now; ``None`` for a call that keeps
    ``MPI_Iallreduce``: too large, a premultiplied or 16-bit op, a user's op, or no support.

    The entry, keyed by shape, dtype and op name, holds the call's signature and whether it
    averages, so that the next call like it needs neither (``collectives.all_reduce``).
    """
    if (arr.nbytes > SMALL or p.factor is not None or p.lowprec is not None
            or id(p.op) not in PREDEFINED or getattr(op, "factor", 0) is not None):
        return None
    comm, mop = pg.comm, p.op
    return _entry(pg, (arr.shape, d.name, op.name),
                  lambda buf: comm.Allreduce_init(IN_PLACE, [buf, d.mpi], mop), arr, sig, p.average)


def all_reduce(pg: ProcessGroup, call: Any, entry: tuple, arr: np.ndarray, d: DType) -> None:
    """``arr`` reduced in place across ``pg`` through ``entry`` (:func:`all_reduce_request`):
    copied in, ``MPI_Start``, the bounded wait, copied out (then divided, for ``AVG``)."""
    req, buf = entry[0], entry[1]
    buf[...] = arr
    _run(pg, call, req, buf)
    arr[...] = buf
    if entry[3]:
        divide(arr, d, pg._size)


def broadcast(pg: ProcessGroup, call: Any, arr: np.ndarray, d: DType, root: int) -> bool:
    """``arr`` copied from group rank ``root`` to every rank by ``MPI_Bcast_init`` (once) +
    ``MPI_Start``; ``False`` (nothing done) where persistent requests are off or unsupported."""
    comm = pg.comm
    entry = _entry(pg, ("broadcast", arr.shape, d.name, root),
                   lambda buf: comm.Bcast_init([buf, d.mpi], root), arr)
    if entry is None:
        return False
    req, buf = entry
    sending = pg._rank == root
    if sending:
        buf[...] = arr
    _run(pg, call, req, buf)
    if not sending:
        arr[...] = buf
    return True


_NO_DATA = np.empty(0, np.uint8)


def barrier(pg: ProcessGroup, call: Any) -> bool:
    """``MPI_Barrier_init`` (once) + ``MPI_Start``; ``False`` where persistent requests are off or
    unsupported."""
    comm = pg.comm
    entry = _entry(pg, "barrier", lambda _: comm.Barrier_init(), _NO_DATA)
    if entry is None:
        return False
    _run(pg, call, entry[0], entry[1])
    return True
