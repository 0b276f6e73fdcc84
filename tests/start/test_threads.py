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

from mpidist.start import threads, torchrun_env


@pytest.mark.parametrize("local, per_rank, cores, machine, want", [
    (2, 1, 2, 2, False),   # a core each
    (2, 2, 2, 2, True),    # 4 threads on 2 shared cores
    (4, 1, 2, 2, True),    # more ranks than cores
    (1, 2, 2, 2, False),   # one rank, its threads fill the cores
    (1, 3, 2, 2, True),
    (2, 1, 1, 2, False),   # bound: each rank on a core of its own, one thread
    (2, 2, 1, 2, True),    # bound, two threads on its one core
    (4, 2, 8, 8, False),   # 8 threads on 8 shared cores
    (4, 4, 2, 8, True),    # bound to 2 cores each, 4 threads
])
def test_oversubscribed_compares_the_threads_with_the_cores_they_share(local, per_rank, cores, machine, want):
    assert threads.oversubscribed(local, per_rank, cores, machine) is want


@pytest.mark.parametrize("value, want", [("4", 4), ("4,2", 4), (" 2 ", 2), ("", None), (None, None),
                                         ("0", None), ("x", None), ("-1", None)])
def test_threads_of_reads_the_outer_level_of_omp_num_threads(value, want):
    assert threads.threads_of(value) == want


@pytest.mark.parametrize("var", threads.WAIT_VARIABLES)
def test_a_policy_the_user_chose_is_kept(var):
    assert threads.wait_policy(2, 2, {}, cores=2) == "PASSIVE"
    assert threads.wait_policy(2, 2, {var: "ACTIVE"}, cores=2) is None
    assert threads.advice(2, 2, True, {var: "1"}, cores=2) is None


def test_advice_only_for_openmp_and_oversubscribed():
    text = threads.advice(2, 2, True, {}, cores=2)
    assert "2 ranks x 2 torch threads" in text and "OMP_WAIT_POLICY=PASSIVE" in text
    assert threads.advice(2, 2, False, {}, cores=2) is None  # torch on its native thread pool
    assert threads.advice(2, 1, True, {}, cores=2) is None
    assert threads.advice(4, 1, True, {}, cores=2) is None  # oversubscribed, but no OpenMP threads


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
    many = cores  # local (>= 2 here when one node) x cores > cores
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.delitem(sys.modules, "torch")  # as before the script's import torch
    monkeypatch.setenv("OMP_NUM_THREADS", str(many))
    env = torchrun_env.torchrun_environment(MPI.COMM_WORLD)
    want = "PASSIVE" if threads.oversubscribed(local, many) else None
    assert env.get("OMP_WAIT_POLICY") == want
    if local > 1 and cores == (os.cpu_count() or cores):  # unbound ranks share every core
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
    from mpidist.core import groups
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
    try:
        torch.set_num_threads(threads.usable_cores())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            text = backend.warn_if_oversubscribed(pg)
        ours = [w for w in caught if issubclass(w.category, RuntimeWarning) and "mpidist:" in str(w.message)]
        if threads.oversubscribed(local, threads.usable_cores()):
            assert text is not None and f"{local} ranks x {threads.usable_cores()} torch threads" in text
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
