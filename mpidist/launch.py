"""Launcher facts: what started this process, where it sits, and the traps of each launcher.

MPI is the source of truth. The node-local rank comes from splitting the world by shared
memory (``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)``) and the node rank from the
communicator of the node leaders; the launchers' own variables are only cross-checked,
because some are wrong by design (under ``sbatch`` + ``mpiexec`` hydra's proxy leaves
every rank with ``SLURM_PROCID=0``, ``SLURM_NTASKS=1``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any

from mpi4py import MPI

from . import errors, printing

# Variables a launcher sets to the number of processes it started.
_SIZE_VARS = ("SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "WORLD_SIZE")

OPEN_MPI = "Open MPI"
HYDRA = "MPICH/Hydra"
INTEL_MPI = "Intel MPI"
SLURM = "Slurm srun (PMI2)"
TORCHRUN = "torchrun variables"
SINGLETON = "singleton"
UNKNOWN = "unknown"

# The node-local rank each launcher claims, checked against MPI's.
_LOCAL_RANK_VAR = {OPEN_MPI: "OMPI_COMM_WORLD_LOCAL_RANK", HYDRA: "MPI_LOCALRANKID",
                   INTEL_MPI: "MPI_LOCALRANKID", SLURM: "SLURM_LOCALID", TORCHRUN: "LOCAL_RANK"}


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _hint(var: str) -> str:
    if var.startswith("SLURM"):
        return ("Slurm started the tasks without MPI (MpiDefault=none): use `srun --mpi=pmi2 -n N "
                "python ...`, or `mpiexec -n N python ...` inside the allocation")
    if var == "WORLD_SIZE":
        return ("torchrun-style variables are set but no MPI launcher started the processes: "
                "use `mpiexec -n N python ...` instead of torchrun")
    return ("the launcher and the MPI library that mpi4py loaded do not match (compare "
            "`python -m mpidist info` with `which mpiexec`): start the job with `mpiexec -n N "
            "python ...` of that library, or pick the library with MPI4PY_LIBMPI / MPI4PY_MPIABI")


def check_not_singleton_trap(call: str) -> None:
    """Refuse a world of 1 when the launcher started several processes.

    ``srun -n 4 python train.py`` without ``--mpi=pmi2`` (Slurm's ``MpiDefault=none``),
    torchrun without MPI, or an ``mpiexec`` from another MPI than mpi4py's, starts N
    processes that each initialise MPI alone and all believe they are rank 0 of 1.
    """
    if MPI.COMM_WORLD.Get_size() != 1:
        return
    for var in _SIZE_VARS:
        n = _int_env(var)
        if n is not None and n > 1:
            raise errors.runtime_error(
                call,
                f"${var}={n} says {n} processes were launched, but MPI sees a world of 1: "
                f"each process started MPI on its own (the singleton trap). {_hint(var)}",
            )


def detect_launcher(size: int | None = None) -> str:
    """Name what started this process, from the variables each launcher sets.

    One of ``"Open MPI"``, ``"MPICH/Hydra"``, ``"Intel MPI"``, ``"Slurm srun (PMI2)"``,
    ``"torchrun variables"``, ``"singleton"`` (a plain ``python``) or ``"unknown"``.
    """
    env = os.environ
    if size is None:
        size = MPI.COMM_WORLD.Get_size()
    if "OMPI_COMM_WORLD_SIZE" in env or "PRTE_LAUNCHED" in env or "OMPI_COMMAND" in env:
        return OPEN_MPI
    if "MPI_LOCALRANKID" in env or "HYDI_CONTROL_FD" in env or "HYDRA_CONTROL_FD" in env:
        return INTEL_MPI if "Intel" in MPI.get_vendor()[0] or "I_MPI_ROOT" in env else HYDRA
    if "SLURM_STEP_ID" in env and ("PMI_FD" in env or "PMI_RANK" in env or "PMIX_RANK" in env):
        return SLURM
    if "TORCHELASTIC_RUN_ID" in env or ("LOCAL_RANK" in env and "WORLD_SIZE" in env):
        return TORCHRUN
    if size == 1 and "PMI_RANK" not in env and "PMIX_RANK" not in env:
        return SINGLETON
    return UNKNOWN


def node_layout(comm: MPI.Intracomm | None = None) -> tuple[int, int, int, int]:
    """``(local_rank, local_world_size, node_rank, num_nodes)`` as MPI sees them.

    Collective over ``comm`` (default ``MPI_COMM_WORLD``): ``MPI_Comm_split_type`` with
    ``MPI_COMM_TYPE_SHARED`` gives the node; ``MPI_Comm_split`` of the node leaders
    numbers the nodes in order of their lowest rank.
    """
    comm = comm if comm is not None else MPI.COMM_WORLD
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        local_rank, local_size = node.Get_rank(), node.Get_size()
        leaders = comm.Split(0 if local_rank == 0 else MPI.UNDEFINED, key=comm.Get_rank())
        place = None
        if leaders != MPI.COMM_NULL:
            place = (leaders.Get_rank(), leaders.Get_size())
            leaders.Free()
        node_rank, num_nodes = node.bcast(place, root=0)
    finally:
        node.Free()
    return local_rank, local_size, node_rank, num_nodes


def crosscheck(launcher: str, local_rank: int) -> str | None:
    """A warning text when the launcher's own local-rank variable disagrees with MPI's."""
    var = _LOCAL_RANK_VAR.get(launcher)
    claimed = _int_env(var) if var else None
    if claimed is None or claimed == local_rank:
        return None
    return (f"${var}={claimed} but MPI (MPI_COMM_TYPE_SHARED) gives local rank {local_rank}; "
            "mpidist uses MPI's")


def _loaded_or_gpu_host(module: str) -> bool:
    """Consult ``module`` if the program imported it, or if this host has NVIDIA devices."""
    if module in sys.modules:
        return True
    return os.path.exists("/dev/nvidiactl") and importlib.util.find_spec(module) is not None


def select_device(local_rank: int, set_device: bool = True) -> str:
    """``"cuda:<local_rank % device_count>"`` when torch (or CuPy) sees a GPU, else ``"cpu"``.

    ``device_count`` honours ``CUDA_VISIBLE_DEVICES`` (as set per rank by Slurm's
    ``--gpus-per-task``/``--gpu-bind``). With ``set_device`` the device becomes current
    (``torch.cuda.set_device`` / ``cupy.cuda.Device.use``).
    """
    if _loaded_or_gpu_host("torch"):
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            idx = local_rank % torch.cuda.device_count()
            if set_device:
                torch.cuda.set_device(idx)
            return f"cuda:{idx}"
    if _loaded_or_gpu_host("cupy"):
        try:
            import cupy

            count = cupy.cuda.runtime.getDeviceCount()
        except Exception:  # CuPy without a usable driver is simply "no GPU"
            count = 0
        if count > 0:
            idx = local_rank % count
            if set_device:
                cupy.cuda.Device(idx).use()
            return f"cuda:{idx}"
    return "cpu"


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job, as returned by :func:`init_distributed_mode`."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    launcher: str
    device: str


def init_distributed_mode(args: Any = None, *, backend: str = "mpi", set_device: bool = True,
                          quiet_non_master: bool = True, torch_distributed: bool | None = None) -> DistInfo:
    """Initialise the world if needed and describe this process's place in it.

    Collective: every rank calls it. Calls :func:`~mpidist.init_process_group` when the
    world is not initialised yet, then ``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`` and
    ``MPI_Comm_split`` for the node layout. With ``set_device`` the GPU
    ``local_rank % device_count`` becomes current (when torch or CuPy sees one). With
    ``quiet_non_master`` only rank 0's ``print`` writes (``print(..., force=True)``
    always does) and ``logging`` records get a ``[rank N]`` prefix; undo both with
    :func:`mpidist.printing.restore`.

    ``args`` (an ``argparse.Namespace``), when given, gets ``rank``, ``world_size``,
    ``gpu`` (the CUDA index, or ``None`` on CPU), ``distributed`` (``world_size > 1``)
    and ``dist_backend``, as the DETR/DeiT helper sets them.

    In a program that imported torch (or with ``torch_distributed=True``; ``False``
    never), torch.distributed's default group is started too, ``nccl`` or ``mpidist``,
    and ``args.dist_backend`` names it: see :mod:`mpidist.torch.start`. Otherwise
    ``args.dist_backend`` is ``"mpi"`` (mpidist's own world only).

    Example::

        info = mpidist.init_distributed_mode(args)
        print(f"rank {info.rank}/{info.world_size} on node {info.node_rank}: {info.device}")
    """
    call = "init_distributed_mode"
    from . import world

    if not isinstance(backend, str) or backend.lower() != "mpi":
        raise errors.value_error(
            call, f"backend {backend!r} is not supported; the supported backend is 'mpi'"
        )
    if not world.is_initialized():
        world.init_process_group(backend)
    rank, size = world.get_rank(), world.get_world_size()
    local_rank, local_size, node_rank, num_nodes = node_layout(MPI.COMM_WORLD)
    launcher = detect_launcher(size)
    note = crosscheck(launcher, local_rank)
    if note is not None:
        warnings.warn(errors.message(call, note), RuntimeWarning, stacklevel=2)
    device = select_device(local_rank, set_device)
    torch_backend = None
    if torch_distributed or (torch_distributed is None and "torch" in sys.modules):
        from .torch.start import start_torch_distributed  # the DETR helper's init_process_group

        torch_backend = start_torch_distributed(device, local_size, getattr(args, "dist_url", None))
    if quiet_non_master:
        printing.setup_for_distributed(rank == 0)
        printing.prefix_logging(rank)
    if args is not None:
        args.rank, args.world_size = rank, size
        args.gpu = int(device.split(":")[1]) if device.startswith("cuda") else None
        args.distributed = size > 1
        args.dist_backend = torch_backend or "mpi"
    return DistInfo(rank, size, local_rank, local_size, node_rank, num_nodes, launcher, device)
