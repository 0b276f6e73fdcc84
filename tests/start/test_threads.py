"""Ranks' threads against the node's cores (mpidist/start/threads.py), and what mpidist does
with it: ``python -m mpidist.run``'s ``OMP_WAIT_POLICY``, and the torch backend's warning."""

from __future__ import annotations

import os
import socket
import sys
import warnings

import pytest
from helpers import gathered
from mpi4py import MPI

from mpidist.core import cpus, groups
from mpidist.start import threads, torchrun_env

ALL2, ALL8 = {0, 1}, set(range(8))


@pytest.mark.parametrize("masks, per_rank, want", [
    ([ALL2, ALL2], 1, False),        # 2 ranks share 2 cores: a core each
    ([ALL2, ALL2], 2, True),         # 4 threads on 2 shared cores
    ([ALL2] * 4, 1, True),           # more ranks than cores
    ([ALL2], 2, False),              # one rank, its threads fill the cores
    ([ALL2], 3, True),
    ([{0}, {1}], 1, False),          # bound: each rank on a core of its own, one thread
    ([{0}, {1}], 2, True),           # bound, two threads on its one core
    ([ALL8] * 4, 2, False),          # 8 threads on 8 shared cores
    ([{0, 1}, {2, 3}, {4, 5}, {6, 7}], 4, True),  # bound to 2 cores each, 4 threads
    ([{0}, {1}, {0}], 1, True),      # Intel MPI's pinning of 3 ranks on 2 cores: two on core 0
    ([{0, 1}, {2}, {3}], 1, False),  # 3 ranks on 4 cores, one with two of them
    ([{0, 1}, {1}], 1, True),        # a core shared by a bound rank and half of another
])
def test_oversubscribed_from_every_ranks_mask(masks, per_rank, want):
    assert threads.oversubscribed(len(masks), per_rank, masks) is want


def test_the_busiest_core_counts_each_ranks_threads_over_its_mask():
    assert threads.busiest_core([{0}, {1}, {0}], 1) == 2
    assert threads.busiest_core([{0, 1, 2}] * 3, 1) == 1  # exact: no 0.999... from thirds
    assert threads.busiest_core([{0, 1}, {1}], [4, 1]) == 3  # one count per rank
    assert threads.busiest_core([], 1) == 0


def test_without_the_nodes_masks_every_rank_is_taken_to_share_this_ones(monkeypatch):
    monkeypatch.setattr(groups.registry, "local_masks", ())
    assert threads.node_masks(3) == [cpus.mask()] * 3
    monkeypatch.setattr(groups.registry, "local_masks", (frozenset({0}), frozenset({1})))
    assert threads.node_masks(2) == [{0}, {1}]
    assert threads.node_masks(3) == [cpus.mask()] * 3  # another count of ranks: not those


@pytest.mark.parametrize("value, want", [("4", 4), ("4,2", 4), (" 2 ", 2), ("", None), (None, None),
                                         ("0", None), ("x", None), ("-1", None)])
def test_threads_of_reads_the_outer_level_of_omp_num_threads(value, want):
    assert threads.threads_of(value) == want


@pytest.mark.parametrize("var", threads.WAIT_VARIABLES)
def test_a_policy_the_user_chose_is_kept(var):
    assert threads.wait_policy(2, 2, {}, [ALL2, ALL2]) == "PASSIVE"
    assert threads.wait_policy(2, 2, {var: "ACTIVE"}, [ALL2, ALL2]) is None
    assert threads.advice(2, 2, True, {var: "1"}, [ALL2, ALL2]) is None


def test_advice_only_for_openmp_and_oversubscribed():
    text = threads.advice(2, 2, True, {}, [ALL2, ALL2])
    assert "2 ranks x 2 torch threads on this node's 2 cores" in text and "OMP_WAIT_POLICY=PASSIVE" in text
    flag = "-x OMP_WAIT_POLICY" if "Open MPI" in MPI.get_vendor()[0] else "-genv OMP_WAIT_POLICY"
    assert f"mpiexec {flag}" in text  # the loaded MPI's launcher's way to export it
    assert threads.advice(2, 2, False, {}, [ALL2, ALL2]) is None  # torch on its native thread pool
    assert threads.advice(2, 1, True, {}, [ALL2, ALL2]) is None
    assert threads.advice(4, 1, True, {}, [ALL2] * 4) is None  # oversubscribed, but no OpenMP threads
    assert threads.advice(2, 2, True, {}, [{0, 1}, {2, 3}]) is None  # bound: two cores each


