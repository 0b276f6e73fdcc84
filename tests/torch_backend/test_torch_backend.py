"""torch.distributed on the ``mpidist`` backend: every call torch makes of a process group.

Run under ``mpiexec -n {1,2,3,4} python -m pytest --only-mpi``; expectations come from
numpy on the per-rank inputs, which every rank can rebuild (``rank_data``).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers import rank_data

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")
tdist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")


@pytest.fixture
def me(tw):
    return tw.get_rank()


@pytest.fixture
def n(tw):
    return tw.get_world_size()


def _inputs(n, shape, dtype, seed=0):
    return [rank_data(r, shape, dtype, seed) for r in range(n)]


def _tensor(arr, dtype_name):
    if dtype_name == "bfloat16":
        return torch.from_numpy(arr.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(arr.copy())


def _np(t):
    return t.float().numpy() if t.dtype in (torch.bfloat16, torch.float16) else t.numpy()


DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "bool", "complex64"]
OPS = {"SUM": np.sum, "PRODUCT": np.prod, "MIN": np.min, "MAX": np.max}


def _expected(op, stack, dtype_name):
    if dtype_name == "bool":
        return {"SUM": np.any, "MAX": np.any, "PRODUCT": np.all, "MIN": np.all}[op](stack, axis=0)
    if dtype_name in ("float16", "bfloat16"):
        return OPS[op](stack.astype(np.float32), axis=0)
    return OPS[op](stack, axis=0)


def _check(got, want, dtype_name):
    if dtype_name in ("float16", "bfloat16"):
        np.testing.assert_allclose(_np(got), want, rtol=3e-2)
    elif dtype_name.startswith(("float", "complex")):
        np.testing.assert_allclose(_np(got), want, rtol=1e-5)
    else:
        np.testing.assert_array_equal(_np(got), want)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("op", ["SUM", "PRODUCT", "MIN", "MAX"])
@pytest.mark.parametrize("async_op", [False, True])
def test_all_reduce(tw, me, n, dtype_name, op, async_op):
    if dtype_name == "complex64" and op != "SUM":
        pytest.skip("torch.distributed refuses PRODUCT/MIN/MAX on complex tensors")
    np_dtype = "float32" if dtype_name == "bfloat16" else dtype_name
    ins = _inputs(n, (5, 3), np_dtype)
    t = _tensor(ins[me], dtype_name)
    work = tw.all_reduce(t, op=getattr(tw.ReduceOp, op), async_op=async_op)
    if async_op:
        assert work.wait()
        assert work.is_completed()
    stack = np.stack([_np(_tensor(a, dtype_name)) for a in ins])
    _check(t, _expected(op, stack, dtype_name), dtype_name)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype_name", ["float32", "float64", "float16", "bfloat16", "complex128"])
def test_all_reduce_avg_and_premul_sum(tw, me, n, dtype_name):
    np_dtype = "float32" if dtype_name == "bfloat16" else dtype_name
    ins = _inputs(n, (7,), np_dtype, seed=3)
    stack = np.stack([_np(_tensor(a, dtype_name)) for a in ins]).astype(
        np.complex128 if dtype_name.startswith("complex") else np.float64)
    t = _tensor(ins[me], dtype_name)
    tw.all_reduce(t, op=tw.ReduceOp.AVG)
    _check(t, stack.mean(axis=0), dtype_name)
    t = _tensor(ins[me], dtype_name)
    tw.all_reduce(t, op=tw._make_nccl_premul_sum(2.5))
    _check(t, 2.5 * stack.sum(axis=0), dtype_name)


@pytest.mark.mpi
def test_all_reduce_future_completes_without_wait(tw, me, n):
    """DDP's pattern: the future completes on its own, then-callbacks run on the value."""
    t = torch.full((1000,), float(me + 1))
    fut = tw.all_reduce(t, async_op=True).get_future()
    chained = fut.then(lambda f: f.value()[0] * 2)
    deadline = 0
    while not chained.done() and deadline < 20000:  # bounded: 20 s of 1 ms sleeps
        torch.futures.wait_all([])  # no-op; keep the loop free of MPI calls
        import time

        time.sleep(1e-3)
        deadline += 1
    assert chained.done(), "the future never completed without wait()"
    np.testing.assert_allclose(chained.value().numpy(), 2 * n * (n + 1) / 2)


