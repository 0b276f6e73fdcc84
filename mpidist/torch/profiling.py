"""The torch backend's calls in ``torch.profiler`` traces, named as gloo names its own.

Under an active profiler each call of :class:`~mpidist.torch.backend.MpidistProcessGroup`
opens one record, ``mpidist:<call>`` (``mpidist:all_reduce``, ``mpidist:all_gather``, ...,
where gloo writes ``gloo:all_reduce``), with the call's input tensors as gloo records them
(with ``record_shapes=True`` their shapes and dtypes show as "Input Dims" and "Input type")
and the group as keyword values (name, description, size, global ranks). It is torch's
``_RecordFunctionFast``, the C++ record its own Python ops use. With the profiler off the
backend reads one module flag (``torch.autograd.profiler._is_profiler_enabled``) and
records nothing.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Sequence

import torch
import torch.autograd.profiler as _profiler
from torch._C._profiler import _RecordFunctionFast

#: backend method -> (name in the trace, which argument of the call is its input). Names are
#: gloo's where gloo names the call itself (``all_gather`` for the coalesced and into-tensor
#: forms, ``all_to_all`` for the single-tensor form, ``recvAnySource``); gloo's
#: reduce_scatter shows up as the ``all_reduce`` it is built on, here as ``reduce_scatter``.
CALLS: dict[str, tuple[str, int | None]] = {
    "allreduce": ("all_reduce", 0), "broadcast": ("broadcast", 0), "reduce": ("reduce", 0),
    "allgather": ("all_gather", 1), "allgather_coalesced": ("all_gather", 1),
    "all_gather_into_tensor": ("all_gather", 1), "reduce_scatter": ("reduce_scatter", 1),
    "reduce_scatter_tensor": ("reduce_scatter", 1), "gather": ("gather", 0), "scatter": ("scatter", 1),
    "alltoall": ("all_to_all", 1), "all_to_all_single": ("all_to_all", 1), "barrier": ("barrier", None),
    "send": ("send", 0), "recv": ("recv", 0), "recv_anysource": ("recvAnySource", 0),
}


def _tensors(args: Any) -> list[torch.Tensor]:
    """The tensors in an argument (a tensor, or lists of them, opened to any depth)."""
    if isinstance(args, torch.Tensor):
        return [args]
    out: list[torch.Tensor] = []
    if isinstance(args, (list, tuple)):
        for a in args:
            out.extend(_tensors(a))
    return out


def _inputs(call: str, args: Sequence[tuple]) -> list[torch.Tensor]:
    which = CALLS.get(call, (call, None))[1]
    if which is None:
        return []
    return [t for a in args for t in _tensors(a[which])]


def record(call: str, pg: Any, args: Sequence[Any]) -> Any:
    """The profiler record of one backend call (a context manager)."""
    g = pg.mpi_group
    return _RecordFunctionFast(
        "mpidist:" + CALLS.get(call, (call,))[0], _inputs(call, args),
        {"group_name": pg.group_name, "group_desc": pg.group_desc, "group_size": pg.size(),
         "group_ranks": str(list(g.ranks))},
    )




def maybe(call: str, pg: Any, tensors: list[torch.Tensor]) -> Any:
    """:func:`record` of a point-to-point call under an active profiler, else a no-op context."""
    if _profiler._is_profiler_enabled:
        return record(call, pg, [(tensors,)])
    return contextlib.nullcontext()


_local = threading.local()


def outside_record() -> bool:
    """Whether this thread is not already inside :func:`recorded` (asked only while profiling)."""
    return not getattr(_local, "inside", False)


def recorded(call: str, pg: Any, args: Sequence[Any], run: Callable[..., Any], run_args: tuple,
             kw: dict) -> Any:
    """``run(*run_args, **kw)`` inside the record of ``call``; ``run`` sees :func:`outside_record` false."""
    _local.inside = True
    try:
        with record(call, pg, args):
            return run(*run_args, **kw)
    finally:
        _local.inside = False
