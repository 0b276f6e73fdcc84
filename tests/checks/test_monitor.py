"""monitored_barrier and the stall watch: hangs end in bounded time with the rank named.

The failure-injection cases (a rank that never arrives, a rank that sleeps past the
timeout, a job stuck past the group's timeout) run as their own mpiexec jobs, in
``test_monitor_jobs.py``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from mpidist.checks import stall


@pytest.mark.mpi
def test_monitored_barrier_passes_when_everyone_arrives(dist, rank, size):
    for _ in range(3):
        assert dist.monitored_barrier(timeout=timedelta(seconds=60)) is None
    dist.monitored_barrier(timeout=60, wait_all_ranks=True)
    dist.monitored_barrier()  # the group's timeout


@pytest.mark.mpi
def test_monitored_barrier_on_a_subgroup(dist, rank, size):
    members = list(range(0, size, 2))
    g = dist.new_group(members)
    if rank in members:
        dist.monitored_barrier(group=g, timeout=60)
        dist.destroy_process_group(g)
    dist.barrier()


@pytest.mark.mpi
def test_monitored_barrier_rejects_bad_timeouts(dist):
    with pytest.raises(ValueError, match="monitored_barrier: rank .*timeout must be positive"):
        dist.monitored_barrier(timeout=0)
    with pytest.raises(TypeError, match="timeout must be a timedelta or seconds"):
        dist.monitored_barrier(timeout="5s")


def test_stall_watch_setting():
    assert stall.stall_warn_s() >= 0
    import os

    old = os.environ.get("MPIDIST_STALL_WARN_S")
    try:
        os.environ["MPIDIST_STALL_WARN_S"] = "0"
        assert stall.stall_warn_s() == 0
        os.environ["MPIDIST_STALL_WARN_S"] = "2.5"
        assert stall.stall_warn_s() == 2.5
        os.environ["MPIDIST_STALL_WARN_S"] = "soon"
        with pytest.raises(ValueError, match="MPIDIST_STALL_WARN_S='soon'"):
            stall.stall_warn_s()
    finally:
        if old is None:
            os.environ.pop("MPIDIST_STALL_WARN_S", None)
        else:
            os.environ["MPIDIST_STALL_WARN_S"] = old
