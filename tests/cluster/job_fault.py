"""A job for the failure tests (tests/cluster/test_cluster_failures.py): all_reduce in a loop until a fault.

    mpiexec ... python tests/cluster/job_fault.py TIMEOUT_S

Every rank prints ``READY <rank> <host>`` once the connections are up, then runs
``all_reduce`` on the world (group timeout ``TIMEOUT_S``) until the test cuts a node's link
or kills a node; what happens then is the test's subject.
"""

from __future__ import annotations

import socket
import sys
from datetime import timedelta

import numpy as np

import mpidist as dist


def main() -> int:
    dist.init_process_group("mpi", timeout=timedelta(seconds=float(sys.argv[1])))
    a = np.ones(100_000)
    dist.all_reduce(a)
    print(f"READY {dist.get_rank()} {socket.gethostname()}", flush=True)
    while True:
        a[:] = 1.0
        dist.all_reduce(a)


if __name__ == "__main__":
    sys.exit(main())
