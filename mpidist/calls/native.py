"""The C calls (``_native.c``): which MPI routines they call, and whether they may run.

A small blocking all_reduce, broadcast or barrier spends more time in Python than in MPI:
mpi4py's request object, each ``MPI_Test`` through mpi4py, the loop that yields the core between
tests (docs/benchmarks.md, "The 8 B all_reduce in C"). The C module starts the nonblocking
routine (``MPI_Iallreduce`` in place, ``MPI_Ibcast``, ``MPI_Ibarrier``) and runs the first part
of the bounded wait of :func:`mpidist.core.timeouts.wait` (the same quick tests and the same
spin, with the same constants); what is still pending after it comes back as a request handle,
and the bounded wait goes on in Python. Where the group's ranks all run on one node, the call
rings the node's bell and spins only while every member is in a wait (the group's bell mask,
the last argument; :mod:`mpidist.core.bell`, whose futex functions live in the same module).

It is built at install where a C compiler is found (``setup.py``), and needs no MPI header: the
routines are looked up in the MPI library mpi4py loaded, and the handles pass as integers. It
runs only where that library's handle ABI is known, as mpi4py's wheels tell it: MPICH's (int
handles, ``MPI_IN_PLACE`` is ``(void *)-1``: MPICH, Intel MPI, Cray MPICH, MVAPICH) or Open MPI's
(pointer handles, ``MPI_IN_PLACE`` is ``(void *)1``). Elsewhere (the standard ABI, an unknown MPI,
no compiler, ``MPIDIST_NATIVE=0``) :data:`allreduce`, :data:`bcast` and :data:`barrier` are
``None`` and every call goes through mpi4py, as before.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..checks import signature
from ..checks.signature import Record
from ..core import bell, timeouts, waiting
from ..core.buffers import AS_IS, DType
from ..core.groups import ProcessGroup
from .ops import Plan, ReduceOp

#: ``allreduce(array, datatype handle, extent, op handle, comm handle[, bell mask[, call number]])``:
#: ``None`` when done, the pending request's handle, or ``NotImplemented`` (a count past
#: ``INT_MAX``); ``None`` where the C path is not available (see the module).
allreduce: Callable[[Any, int, int, int, int], Any] | None = None
#: ``bcast(array, datatype handle, extent, root, comm handle, writable[, bell mask[, call number]])``:
#: as :data:`allreduce`.
bcast: Callable[[Any, int, int, int, int, bool], Any] | None = None
#: ``barrier(comm handle[, bell mask[, call number]])``: ``None`` when done, else the pending
#: request's handle.
barrier: Callable[[int], Any] | None = None
#: ``all_reduce(tensor, op, group, sign)``: the whole common case of
#: :func:`mpidist.all_reduce` (see :func:`bind`), as :data:`allreduce`; ``NotImplemented``
#: off that case, with nothing done.
all_reduce: Callable[[Any, Any, Any, bool], Any] | None = None
#: Why the C path is off, where it is (``python -m mpidist info`` and the tests print it).
why_not: str = ""
#: Whether ``MPIDIST_NATIVE`` allows it (``0``/``off`` turns it off).
ALLOWED: bool = os.environ.get("MPIDIST_NATIVE", "1").strip().lower() not in ("0", "off", "false", "no")


def finish(pending: Any, start: Callable[[], MPI.Request], pg: Any, call: Any, keep: Any) -> None:
    """Complete a call after its C function returned ``pending`` (not ``None``, which means
    done): the request it left pending goes on in the bounded wait; ``NotImplemented`` (or no
    C path) means the call has not started, and ``start()`` starts it through mpi4py instead.
    MPI errors propagate as ``MPI.Exception``, for the caller's :func:`~mpidist.core.timeouts.failure`."""
    if pending is NotImplemented:
        req = start()
        if not req.Test():
            timeouts.wait((req,), pg, call, keep)
    else:
        timeouts.wait_pending(pending, pg, call, keep)


def barrier_on(pg: Any, call: Any, keep: Any) -> None:
    """A bounded barrier on ``pg`` (its call number already counted): the C barrier where it
    runs, else ``MPI_Ibarrier`` through mpi4py, then the bounded wait. MPI errors propagate as
    ``MPI.Exception``, as in :func:`finish`."""
    pending = NotImplemented if barrier is None else barrier(pg.handle, pg.bell, pg.seq)
    if pending is not None:
        finish(pending, pg.comm.Ibarrier, pg, call, keep)


def handle_abi(lib: Any) -> str | None:
    """``"mpich"`` or ``"openmpi"``: the handle ABI of the MPI library ``lib`` (a ``ctypes.CDLL``
    that resolves mpi4py's symbols), checked against the size mpi4py gives its handles; ``None``
    for any other (the standard ABI, where ``MPI_Abi_get_version`` reports one)."""
    comm_size = MPI._sizeof(MPI.Comm)
    if hasattr(lib, "ompi_mpi_comm_self"):
        return "openmpi" if comm_size == ctypes.sizeof(ctypes.c_void_p) else None
    if _standard_abi(lib):
        return None
    return "mpich" if comm_size == ctypes.sizeof(ctypes.c_int) else None


def _standard_abi(lib: Any) -> bool:
    get = getattr(lib, "MPI_Abi_get_version", None)
    if get is None:
        return False
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    get.restype, get.argtypes = ctypes.c_int, [ctypes.POINTER(ctypes.c_int)] * 2
    return get(ctypes.byref(major), ctypes.byref(minor)) == 0 and major.value > 0


