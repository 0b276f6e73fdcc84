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
process's ``torch.distributed.init_process_group`` run gloo's part on ``"mpidist"``, and rank 0
says so in one line when the group is up. :func:`use_for_cpu` is the same switch from inside
a script, with the rest of what ``mpidist.run`` does before a script starts.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable

import torch
import torch.distributed as tdist
from mpi4py import MPI

from ..checks import failure
from ..core import errors, job
from ..start import launcher, spares, torchrun_env
from . import backend as _backend
from . import rendezvous

CALL = "init_distributed_mode"
USE_FOR_CPU = "use_for_cpu"


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
    spares.park()  # a spare waits here until called in (MPIDIST_SPARES)
    comm = job.world
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


def has_accelerator() -> bool:
    """Whether this process has an accelerator to use: what the machine has, not what torch was
    built for (a CUDA build of torch on a host without a GPU has none)."""
    return torch.accelerator.current_accelerator(check_available=True) is not None


def _mapped(backend: Any) -> Any:
    """gloo's part of a backend string as ``"mpidist"``; an unnamed backend on a CPU-only host too."""
    if backend is None:
        return None if has_accelerator() else _backend.NAME
    if not isinstance(backend, str):
        return backend
    if ":" not in backend:
        return _backend.NAME if backend.lower() == "gloo" else backend
    pairs = [p.split(":", 1) for p in backend.split(",")]
    return ",".join(f"{d}:{_backend.NAME if b.strip().lower() == 'gloo' else b}" for d, b in pairs)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def announcement(requested: Any, comm: MPI.Intracomm | None = None) -> str:
    """The line rank 0 prints when ``requested`` runs on mpidist, e.g.
    ``"gloo" requested: running on mpidist over MPI (MPICH 5.0.2, 4 ranks on 1 node)``.

    Collective over ``comm`` (default ``MPI_COMM_WORLD``): the node count comes from
    ``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)``.
    """
    comm = comm if comm is not None else job.world
    num_nodes = launcher.node_layout(comm)[3]
    vendor, version = MPI.get_vendor()
    where = (f"over MPI ({vendor} {'.'.join(map(str, version))}, {_plural(comm.Get_size(), 'rank')} on "
             f"{_plural(num_nodes, 'node')})")
    if requested is None:
        return f"no backend requested on a host without an accelerator: running on mpidist {where}"
    if ":" not in requested:
        return f'"{requested}" requested: running on mpidist {where}'
    return f'"{requested}" requested: its CPU part runs on mpidist {where}'


def map_cpu_backend_to_mpidist() -> Callable[..., Any]:
    """Make ``torch.distributed.init_process_group`` put gloo's work on ``"mpidist"`` (this process).

    ``"gloo"`` becomes ``"mpidist"``, ``"cpu:gloo,cuda:nccl"`` becomes
    ``"cpu:mpidist,cuda:nccl"``, and no backend (with no ``device_id``) on a host without
    an accelerator becomes ``"mpidist"``; anything else is passed on as written. Replaces
    the function in ``torch.distributed`` and in each loaded ``torch.distributed`` module
    that imported it. When a requested backend was mapped, rank 0 prints
    :func:`announcement` to stderr once the group is up, so that a log where a library
    still says gloo is not misread. Returns the wrapper (idempotent).
    """
    original = tdist.distributed_c10d.init_process_group
    if getattr(original, "__mpidist_mapped__", False):
        return original

    @functools.wraps(original)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        if backend is None and kwargs.get("device_id") is not None:
            return original(backend, *args, **kwargs)
        mapped = _mapped(backend)
        out = original(mapped, *args, **kwargs)
        if mapped != backend:
            line = announcement(backend)
            if job.world.Get_rank() == 0:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
        return out

    init_process_group.__mpidist_mapped__ = True  # type: ignore[attr-defined]
    for name, module in list(sys.modules.items()):
        if (name == "torch.distributed" or name.startswith("torch.distributed.")) and \
                getattr(module, "init_process_group", None) is original:
            module.init_process_group = init_process_group  # type: ignore[attr-defined]
    return init_process_group


