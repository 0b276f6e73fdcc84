"""Launcher facts: what started this process, and the traps that come with each launcher."""

from __future__ import annotations

import os

from mpi4py import MPI

from . import errors

# Variables a launcher sets to the number of processes it started.
_SIZE_VARS = ("SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "WORLD_SIZE")


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def check_not_singleton_trap(call: str) -> None:
    """Refuse a world of 1 when the launcher started several processes.

    ``srun -n 4 python train.py`` without ``--mpi=pmi2`` (Slurm's ``MpiDefault=none``),
    or torchrun without MPI, starts N processes that each initialise MPI alone and all
    believe they are rank 0 of 1.
    """
    if MPI.COMM_WORLD.Get_size() != 1:
        return
    for var in _SIZE_VARS:
        n = _int_env(var)
        if n is not None and n > 1:
            raise errors.runtime_error(
                call,
                f"${var}={n} says {n} processes were launched, but MPI sees a world of 1: "
                "each process started MPI on its own (the singleton trap). Start the job "
                "with `mpiexec -n N python ...` or, under Slurm, `srun --mpi=pmi2 -n N "
                "python ...`",
            )