@pytest.mark.mpi
def test_the_nodes_masks_are_the_ranks_real_ones_and_every_rank_decides_alike(dist, rank):
    """The masks gathered at init are each rank's ``sched_getaffinity``, whatever the launcher
    pinned (Intel MPI pins each rank to cores of its own; MPICH leaves them the machine), and
    every rank of the node takes the same decision from them."""
    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    try:
        real = node.allgather(os.sched_getaffinity(0))
        assert list(groups.registry.local_masks) == real
        assert threads.gather_masks(MPI.COMM_WORLD) == real
        cores = set().union(*real)
        for n in (1, 2, 3):
            answers = node.allgather(threads.oversubscribed(node.Get_size(), n))
            assert len(set(answers)) == 1, f"the node's ranks disagree at {n} thread(s): {answers}"
            busiest = max(sum(n / len(m) for m in real if c in m) for c in cores)
            assert answers[0] == (busiest > 1 + 1e-9)
    finally:
        node.Free()


def _local_size(dist, rank):
    hosts = gathered(dist, socket.gethostname())
    return sum(h == hosts[rank] for h in hosts)


@pytest.mark.mpi(min_size=2)
def test_mpidist_run_sets_a_passive_wait_where_the_threads_exceed_the_cores(dist, rank, monkeypatch):
    """The environment ``python -m mpidist.run`` exports, computed from the real MPI job."""
    local = _local_size(dist, rank)
    cores = threads.usable_cores()
    for var in threads.WAIT_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    many = max(cores, 2)  # OpenMP threads that wait (2 or more), a core's worth each: local (>= 2 here
    # when one node) x many > cores where the ranks share their cores
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.delitem(sys.modules, "torch")  # as before the script's import torch
    monkeypatch.setenv("OMP_NUM_THREADS", str(many))
    env = torchrun_env.torchrun_environment(MPI.COMM_WORLD)
    want = "PASSIVE" if threads.oversubscribed(local, many) else None
    assert env.get("OMP_WAIT_POLICY") == want
    if local > 1 and set(groups.registry.local_masks) == {cpus.mask()}:  # every rank on the same cores
        assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # no OpenMP threads to wait: nothing to set
    assert "OMP_WAIT_POLICY" not in torchrun_env.torchrun_environment(MPI.COMM_WORLD)
    monkeypatch.setenv("OMP_NUM_THREADS", str(many))
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's choice: left as it is
    assert "OMP_WAIT_POLICY" not in torchrun_env.torchrun_environment(MPI.COMM_WORLD)
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setitem(sys.modules, "torch", object())  # torch loaded: too late to set it
    assert "OMP_WAIT_POLICY" not in torchrun_env.torchrun_environment(MPI.COMM_WORLD)


@pytest.mark.mpi(min_size=2)
def test_the_torch_backend_warns_once_per_node_where_openmp_spins(dist, rank, monkeypatch):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")
    from mpidist.torch import backend

    if "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("this torch build runs its kernels on its native thread pool, not OpenMP")
    for var in threads.WAIT_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    pg = groups.world("test")
    hosts = gathered(dist, socket.gethostname())
    first = hosts.index(hosts[rank]) == rank
    local = sum(h == hosts[rank] for h in hosts)
    saved = torch.get_num_threads()
    many = max(threads.usable_cores(), 2)  # OpenMP threads that wait: 2 or more
    try:
        torch.set_num_threads(many)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            text = backend.warn_if_oversubscribed(pg)
        ours = [w for w in caught if issubclass(w.category, RuntimeWarning) and "mpidist:" in str(w.message)]
        if threads.oversubscribed(local, many):
            assert text is not None and f"{local} ranks x {many} torch threads" in text
            assert len(ours) == (1 if first else 0)
        else:
            assert text is None and not ours
        monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
        assert backend.warn_if_oversubscribed(pg) is None
        monkeypatch.delenv("OMP_WAIT_POLICY")
        torch.set_num_threads(1)
        if not threads.oversubscribed(local, 1):
            assert backend.warn_if_oversubscribed(pg) is None
    finally:
        torch.set_num_threads(saved)