def prepare_torch(call: str, backend_for_cpu: str) -> None:
    """The torch half of what ``mpidist.run`` and :func:`use_for_cpu` do before a script starts
    torch.distributed, once torchrun's variables are exported (one implementation for both).

    Collective over ``MPI_COMM_WORLD``: rank 0 serves the ``env://`` store
    (:func:`mpidist.torch.rendezvous.serve_env_store`). With ``backend_for_cpu="mpidist"``, on a
    host without an accelerator (:func:`has_accelerator`) ``ACCELERATE_USE_CPU=true`` unless set,
    and :func:`map_cpu_backend_to_mpidist`. Then the job ends when a rank raises uncaught
    (:func:`mpidist.checks.failure.install_for_torch`).
    """
    rendezvous.serve_env_store(call=call)
    if backend_for_cpu == _backend.NAME:
        if not has_accelerator():
            os.environ.setdefault("ACCELERATE_USE_CPU", "true")
        map_cpu_backend_to_mpidist()
    failure.install_for_torch()


def use_for_cpu() -> None:
    """Run torch.distributed's CPU backend on mpidist: ``--backend-for-cpu mpidist`` inside a script.

    For programs that ``python -m mpidist.run`` cannot wrap (notebooks, ``accelerate
    launch``, a site's own launcher) and for libraries that insist on ``"gloo"`` (accelerate,
    Lightning's default): call it on every rank before the library starts
    torch.distributed, and start the job with ``mpiexec``/``mpirun``/``srun --mpi=pmi2``;
    no launcher variables are needed.

    Collective over ``MPI_COMM_WORLD``. It does, in this process, exactly what ``mpidist.run
    --backend-for-cpu mpidist`` does before it runs a script (the same functions):

    - refuses the singleton trap (the launcher started several processes, MPI sees a world
      of one);
    - sets torchrun's variables from MPI (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
      ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ...; see :mod:`mpidist.start.torchrun_env`), so that
      a library that reads them (accelerate, Lightning's ``TorchElasticEnvironment``) sees MPI's
      layout, not Slurm's or none; a value already set that contradicts MPI makes every rank
      raise ``RuntimeError``;
    - serves the store from rank 0 on one address (``127.0.0.1`` on one node) and sets
      ``MASTER_ADDR``/``MASTER_PORT`` to it with ``TORCHELASTIC_USE_AGENT_STORE=True``, so that
      the library's ``env://`` rendezvous connects to it instead of starting torch's own server
      on every interface (:func:`mpidist.torch.rendezvous.serve_env_store`; a ``MASTER_PORT``
      set by hand is kept, and torch's own server then runs);
    - on a host without an accelerator (``has_accelerator()``: what the machine has, so also
      with a CUDA build of torch and no GPU), sets ``ACCELERATE_USE_CPU=true`` unless it is set
      (what ``accelerate launch --cpu`` sets): accelerate's ``Accelerator`` and the HF
      ``Trainer`` otherwise see ``LOCAL_RANK``, look for a GPU, find none and train one copy
      per rank;
    - makes ``init_process_group("gloo")`` (and gloo's part of ``"cpu:gloo,cuda:nccl"``, and
      an unnamed backend on a host without an accelerator) run on ``"mpidist"``
      (:func:`map_cpu_backend_to_mpidist`); rank 0 says so in one line at init;
    - ends the job when a rank raises uncaught or exits early (``MPI_Abort``), unless
      ``MPIDIST_ABORT_ON_ERROR=0``.

    Raises ``RuntimeError`` when torch.distributed is already initialised (it would come too
    late). Example::

        import mpidist.torch
        mpidist.torch.use_for_cpu()           # first, on every rank
        trainer = transformers.Trainer(...)   # ddp_backend "gloo" or unset
    """
    if tdist.is_initialized():
        raise errors.runtime_error(
            USE_FOR_CPU, f"torch.distributed is already initialised (backend {tdist.get_backend()!r}); "
            "call use_for_cpu() before anything starts it")
    spares.park()  # a spare waits here until called in (MPIDIST_SPARES)
    launcher.check_not_singleton_trap(USE_FOR_CPU)
    torchrun_env.export(torchrun_env.torchrun_environment(job.world, USE_FOR_CPU, hosted=True))
    prepare_torch(USE_FOR_CPU, _backend.NAME)
