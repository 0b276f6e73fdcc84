"""Process groups in jobs of their own: failures whose symptom is a deadlock.

Serial tests; each starts its own ``mpiexec`` through ``launcher``, under a timeout.
"""

from __future__ import annotations

import textwrap

from launcher import run_mpi

# A regression that hung: ``split_group`` on a subgroup is called only by the subgroup's
# members; a later world-wide ``new_group`` must still agree among all ranks. Run as its own
# job, under a timeout, because the failure mode is a deadlock.
SUBGROUP_THEN_WORLD = textwrap.dedent("""
    import numpy as np
    import mpidist as dist
    dist.init_process_group(abort_on_error=False)
    n, me = dist.get_world_size(), dist.get_rank()
    tail = dist.new_group(list(range(1, n)))
    if me != 0:
        dist.split_group(tail, [[0]])
        dist.new_subgroups(1, group=tail)
    dist.new_group(list(range(1, n)), use_local_synchronization=True) if me != 0 else None
    pg = dist.new_group(list(range(n)))
    t = np.ones(1)
    dist.all_reduce(t, group=pg)
    print("SUM", int(t[0]), flush=True)
    dist.destroy_process_group()
""")


def test_groups_made_by_some_ranks_do_not_desync_later_groups():
    proc = run_mpi(3, ["-c", SUBGROUP_THEN_WORLD], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUM 3") == 3, proc.stdout + proc.stderr