def _address(lib: Any, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0


def enable(on: bool = True) -> str:
    """Use the C calls where they can run (``on``), or mpi4py's always; returns why they are
    off, or ``""``. Every rank of a job may choose alone: both paths make the same MPI call."""
    global allreduce, bcast, barrier, all_reduce, why_not
    allreduce = bcast = barrier = all_reduce = signature.IN_C = None
    why_not = ""
    try:
        from . import _native as module
    except ImportError:
        bell.use(None)
        why_not = "not built (no C compiler at install)"
        return why_not
    # the node's bell needs no MPI routine, only the module (and MPIDIST_BELL, core/bell.py)
    bell.use(module if hasattr(module, "bell_attach") else None)
    if not on:
        why_not = "turned off (MPIDIST_NATIVE=0)"
        return why_not
    try:
        lib = ctypes.CDLL(MPI.__file__)  # its symbols resolve in the MPI library mpi4py loaded
        abi = handle_abi(lib)
        at = [_address(lib, name) for name in ("MPI_Iallreduce", "MPI_Ibcast", "MPI_Ibarrier", "MPI_Test")]
    except (OSError, AttributeError) as exc:
        why_not = f"the MPI library's routines cannot be found ({exc})"
        return why_not
    if abi is None:
        why_not = "the MPI library's handle ABI is neither MPICH's nor Open MPI's"
        return why_not
    try:
        module.setup(*at, abi == "openmpi", -1 if abi == "mpich" else 1, MPI.Exception,
                     timeouts.QUICK_TESTS, waiting.TESTS_PER_YIELD, waiting.CLOCK_EVERY,
                     waiting.SPIN_LEAST, waiting.SPIN_PER_BYTE, waiting.SPIN_MOST)
    except TypeError as exc:  # an in-place build older than this file: run without it
        why_not = f"the built C module does not match this mpidist (rebuild it: {exc})"
        return why_not
    allreduce, bcast, barrier = module.allreduce, module.bcast, module.barrier
    if hasattr(module, "large_from"):
        module.large_from(_large_from)
    signature.IN_C = (allreduce, MPI._handleof(MPI.INT64_T), MPI._handleof(MPI.MAX))
    try:
        bind(module)
        all_reduce = module.all_reduce
    except TypeError as exc:  # a class changed shape: the C calls still run, the checks in Python
        why_not = f"all_reduce's checks stay in Python ({exc})"
    return why_not


def state() -> str:
    """``"on"``, ``"on; ..."`` (the C calls run, all_reduce's checks in Python, and why), or
    ``"off: ..."``, as ``python -m mpidist info`` says it."""
    if allreduce is None:
        return f"off: {why_not}"
    return "on" if all_reduce is not None else f"on; {why_not}"


def entry(fn: Any, gates: tuple[tuple[dict, str, Any], ...], world: tuple[Any, str],
          sign: tuple[Any, str], default_op: Any, on_pending: Callable[[int, Any, Any], None],
          on_error: Callable[[Any, Any, Any], None]) -> Any:
    """``fn`` (a call's generated entry, :func:`mpidist.core.registry.define`) with its common case
    in C: a callable that reads torch's arguments ``(tensor, op, group, async_op)`` itself, checks
    that every gate's ``namespace[key]`` is its value (no debug hook, this module's C
    ``all_reduce`` on, ...), finds ``group=None`` as ``world``'s ``namespace[key]``, and runs the
    C module's ``all_reduce`` with the check on where ``sign``'s value is ``True``. A request
    left pending goes to ``on_pending(handle, group, tensor)``, an MPI error of the routine to
    ``on_error(exc, group, tensor)``; every other call goes to ``fn`` as it came. Saves the
    Python function's call and body, about 0.14 us (docs/benchmarks.md). Where the module is not
    built this is ``fn`` itself."""
    try:
        from . import _native as module
    except ImportError:
        return fn
    gates = ((globals(), "all_reduce", module.all_reduce), *gates)  # off with enable(False)
    e = module.entry(fn, gates, (vars(world[0]), world[1]), (vars(sign[0]), sign[1]), default_op,
                     on_pending, on_error)
    for name in ("__name__", "__qualname__", "__module__", "__doc__", "__annotations__", "call"):
        setattr(e, name, getattr(fn, name))
    e.__wrapped__ = fn
    return e


#: all_reduce's C case leaves arrays of this many bytes or more to Python (0: none): see large_from
_large_from = 0


def large_from(nbytes: int) -> None:
    """Leave all_reduce of arrays of ``nbytes`` or more to the Python path (``0``: none), where a
    group on one node sums them in its shared window (:mod:`mpidist.calls.nodereduce`)."""
    global _large_from
    _large_from = nbytes
    try:
        from . import _native as module
    except ImportError:
        return
    if hasattr(module, "large_from"):
        module.large_from(nbytes)


def bind(module: Any) -> None:
    """Show the C module the objects :func:`mpidist.all_reduce` checks, so that its
    ``all_reduce`` can check them alike: ``ndarray``, :class:`ReduceOp` and its plans,
    :class:`ProcessGroup`, the cross-rank check's :class:`~mpidist.checks.signature.Record`, and
    the dtypes MPI moves as they are. The classes' ``__slots__`` become offsets there; it raises
    ``TypeError`` where one is not a slot."""
    module.bind(np.ndarray, ReduceOp, ProcessGroup, Record, DType, Plan, AS_IS, "all_reduce",
                tuple(DType._fields.index(f) for f in ("name", "kind", "handle", "extent")),
                tuple(Plan._fields.index(f) for f in ("average", "factor", "lowprec", "handle")),
                signature.check)


enable(ALLOWED)