@pytest.mark.mpi
@pytest.mark.parametrize("limit", [1 << 20, 0], ids=["blocking", "overlapped"])
def test_all_reduce_work_of_one_tensor(tw, me, n, limit, monkeypatch):
    """The one-tensor path (blocking where the bytes are under the group's limit, else the
    progress thread's): torch's Work answers as for any call, its future holds the caller's
    tensor the moment ``wait()`` returns (the progress thread used to mark the work done just
    before it set the future, so ``get_future().value()`` right after ``wait()`` hit torch's
    ``completed()`` assertion in most calls)."""
    from mpidist.torch import backend

    monkeypatch.setattr(backend, "SYNC_BYTES", limit)  # read when a group is made
    g = tw.new_group(list(range(n)))
    for i in range(40):
        t = torch.full((6,), float(me + i))
        work = tw.all_reduce(t, group=g, async_op=True)
        assert work.wait()
        assert work.is_completed() and work.is_success() and work.exception() is None
        got = work.get_future().value()
        assert isinstance(got, list) and got[0] is t
        assert work.result()[0] is t
        np.testing.assert_allclose(t.numpy(), np.full(6, n * (n - 1) / 2 + n * i))
        later = tw.all_reduce(torch.ones(2), group=g, async_op=True)
        deadline = time.monotonic() + 30
        while not later.is_completed() and time.monotonic() < deadline:
            time.sleep(1e-3)
        assert later.get_future().value()[0].tolist() == [n, n]
    tw.destroy_process_group(g)


@pytest.mark.mpi
def test_all_reduce_coalesced(tw, me, n):
    ts = [torch.full((3,), float(me)), torch.full((2, 2), float(2 * me))]
    work = tw.group.WORLD.allreduce_coalesced(ts, tdist.AllreduceCoalescedOptions())
    work.wait()
    total = sum(range(n))
    np.testing.assert_array_equal(ts[0].numpy(), np.full(3, total))
    np.testing.assert_array_equal(ts[1].numpy(), np.full((2, 2), 2 * total))


@pytest.mark.mpi
@pytest.mark.parametrize("async_op", [False, True])
def test_broadcast(tw, me, n, async_op):
    for src in range(n):
        ins = _inputs(n, (4, 2), "float64", seed=src)
        t = torch.from_numpy(ins[me].copy())
        w = tw.broadcast(t, src=src, async_op=async_op)
        if async_op:
            w.wait()
        np.testing.assert_array_equal(t.numpy(), ins[src])


@pytest.mark.mpi
def test_reduce(tw, me, n):
    ins = _inputs(n, (6,), "int64")
    for dst in range(n):
        t = torch.from_numpy(ins[me].copy())
        tw.reduce(t, dst=dst, op=tw.ReduceOp.SUM)
        want = np.sum(ins, axis=0) if me == dst else ins[me]
        np.testing.assert_array_equal(t.numpy(), want)


@pytest.mark.mpi
@pytest.mark.parametrize("async_op", [False, True])
def test_all_gather(tw, me, n, async_op):
    ins = _inputs(n, (3,), "float32")
    out = [torch.zeros(3) for _ in range(n)]
    w = tw.all_gather(out, torch.from_numpy(ins[me]), async_op=async_op)
    if async_op:
        w.wait()
    for r in range(n):
        np.testing.assert_array_equal(out[r].numpy(), ins[r])


@pytest.mark.mpi
def test_all_gather_into_tensor(tw, me, n):
    ins = _inputs(n, (2, 3), "float32")
    out = torch.zeros(n * 2, 3)
    tw.all_gather_into_tensor(out, torch.from_numpy(ins[me]))
    np.testing.assert_array_equal(out.numpy(), np.concatenate(ins))


@pytest.mark.mpi
def test_reduce_scatter(tw, me, n):
    ins = [[rank_data(r, (4,), "float64", seed=10 + j) for j in range(n)] for r in range(n)]
    out = torch.zeros(4, dtype=torch.float64)
    tw.reduce_scatter(out, [torch.from_numpy(a) for a in ins[me]])
    np.testing.assert_allclose(out.numpy(), sum(ins[r][me] for r in range(n)), rtol=1e-12)


@pytest.mark.mpi
def test_reduce_scatter_tensor(tw, me, n):
    ins = _inputs(n, (n * 3,), "float32")
    out = torch.zeros(3)
    tw.reduce_scatter_tensor(out, torch.from_numpy(ins[me]), op=tw.ReduceOp.MAX)
    np.testing.assert_array_equal(out.numpy(), np.max(ins, axis=0)[me * 3:(me + 1) * 3])


