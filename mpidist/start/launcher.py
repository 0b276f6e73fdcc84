"""Launcher facts: what started this process, where it sits, and the traps of each launcher.

MPI is the source of truth. The node-local rank comes from splitting the world by shared
memory (``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)``) and the node rank from the
communicator of the node leaders; the launchers' own variables are only cross-checked,
because some are wrong by design (under ``sbatch`` + ``mpiexec`` hydra's proxy leaves
every rank with ``SLURM_PROCID=0``, ``SLURM_NTASKS=1``).
"""

from __future__ import annotations

import os

from mpi4py import MPI

from ..core import errors, job
from . import libmpi, mpi_library

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


def claimed_local_rank() -> int | None:
    """The node-local rank the launcher's own variable gives (``None``: no launcher says)."""
    var = _LOCAL_RANK_VAR.get(detect_launcher())
    return _int_env(var) if var else None


def _hint(var: str) -> str:
    if var.startswith("SLURM"):
        return ("Slurm started the tasks without MPI (MpiDefault=none): use `srun --mpi=pmi2 -n N "
                "python ...`, or `mpiexec -n N python ...` inside the allocation")
    if var == "WORLD_SIZE":
        return ("torchrun-style variables are set but no MPI launcher started the processes: "
                "use `mpiexec -n N python ...` instead of torchrun")
    # an MPI launcher's size variable says N > 1 but MPI runs a world of 1: another MPI's launcher
    launcher = {"OMPI_COMM_WORLD_SIZE": "Open MPI's mpiexec",
                "PMIX_SIZE": "a PMIx launcher (Open MPI's mpiexec, srun --mpi=pmix)",
                "PMI_SIZE": "an MPICH-family mpiexec (Hydra) or srun --mpi=pmi2"}.get(var, "the launcher")
    vendor, version = MPI.get_vendor()
    library = libmpi.loaded_path()
    return (f"{launcher} started them, but mpi4py loaded {vendor} {'.'.join(map(str, version))} "
            f"({library or 'unknown path'}), which did not join that job. "
            + mpi_library.ways_to_match(library, " ", intel=vendor == "Intel MPI"))


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
    comm = comm if comm is not None else job.world
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
