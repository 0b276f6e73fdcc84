"""Start torch.distributed from MPI: the torch half of ``init_distributed_mode`` and ``mpidist.run``.

:func:`start_torch_distributed` is what :func:`mpidist.init_distributed_mode` does in a
program that imported torch, as the DETR/DeiT helper of that name does:

=====================================================  ===================================
every rank has a CUDA device of its own (agreed over   ``init_process_group("nccl")``
MPI: at most as many ranks on a node as GPUs) and
torch has NCCL
otherwise (CPU, GPUs shared by several ranks, no       ``init_process_group("mpidist")``
NCCL)                                                  (MPI, :mod:`mpidist.torch`)
torch.distributed already initialised with MPI's       reused, whatever its backend
rank and size on every rank
already initialised with another rank or size, or on   ``RuntimeError`` on every rank
some ranks only
=====================================================  ===================================

The store comes from ``env://``: the ``MASTER_ADDR``/``MASTER_PORT`` set (for instance by
``mpidist.run``), else rank 0's ``TCPStore`` with its port sent over MPI
(:mod:`mpidist.torch.rendezvous`). Then one ``barrier`` on the new group.

:func:`map_cpu_backend_to_mpidist` (``mpidist.run --backend-for-cpu mpidist``) makes this
process's ``torch.distributed.init_process_group`` run gloo's part on ``"mpidist"``.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import torch
import torch.distributed as tdist
from mpi4py import MPI

from .. import errors, failure
from . import backend as _backend

CALL = "init_distributed_mode"


def _own_gpu(device: str, local_world_size: int) -> bool:
    """This rank has a CUDA device that no other rank of its node is given."""
    return (device.startswith("cuda") and tdist.is_nccl_available()
            and local_world_size <= torch.cuda.device_count())


def _already(comm: MPI.Intracomm) -> str | None:
    """``None`` when no rank has torch.distributed up; the backend when every rank has it, compatibly.

    Raises ``RuntimeError`` on every rank otherwise (``MPI_Allgather``).
    """
    mine = None
    if tdist.is_initialized():
        mine = (tdist.get_rank(), tdist.get_world_size(), str(tdist.get_backend()))
    seen = comm.allgather(mine)
    if all(s is None for s in seen):
        return None
    rank, size = comm.Get_rank(), comm.Get_size()
    bad = [r for r, s in enumerate(seen) if s is None or s[:2] != (r, size)]
    if not bad:
        return mine[2]  # type: ignore[index]
    if mine is None:
        detail = "torch.distributed is not initialised here but is on other ranks"
    elif mine[:2] != (rank, size):
        detail = (f"torch.distributed is already initialised as rank {mine[0]} of {mine[1]}, but MPI "
                  f"gives rank {rank} of {size}")
    else:
        detail = f"rank(s) {', '.join(map(str, bad))} have torch.distributed missing or at odds with MPI"
    raise errors.runtime_error(
        CALL, f"{detail}; call it before init_process_group, or initialise torch.distributed "
        "the same way on every rank (destroy_process_group() first to start over)")


def start_torch_distributed(device: str, local_world_size: int, init_method: str | None = None) -> str:
    """Initialise (or reuse) torch.distributed's default group; return its backend name.

    Collective over ``MPI_COMM_WORLD``: ``MPI_Allreduce`` picks ``"nccl"`` when every
    rank has its own CUDA device, else ``"mpidist"``; ``init_process_group`` with
    MPI's rank and size and ``init_method`` (default ``env://``); one ``barrier``.
    See the module docstring for which case does what.
    """
    comm = MPI.COMM_WORLD
    reused = _already(comm)
    if reused is not None:
        return reused
    nccl = comm.allreduce(_own_gpu(device, local_world_size), op=MPI.LAND)
    name = "nccl" if nccl else _backend.NAME
    failure.keep_traceback()
    kwargs: dict[str, Any] = {}
    if nccl:
        kwargs["device_id"] = torch.device(device)
    tdist.init_process_group(name, init_method=init_method or "env://", rank=comm.Get_rank(),
                             world_size=comm.Get_size(), **kwargs)
    if nccl:
        tdist.barrier(device_ids=[torch.device(device).index])
    else:
        tdist.barrier()
    return name


def _mapped(backend: Any) -> Any:
    """gloo's part of a backend string as ``"mpidist"``; an unnamed backend on a CPU-only host too."""
    if backend is None:
        return _backend.NAME if torch.accelerator.current_accelerator() is None else None
    if not isinstance(backend, str):
        return backend
    if ":" not in backend:
        return _backend.NAME if backend.lower() == "gloo" else backend
    pairs = [p.split(":", 1) for p in backend.split(",")]
    return ",".join(f"{d}:{_backend.NAME if b.strip().lower() == 'gloo' else b}" for d, b in pairs)


def map_cpu_backend_to_mpidist() -> Callable[..., Any]:
    """Make ``torch.distributed.init_process_group`` put gloo's work on ``"mpidist"`` (this process).

    ``"gloo"`` becomes ``"mpidist"``, ``"cpu:gloo,cuda:nccl"`` becomes
    ``"cpu:mpidist,cuda:nccl"``, and no backend (with no ``device_id``) on a host without
    an accelerator becomes ``"mpidist"``; anything else is passed on as written. Replaces
    the function in ``torch.distributed`` and in each loaded ``torch.distributed`` module
    that imported it. Returns the wrapper (idempotent).
    """
    original = tdist.distributed_c10d.init_process_group
    if getattr(original, "__mpidist_mapped__", False):
        return original

    @functools.wraps(original)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        if backend is None and kwargs.get("device_id") is not None:
            return original(backend, *args, **kwargs)
        return original(_mapped(backend), *args, **kwargs)

    init_process_group.__mpidist_mapped__ = True  # type: ignore[attr-defined]
    for name, module in list(sys.modules.items()):
        if (name == "torch.distributed" or name.startswith("torch.distributed.")) and \
                getattr(module, "init_process_group", None) is original:
            module.init_process_group = init_process_group  # type: ignore[attr-defined]
    return init_process_group