@pytest.mark.mpi
def test_gather_and_scatter(tw, me, n):
    ins = _inputs(n, (5,), "int32")
    for root in range(n):
        gl = [torch.zeros(5, dtype=torch.int32) for _ in range(n)] if me == root else None
        tw.gather(torch.from_numpy(ins[me]), gather_list=gl, dst=root)
        if me == root:
            for r in range(n):
                np.testing.assert_array_equal(gl[r].numpy(), ins[r])
        out = torch.zeros(5, dtype=torch.int32)
        sl = [torch.from_numpy(a) for a in ins] if me == root else None
        tw.scatter(out, scatter_list=sl, src=root)
        np.testing.assert_array_equal(out.numpy(), ins[me])


@pytest.mark.mpi
def test_all_to_all(tw, me, n):
    ins = [[rank_data(r, (2,), "float32", seed=20 + j) for j in range(n)] for r in range(n)]
    out = [torch.zeros(2) for _ in range(n)]
    tw.all_to_all(out, [torch.from_numpy(a) for a in ins[me]])
    for j in range(n):
        np.testing.assert_array_equal(out[j].numpy(), ins[j][me])


@pytest.mark.mpi
def test_all_to_all_single_even_and_uneven(tw, me, n):
    ins = _inputs(n, (n * 2, 3), "float64")
    out = torch.zeros(n * 2, 3, dtype=torch.float64)
    tw.all_to_all_single(out, torch.from_numpy(ins[me]))
    np.testing.assert_array_equal(out.numpy(), np.concatenate([ins[j][me * 2:me * 2 + 2] for j in range(n)]))
    # rank r sends (j + 1) rows to rank j
    rows = [[j + 1 for j in range(n)] for _ in range(n)]
    send = [rank_data(r, (sum(rows[r]), 2), "float32", seed=5) for r in range(n)]
    recv_sizes = [rows[j][me] for j in range(n)]
    out = torch.zeros(sum(recv_sizes), 2)
    tw.all_to_all_single(out, torch.from_numpy(send[me]), output_split_sizes=recv_sizes,
                         input_split_sizes=rows[me])
    offs = [np.cumsum([0] + rows[j])[me] for j in range(n)]
    want = np.concatenate([send[j][offs[j]:offs[j] + rows[j][me]] for j in range(n)])
    np.testing.assert_array_equal(out.numpy(), want)


@pytest.mark.mpi
def test_barrier_and_async_barrier(tw):
    tw.barrier()
    assert tw.barrier(async_op=True).wait()


@pytest.mark.mpi(min_size=2)
def test_send_recv_ring_and_any_source(tw, me, n):
    nxt, prv = (me + 1) % n, (me - 1) % n
    out = torch.zeros(4)
    sw = tw.isend(torch.full((4,), float(me)), dst=nxt, tag=3)
    assert tw.recv(out, src=prv, tag=3) == prv
    sw.wait()
    np.testing.assert_array_equal(out.numpy(), np.full(4, prv))
    if me == 0:
        got = sorted(tw.recv(t := torch.zeros(1), tag=4) + 100 * int(t.item()) for _ in range(n - 1))
        assert got == sorted(r + 100 * r for r in range(1, n))
    else:
        tw.send(torch.full((1,), float(me)), dst=0, tag=4)


@pytest.mark.mpi(min_size=2)
def test_recv_wait_timeout_raises(tw, me, n):
    t = torch.zeros(2)
    if me == 0:
        w = tw.irecv(t, src=1, tag=77)
        with pytest.raises(RuntimeError, match="timed out"):
            w.wait(timeout=__import__("datetime").timedelta(milliseconds=200))
    tw.barrier()
    if me == 1:
        tw.send(torch.ones(2), dst=0, tag=77)
    if me == 0:
        w.wait()
        np.testing.assert_array_equal(t.numpy(), np.ones(2))


@pytest.mark.mpi
def test_object_collectives(tw, me, n):
    objs = [None] * n
    tw.all_gather_object(objs, {"rank": me, "sq": [me] * me})
    assert objs == [{"rank": r, "sq": [r] * r} for r in range(n)]
    lst = [me, "x"] if me == n - 1 else [None, None]
    tw.broadcast_object_list(lst, src=n - 1)
    assert lst == [n - 1, "x"]
    gl = [None] * n if me == 0 else None
    tw.gather_object(("g", me), gl, dst=0)
    if me == 0:
        assert gl == [("g", r) for r in range(n)]
    out = [None]
    tw.scatter_object_list(out, [f"s{r}" for r in range(n)] if me == 0 else None, src=0)
    assert out == [f"s{me}"]


