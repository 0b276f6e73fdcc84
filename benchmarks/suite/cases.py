"""Every benchmarked call, and how each implementation performs it on the same buffers.

A call's buffers are allocated once per message size and shared by all implementations:
mpidist and raw mpi4py get the numpy arrays, gloo gets ``torch.from_numpy`` views of
them, C gets their addresses. The message size is the bytes of one rank's block, as in
the OSU benchmarks: the reduced/broadcast tensor, one rank's contribution to a gather,
one rank's share of a scatter or reduce-scatter, one peer's block of an all-to-all, the
one-way message of a ping-pong, the pickled payload (a ``uint8`` array) of an object call.

``body(impl, call, ctx, bufs)`` returns ``(fn, args)``: one operation is ``fn(*args)``.
Before timing, :func:`fill` writes rank-dependent inputs and :func:`check` verifies the
output of one operation, so every implementation is proven to do the same work.
Nothing here imports ``mpi4py.MPI`` at import time: ``run.py`` must be able to choose the
thread level first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

ARRAY_CALLS = (
    "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
    "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter", "send_recv", "barrier",
)
OBJECT_CALLS = (
    "broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list",
    "send_recv_object",
)
CALLS = ARRAY_CALLS + OBJECT_CALLS
IMPLS = ("mpidist", "mpi4py", "c", "gloo", "mpidist_torch")
PINGPONG = ("send_recv", "send_recv_object")
ROOT = 0
F32 = 4


@dataclass
class Ctx:
    """What the bodies need: this rank, the communicator under test and each library."""

    rank: int
    size: int
    dist: Any  # mpidist
    comm: Any  # mpidist's world communicator, an mpi4py Intracomm (raw mpi4py runs on it too)
    pkl: Any  # mpi4py.util.pkl5.Intracomm over comm
    tdist: Any = None  # torch.distributed with gloo initialised, or None
    torch: Any = None
    clib: Any = None
    ctl: Any = None  # a separate communicator for the benchmark's own barriers and reductions


@dataclass
class Bufs:
    """One size's buffers: ``s`` is sent, ``r`` receives (``None`` where a call has none)."""

    nbytes: int
    count: int
    s: np.ndarray | None
    r: np.ndarray | None
    obj: Any = None
    objs: list | None = None  # the object a call scatters (root) / gathers into


def footprint(call: str, nbytes: int, size: int) -> int:
    """Bytes of buffers one rank allocates for ``call`` at ``nbytes`` (before pickles)."""
    if call in ("all_gather", "all_gather_into_tensor", "gather", "reduce_scatter_tensor",
                "scatter", "all_gather_object", "gather_object", "scatter_object_list"):
        return nbytes * (size + 1)
    if call == "all_to_all_single":
        return 2 * nbytes * size
    return nbytes


def alloc(call: str, nbytes: int, rank: int, size: int) -> Bufs:
    count = nbytes // F32
    z = np.zeros
    if call in OBJECT_CALLS:
        obj = np.full(nbytes, rank % 251, np.uint8)
        objs = None
        if call == "scatter_object_list" and rank == ROOT:
            objs = [np.full(nbytes, j % 251, np.uint8) for j in range(size)]
        return Bufs(nbytes, count, None, None, obj, objs)
    if call in ("all_reduce", "broadcast", "reduce", "send_recv"):
        return Bufs(nbytes, count, None, z(count, np.float32))
    if call in ("all_gather", "all_gather_into_tensor", "gather"):
        return Bufs(nbytes, count, z(count, np.float32), z(count * size, np.float32))
    if call in ("reduce_scatter_tensor", "scatter"):
        return Bufs(nbytes, count, z(count * size, np.float32), z(count, np.float32))
    if call == "all_to_all_single":
        return Bufs(nbytes, count, z(count * size, np.float32), z(count * size, np.float32))
    return Bufs(0, 0, None, None)  # barrier


def fill(call: str, b: Bufs, rank: int, size: int) -> None:
    """Rank-dependent inputs (small integers: sums stay exact in float32)."""
    if call in OBJECT_CALLS or call == "barrier":
        return
    if b.s is not None:
        blocks = b.s.reshape(-1, b.count) if b.count else b.s.reshape(0, 0)
        for j, blk in enumerate(blocks):
            blk[...] = rank * size + j + 1
    if call in ("all_reduce", "broadcast", "reduce"):  # in place: r is the input too
        b.r[...] = rank + 1
    elif call == "send_recv":
        b.r[...] = 7 if rank == 0 else 0
    else:  # an output only: a value no correct result has
        b.r[...] = -1


