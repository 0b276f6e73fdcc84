"""``init_distributed_mode``: initialise the world and say where this process sits in the job.

The launcher facts come from :mod:`mpidist.start.launcher`; here they become a :class:`DistInfo`,
a current GPU, and rank-0-only printing, as the DETR/DeiT helper of that name does.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any

from ..core import errors, groups, job
from ..start import printing, world
from ..start.launcher import crosscheck, detect_launcher, node_layout


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
    :func:`mpidist.start.printing.restore`.

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
    groups.check_backend(backend, call)
    if not world.is_initialized():
        world.init_process_group(backend)
    rank, size = world.get_rank(), world.get_world_size()
    local_rank, local_size, node_rank, num_nodes = node_layout(job.world)
    launcher = detect_launcher(size)
    note = crosscheck(launcher, local_rank)
    if note is not None:
        warnings.warn(errors.message(call, note), RuntimeWarning, stacklevel=2)
    device = select_device(local_rank, set_device)
    torch_backend = None
    if torch_distributed or (torch_distributed is None and "torch" in sys.modules):
        from ..torch.start import start_torch_distributed  # the DETR helper's init_process_group

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
