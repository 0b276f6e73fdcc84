"""What the Slurm jobs of ``test_slurm.py`` and ``test_slurm_run.py`` share: size, time limit, environment.

The ``slurm`` fixture itself is in this folder's ``conftest.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

NTASKS = 4
JOB_TIMEOUT = float(os.environ.get("MPIDIST_SLURM_JOB_TIMEOUT", "300"))


def job_env(bin_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with ``bin_dir`` first on PATH and no launcher leftovers.

    The job's ``python`` and ``mpiexec`` are then the ones of ``bin_dir``'s virtualenv.
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_LOCALRANK"))}
    env.pop("MPIDIST_ABORT_ON_ERROR", None)  # jobs run with the default: a failing rank ends the job
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    env.update(extra or {})
    return env
