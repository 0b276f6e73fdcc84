"""all_reduce, 8 B … 16 MiB: mpidist next to raw mpi4py (and the C floor) in the same job.

issue 2's first benchmark, run through ``run.py``'s machinery::

    mpiexec -n 2 python benchmarks/allreduce.py
    mpiexec -n 4 python benchmarks/allreduce.py --impls mpidist,mpi4py --rounds 11

Extra arguments go to ``run.py`` (``--thread-level single``, ``--rounds``, ``--target``, ...).
Goal: mpidist / mpi4py ≤ 1.10 at 8 B and ≤ 1.02 at ≥ 1 MiB.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402

SIZES = "8,64,512,4K,32K,256K,1M,4M,16M"

if __name__ == "__main__":
    defaults = ["--calls", "all_reduce", "--impls", "mpidist,mpi4py,c", "--sizes", SIZES,
                "--name", "allreduce_n{n}_{level}"]
    sys.exit(run.main(defaults + sys.argv[1:]))