@pytest.mark.mpi
def test_new_group_and_new_subgroups(tw, me, n):
    members = list(range(0, n, 2))
    g = tw.new_group(members)
    if me in members:
        t = torch.full((3,), float(me))
        tw.all_reduce(t, group=g)
        np.testing.assert_array_equal(t.numpy(), np.full(3, float(sum(members))))
        assert tw.get_rank(g) == members.index(me)
        assert tw.get_process_group_ranks(g) == members
    else:
        assert g == tw.GroupMember.NON_GROUP_MEMBER
    size = 2 if n % 2 == 0 else 1
    cur, allg = tw.new_subgroups(group_size=size)
    assert len(allg) == n // size
    t = torch.full((2,), float(me))
    tw.all_reduce(t, group=cur)
    base = me - me % size
    np.testing.assert_array_equal(t.numpy(), np.full(2, float(sum(range(base, base + size)))))
    objs = [None] * size
    tw.all_gather_object(objs, me, group=cur)
    assert objs == list(range(base, base + size))


@pytest.mark.mpi(min_size=4)
def test_device_mesh_2x2(tw, me, n):
    if n != 4:
        pytest.skip("init_device_mesh('cpu', (2, 2)) needs exactly 4 ranks")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    grid = np.arange(4).reshape(2, 2)
    row, col = divmod(me, 2)
    t = torch.full((2,), float(me))
    tw.all_reduce(t, group=mesh.get_group("tp"))
    np.testing.assert_array_equal(t.numpy(), np.full(2, float(grid[row].sum())))
    t = torch.full((2,), float(me))
    tw.all_reduce(t, group=mesh.get_group("dp"))
    np.testing.assert_array_equal(t.numpy(), np.full(2, float(grid[:, col].sum())))
    import torch.distributed._functional_collectives as fc

    got = fc.all_reduce(torch.full((2,), float(me)), "sum", mesh["tp"])
    np.testing.assert_array_equal(got.numpy(), np.full(2, float(grid[row].sum())))


@pytest.mark.mpi
def test_functional_collectives(tw, me, n):
    import torch.distributed._functional_collectives as fc

    got = fc.all_reduce(torch.full((3,), float(me)), "sum", tw.group.WORLD)
    np.testing.assert_array_equal(got.numpy(), np.full(3, float(sum(range(n)))))
    gathered = fc.all_gather_tensor(torch.full((2,), float(me)), 0, tw.group.WORLD)
    np.testing.assert_array_equal(gathered.numpy(), np.repeat(np.arange(n, dtype=np.float32), 2))


@pytest.mark.mpi
def test_bad_inputs_raise_clear_errors(tw, me):
    with pytest.raises(ValueError, match="not contiguous"):
        tw.all_reduce(torch.zeros(4, 4).t())
    with pytest.raises(TypeError, match="AVG"):
        tw.all_reduce(torch.zeros(3, dtype=torch.int32), op=tw.ReduceOp.AVG)
    with pytest.raises(TypeError, match="bitwise"):
        tw.all_reduce(torch.zeros(3), op=tw.ReduceOp.BAND)
    tw.barrier()  # every rank still in step


@pytest.mark.mpi
def test_backend_name_and_mpidist_world_coexist(tw, dist, me, n):
    assert tw.get_backend() == "mpidist"
    assert dist.get_rank() == me and dist.get_world_size() == n
    t = np.full(2, float(me))
    dist.all_reduce(t)  # mpidist's own world, next to torch's default group
    np.testing.assert_array_equal(t, np.full(2, float(sum(range(n)))))


@pytest.mark.mpi
def test_abort_runs_the_abort_hooks_and_reconfigure_is_offered(tw, me, n):
    """What torch 2.14's fault-tolerance queries get: abort hooks on ``abort``, and reconfigure
    offered (``_supports_reconfigure`` true, this process's handle; the calls themselves are
    tested in test_reconfigure.py)."""
    from mpi4py import MPI
    from torch.distributed.distributed_c10d import _abort_process_group

    g = tw.new_group(list(range(n)))
    ran: list[int] = []
    g.register_abort_hook(7, lambda: ran.append(me))
    assert g.supports_reconfigure is True
    assert g.get_reconfigure_handle() == f"mpi:world:{MPI.COMM_WORLD.Get_rank()}"
    if hasattr(tw, "_supports_reconfigure"):  # torch >= 2.14
        assert tw._supports_reconfigure(g) is True
        assert tw._get_reconfigure_handle(g) == g.get_reconfigure_handle()
    _abort_process_group(g)
    assert ran == [me]
    tw.barrier()