def check(call: str, b: Bufs, rank: int, size: int, out: Any) -> bool:
    """Did one operation (after :func:`fill`) produce what the call promises?"""
    tri = size * (size + 1) / 2
    r = b.r
    if call == "all_reduce":
        return bool(np.all(r == tri))
    if call == "broadcast":
        return bool(np.all(r == ROOT + 1))
    if call == "reduce":  # off the root, gloo may leave partial sums in the input
        return rank != ROOT or bool(np.all(r == tri))
    if call in ("all_gather", "all_gather_into_tensor") or (call == "gather" and rank == ROOT):
        want = np.repeat(np.arange(size) * size + 1, b.count)
        return bool(np.array_equal(r, want))
    if call == "reduce_scatter_tensor":
        return bool(np.all(r == sum(k * size + rank + 1 for k in range(size))))
    if call == "all_to_all_single":
        return bool(np.array_equal(r, np.repeat(np.arange(size) * size + rank + 1, b.count)))
    if call == "scatter":
        return bool(np.all(r == ROOT * size + rank + 1))
    if call == "send_recv":
        return rank > 1 or bool(np.all(r == 7))
    if call == "send_recv_object":  # rank 1 receives rank 0's object
        return rank != 1 or bool(np.all(out[0] == 0))
    if call in ("broadcast_object_list", "scatter_object_list"):
        want = (ROOT if call == "broadcast_object_list" else rank) % 251
        return bool(np.all(out[0] == want))
    if call in ("all_gather_object", "gather_object"):
        if call == "gather_object" and rank != ROOT:
            return True
        return len(out) == size and all(np.all(o == j % 251) for j, o in enumerate(out))
    return True  # barrier, gather off the root


def _noop() -> None:
    return None


def _pingpong(rank: int, send: Callable, send_args: tuple, recv: Callable, recv_args: tuple
              ) -> tuple[Callable, tuple]:
    """Rank 0 sends then receives, rank 1 receives then sends, the others sit out."""
    if rank == 0:
        def body() -> Any:
            send(*send_args)
            return recv(*recv_args)
    elif rank == 1:
        def body() -> Any:
            got = recv(*recv_args)
            send(*send_args)
            return got
    else:
        return _noop, ()
    body.recv_args = recv_args  # type: ignore[attr-defined]  # for returned()
    return body, ()


def _peer(rank: int) -> int:
    return 1 - rank if rank < 2 else rank


def mpidist_body(call: str, x: Ctx, b: Bufs, wrap: Callable[[Any], Any] = lambda a: a
                 ) -> tuple[Callable, tuple]:
    """mpidist on the arrays (``wrap`` turns them into torch tensors for ``mpidist_torch``)."""
    d, me, n = x.dist, x.rank, x.size
    s = wrap(b.s) if b.s is not None else None
    r = wrap(b.r) if b.r is not None else None
    root = me == ROOT
    if call == "all_reduce":
        return d.all_reduce, (r,)
    if call == "broadcast":
        return d.broadcast, (r, ROOT)
    if call == "reduce":
        return d.reduce, (r, ROOT)
    if call == "all_gather":
        return d.all_gather, ([wrap(v) for v in np.split(b.r, n)], s)
    if call == "all_gather_into_tensor":
        return d.all_gather_into_tensor, (r, s)
    if call == "reduce_scatter_tensor":
        return d.reduce_scatter_tensor, (r, s)
    if call == "all_to_all_single":
        return d.all_to_all_single, (r, s)
    if call == "gather":
        return d.gather, (s, [wrap(v) for v in np.split(b.r, n)] if root else None, ROOT)
    if call == "scatter":
        return d.scatter, (r, [wrap(v) for v in np.split(b.s, n)] if root else None, ROOT)
    if call == "send_recv":
        return _pingpong(me, d.send, (r, _peer(me)), d.recv, (r, _peer(me)))
    if call == "barrier":
        return d.barrier, ()
    objs = [b.obj]
    if call == "broadcast_object_list":
        return d.broadcast_object_list, (objs, ROOT)
    if call == "all_gather_object":
        return d.all_gather_object, ([None] * n, b.obj)
    if call == "gather_object":
        return d.gather_object, (b.obj, [None] * n if root else None, ROOT)
    if call == "scatter_object_list":
        return d.scatter_object_list, ([None], b.objs, ROOT)
    if call == "send_recv_object":
        return _pingpong(me, d.send_object_list, (objs, _peer(me)), d.recv_object_list,
                         (objs, _peer(me)))
    raise KeyError(call)


