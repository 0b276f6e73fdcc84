"""torch.distributed's newer names and arguments: each one mpidist has, checked against torch's own
signature, and what each returns compared with MPI's own answer."""

from __future__ import annotations

import inspect
import os
import warnings

import numpy as np
import pytest
from helpers import gathered
from mpi4py import MPI

#: torch.distributed functions mpidist leaves out, and why (docs/api-guide.md says the same).
NOT_PROVIDED = {
    "all_gather_coalesced": "deprecated in torch",
    "all_reduce_coalesced": "deprecated in torch",
    "breakpoint": "an interactive debugger on one rank",
    "init_device_mesh": "torch.distributed.device_mesh: use it through the torch backend",
    "record_comm": "profiler titles of c10d Work objects",
    "register_rendezvous_handler": "torch's init_method machinery; mpidist's world is MPI's",
    "rendezvous": "torch's init_method machinery; mpidist's world is MPI's",
}
#: Parameters that differ on purpose: torch's private ones, and mpidist's additions.
OWN_PARAMETERS = {
    "init_process_group": ({"_ranks"}, {"abort_on_error"}),
    "shrink_group": (set(), {"_failed"}),
}


def test_every_torch_function_is_here_with_torch_parameters():
    td = pytest.importorskip("torch.distributed")
    import mpidist

    missing, different = [], []
    for name in sorted(dir(td)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's deprecated reduce_op
            theirs = getattr(td, name)
            if name.startswith("_") or not inspect.isfunction(theirs) or name in NOT_PROVIDED:
                continue
        ours = getattr(mpidist, name, None)
        if ours is None:
            missing.append(name)
            continue
        drop_theirs, drop_ours = OWN_PARAMETERS.get(name, (set(), set()))
        a = [p for p in inspect.signature(theirs).parameters if p not in drop_theirs]
        b = [p for p in inspect.signature(ours).parameters if p not in drop_ours]
        if a != b:
            different.append((name, a, b))
    assert not missing, f"torch.distributed functions mpidist lacks: {missing}"
    assert not different, different


@pytest.mark.mpi
def test_backend_queries(dist):
    assert dist.is_backend_available("mpi") and dist.is_backend_available("MPI")
    assert not any(dist.is_backend_available(b) for b in ("gloo", "nccl", "ucc", None))
    assert not dist.is_ucc_available() and not dist.is_xccl_available()
    assert [dist.get_default_backend_for_device(d) for d in ("cpu", "cuda", "cuda:1")] == ["mpi"] * 3
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        dist.get_default_backend_for_device("tpu")
    assert dist.get_backend_config() == "cpu:mpi,cuda:mpi"


@pytest.mark.mpi
def test_pg_count_counts_every_group_made_on_every_rank(dist, rank, size):
    before = dist.get_pg_count()
    assert before >= 1
    g = dist.new_group([0])  # a non-member counts it too, as in torch
    assert dist.get_pg_count() == before + 1
    dist.new_subgroups(1)
    assert dist.get_pg_count() == before + 1 + size
    s = dist.split_group(split_ranks=[[0]])
    assert dist.get_pg_count() == before + 2 + size
    if rank == 0:
        dist.destroy_process_group(g)
        dist.destroy_process_group(s)
    assert dist.get_pg_count() == before + 2 + size  # destroying a subgroup does not uncount it


@pytest.mark.mpi
def test_node_local_rank_is_mpis(dist, monkeypatch):
    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED, key=MPI.COMM_WORLD.Get_rank())
    try:
        expected = node.Get_rank()
    finally:
        node.Free()
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert dist.get_node_local_rank() == expected
    assert dist.get_node_local_rank(fallback_rank=99) == expected
    monkeypatch.setenv("LOCAL_RANK", "7")  # torchrun's variable comes first, as in torch
    assert dist.get_node_local_rank() == 7
    from mpidist.start import launcher
    claimed = launcher.claimed_local_rank()
    if os.environ.get("MPI_LOCALRANKID") or os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK"):
        assert claimed == expected