def mpi4py_body(call: str, x: Ctx, b: Bufs) -> tuple[Callable, tuple]:
    """The MPI call mpidist makes, issued directly through mpi4py on the same buffers."""
    from mpi4py import MPI

    c, me, p = x.comm, x.rank, x.pkl
    f = MPI.FLOAT
    s = [b.s, f] if b.s is not None else None
    r = [b.r, f] if b.r is not None else None
    root = me == ROOT
    if call == "all_reduce":
        return c.Allreduce, (MPI.IN_PLACE, r, MPI.SUM)
    if call == "broadcast":
        return c.Bcast, (r, ROOT)
    if call == "reduce":
        return c.Reduce, ((MPI.IN_PLACE, r) if root else (r, None)) + (MPI.SUM, ROOT)
    if call in ("all_gather", "all_gather_into_tensor"):
        return c.Allgather, (s, r)
    if call == "reduce_scatter_tensor":
        return c.Reduce_scatter_block, (s, r, MPI.SUM)
    if call == "all_to_all_single":
        return c.Alltoall, (s, r)
    if call == "gather":
        return c.Gather, (s, r if root else None, ROOT)
    if call == "scatter":
        return c.Scatter, (s if root else None, r, ROOT)
    if call == "send_recv":
        return _pingpong(me, c.Send, (r, _peer(me), 0), c.Recv, (r, _peer(me), 0))
    if call == "barrier":
        return c.Barrier, ()
    if call == "broadcast_object_list":
        return p.bcast, ([b.obj] if root else None, ROOT)
    if call == "all_gather_object":
        return p.allgather, (b.obj,)
    if call == "gather_object":
        return p.gather, (b.obj, ROOT)
    if call == "scatter_object_list":
        return p.scatter, (b.objs, ROOT)
    if call == "send_recv_object":  # mpidist's object messages use odd MPI tags
        return _pingpong(me, p.send, ([b.obj], _peer(me), 1), p.recv, (None, _peer(me), 1))
    raise KeyError(call)


def gloo_body(call: str, x: Ctx, b: Bufs) -> tuple[Callable, tuple]:
    """torch.distributed on gloo, on ``torch.from_numpy`` views of the same buffers."""
    td, me, n, torch = x.tdist, x.rank, x.size, x.torch
    s = torch.from_numpy(b.s) if b.s is not None else None
    r = torch.from_numpy(b.r) if b.r is not None else None
    root = me == ROOT
    if call == "all_reduce":
        return td.all_reduce, (r,)
    if call == "broadcast":
        return td.broadcast, (r, ROOT)
    if call == "reduce":
        return td.reduce, (r, ROOT)
    if call == "all_gather":
        return td.all_gather, (list(r.chunk(n)), s)
    if call == "all_gather_into_tensor":
        return td.all_gather_into_tensor, (r, s)
    if call == "reduce_scatter_tensor":
        return td.reduce_scatter_tensor, (r, s)
    if call == "all_to_all_single":
        return td.all_to_all_single, (r, s)
    if call == "gather":
        return td.gather, (s, list(r.chunk(n)) if root else None, ROOT)
    if call == "scatter":
        return td.scatter, (r, list(s.chunk(n)) if root else None, ROOT)
    if call == "send_recv":
        return _pingpong(me, td.send, (r, _peer(me)), td.recv, (r, _peer(me)))
    if call == "barrier":
        return td.barrier, ()
    objs = [b.obj]
    if call == "broadcast_object_list":
        return td.broadcast_object_list, (objs, ROOT)
    if call == "all_gather_object":
        return td.all_gather_object, ([None] * n, b.obj)
    if call == "gather_object":
        return td.gather_object, (b.obj, [None] * n if root else None, ROOT)
    if call == "scatter_object_list":
        return td.scatter_object_list, ([None], b.objs, ROOT)
    if call == "send_recv_object":
        return _pingpong(me, td.send_object_list, (objs, _peer(me)), td.recv_object_list,
                         (objs, _peer(me)))
    raise KeyError(call)


def c_body(call: str, x: Ctx, b: Bufs) -> Callable[[int], float]:
    """The C loop: ``loop(iters)`` runs ``iters`` operations in C and returns their seconds."""
    from .cfloor import CALL_IDS

    run, cid, handle = x.clib.mpib_run, CALL_IDS[call], x.comm.handle
    sp = b.s.ctypes.data if b.s is not None else None
    rp = b.r.ctypes.data if b.r is not None else None
    count = b.count

    def loop(iters: int) -> float:
        return run(cid, handle, sp, rp, count, iters)
    return loop


def supports(impl: str, call: str, x: Ctx) -> str:
    """``""`` when ``impl`` can run ``call`` here, else the reason it is skipped."""
    if impl == "c":
        if x.clib is None:
            return "no C library"
        return "" if call in ARRAY_CALLS else "objects have no C counterpart"
    if impl == "gloo" and x.tdist is None:
        return "torch.distributed/gloo unavailable"
    if impl == "mpidist_torch" and (x.torch is None or call in OBJECT_CALLS):
        return "torch unavailable" if x.torch is None else "same as mpidist for objects"
    if call in PINGPONG and x.size < 2:
        return "ping-pong needs 2 ranks"
    return ""


def returned(call: str, fn_args: tuple[Callable, tuple], result: Any, b: Bufs) -> Any:
    """The objects one operation delivered, for :func:`check` (lists are filled in place)."""
    fn, args = fn_args
    if call == "broadcast_object_list":
        return args[0] if isinstance(args[0], list) else result
    if call in ("all_gather_object",):
        return args[0] if result is None else result
    if call == "gather_object":
        return (args[1] if args[1] is not None else []) if result is None else result
    if call == "scatter_object_list":
        return args[0] if result is None else [result]
    if call == "send_recv_object":  # pkl5's recv returns the list, the others fill theirs
        return result if isinstance(result, list) else getattr(fn, "recv_args", [None])[0]
    return None