@pytest.mark.mpi
def test_new_group_keeps_the_given_order_without_sort_ranks(dist, rank, size):
    order = list(reversed(range(size)))
    g = dist.new_group(order, sort_ranks=False)
    assert dist.get_rank(g) == size - 1 - rank
    assert dist.get_process_group_ranks(g) == order
    got = np.zeros(size)
    dist.all_gather_into_tensor(got, np.array([float(rank)]), group=g)
    np.testing.assert_array_equal(got, np.array(order, dtype=float))  # group-rank order
    assert dist.get_global_rank(g, 0) == size - 1
    assert dist.get_rank(dist.new_group(order)) == rank  # sorted by default
    if size > 1:  # members that disagree on the order raise, each of them, instead of waiting
        mine = list(range(size)) if rank == 0 else order
        with pytest.raises(ValueError, match=rf"^new_group: rank {rank}: the members gave their ranks "
                                             "in different orders"):
            dist.new_group(mine, sort_ranks=False)
        t = np.ones(1)
        dist.all_reduce(t)
        assert t[0] == size


@pytest.mark.mpi
def test_split_group_checks_its_backend(dist, rank, size):
    g = dist.split_group(split_ranks=[list(range(size))], backend="mpi")
    assert dist.get_world_size(g) == size
    with pytest.raises(ValueError, match=rf"^split_group: rank {rank}: backend 'gloo' is not supported"):
        dist.split_group(split_ranks=[list(range(size))], backend="gloo")


@pytest.mark.mpi
def test_the_single_names_are_the_tensor_calls(dist, rank, size):
    assert dist.all_gather_single is dist.all_gather_into_tensor
    assert dist.reduce_scatter_single is dist.reduce_scatter_tensor
    inp = np.arange(3.0) + 10 * rank
    out = np.zeros(3 * size)
    dist.all_gather_single(out, inp)
    np.testing.assert_array_equal(out, np.concatenate(gathered(dist, inp)))
    big = np.arange(2.0 * size) * (rank + 1)
    mine = np.zeros(2)
    dist.reduce_scatter_single(mine, big)
    np.testing.assert_allclose(mine, np.sum(gathered(dist, big), axis=0)[2 * rank:2 * rank + 2])


@pytest.mark.mpi
def test_supports_complex_says_what_all_reduce_does(dist, rank, size):
    for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"):
        op = getattr(dist.ReduceOp, name)
        a = np.array([1 + 2j, 3 - 1j]) * (rank + 1)
        if name == "PREMUL_SUM":
            op = dist.make_premul_sum(2.0)
        try:
            dist.all_reduce(a, op=op)
            took = True
        except TypeError:
            took = False
        assert took == dist.supports_complex(op), name


@pytest.mark.mpi(min_size=2)
def test_object_lists_take_use_batch(dist, rank, size):
    if rank == 0:
        dist.send_object_list([{"a": 1}, "b"], dst=1, use_batch=True)
    elif rank == 1:
        got = [None, None]
        assert dist.recv_object_list(got, src=0, use_batch=True) == 0
        assert got == [{"a": 1}, "b"]


def test_node_local_rank_before_init_takes_the_fallback(monkeypatch):
    import mpidist

    if mpidist.is_initialized():
        pytest.skip("the default group is initialised in this process: MPI's local rank answers")
    for var in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"):
        monkeypatch.delenv(var, raising=False)
    from mpidist.start import launcher
    if launcher.claimed_local_rank() is not None:
        pytest.skip("a launcher's variable gives the local rank here")
    assert mpidist.get_node_local_rank(fallback_rank=3) == 3
    with pytest.raises(TypeError, match="fallback_rank must be an int"):
        mpidist.get_node_local_rank(fallback_rank="3")
    with pytest.raises(RuntimeError, match="LOCAL_RANK is not in the environment"):
        mpidist.get_node_local_rank()
