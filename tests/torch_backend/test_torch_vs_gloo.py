"""Every torch.distributed call on an mpidist group and on a gloo group, same job, same inputs.

The default group is mpidist's; ``new_group(backend="gloo")`` builds a gloo group over the same
ranks from the default group's store. Each case runs once on each group with identical inputs
and the outputs (values, shapes, dtypes, layouts) must be identical. Inputs are small integers
(held in float tensors too), so sums are exact whatever order either backend reduces in.
``sub`` runs on the ranks ``1..n-1`` (global ranks differ from group ranks there).

Run under ``mpiexec -n {1,2,3,4} python -m pytest --only-mpi``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")
tdist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
if not tdist.is_gloo_available():
    pytest.skip("this torch has no gloo backend to compare with", allow_module_level=True)

_GROUPS: dict[str, tuple] = {}


@pytest.fixture
def groups(tw, request):
    """(mpidist group, gloo group, global ranks) for ``world`` or ``sub``; ``None`` off-group."""
    which = request.param
    if which not in _GROUPS:
        n = tw.get_world_size()
        ranks = list(range(n)) if which == "world" or n == 1 else list(range(1, n))
        mine = tw.group.WORLD if which == "world" else tw.new_group(ranks)
        gloo = tw.new_group(ranks, backend="gloo")
        _GROUPS[which] = (mine, gloo, ranks)
    mine, gloo, ranks = _GROUPS[which]
    assert tw.get_backend(mine if tw.get_rank() in ranks else None) == "mpidist"
    return mine, gloo, ranks


def _data(seed: int, rank: int, shape, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + rank)
    t = torch.randint(1, 7, shape, generator=g)
    if dtype.is_complex:
        return torch.complex(t.float(), torch.randint(1, 7, shape, generator=g).float()).to(dtype)
    return t.to(dtype)


def _same(a, b, where=""):
    if isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.layout) == (b.dtype, b.shape, b.layout), f"{where}: {a!r} vs {b!r}"
        if a.layout == torch.sparse_coo:
            assert a.is_coalesced() == b.is_coalesced(), f"{where}: coalesced {a.is_coalesced()} vs gloo"
            a, b = a.coalesce(), b.coalesce()
            assert torch.equal(a.indices(), b.indices()), f"{where}: indices {a} vs gloo {b}"
            a, b = a.values(), b.values()
        assert torch.equal(a, b), f"{where}: mpidist {a} vs gloo {b}"
    else:
        assert a == b, f"{where}: mpidist {a!r} vs gloo {b!r}"


def _compare(tw, groups, fn):
    """``fn(group, me, ranks)`` on both groups (members only); outputs must be identical."""
    mine, gloo, ranks = groups
    me = tw.get_rank()
    if me not in ranks:
        return
    got = fn(mine, me, ranks)
    want = fn(gloo, me, ranks)
    _same(got, want, fn.__name__ if hasattr(fn, "__name__") else "")


def _wait(work, async_op):
    if async_op:
        assert work is not None
        work.wait()
    return work


GROUPS = pytest.mark.parametrize("groups", ["world", "sub"], indirect=True)
ASYNC = pytest.mark.parametrize("async_op", [False, True])
DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.complex64]


@pytest.mark.mpi
@GROUPS
@ASYNC
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"])
def test_all_reduce(tw, groups, async_op, dtype, op):
    if dtype.is_complex and op != "SUM":
        pytest.skip("torch.distributed refuses PRODUCT/MIN/MAX and bitwise ops on complex tensors")
    if op.startswith("B") and dtype.is_floating_point:
        pytest.skip("bitwise ops are defined on integer tensors only")

    def f(g, me, ranks):
        t = _data(1, me, (4, 3), dtype)
        _wait(tw.all_reduce(t, op=getattr(tw.ReduceOp, op), group=g, async_op=async_op), async_op)
        return t

    _compare(tw, groups, f)


@pytest.mark.mpi
@GROUPS
@ASYNC
@pytest.mark.parametrize("op", ["SUM", "MAX"])
def test_all_reduce_coalesced(tw, groups, async_op, op):
    def f(g, me, ranks):
        ts = [_data(2, me, (3,)), _data(3, me, (2, 2)), _data(4, me, (5,))]
        _wait(tw.all_reduce_coalesced(ts, op=getattr(tw.ReduceOp, op), group=g, async_op=async_op), async_op)
        return ts

    _compare(tw, groups, f)


@pytest.mark.mpi
@GROUPS
@ASYNC
def test_broadcast(tw, groups, async_op):
    def f(g, me, ranks):
        out = []
        for src in ranks:
            t = _data(5, me, (6,), torch.float64)
            _wait(tw.broadcast(t, src=src, group=g, async_op=async_op), async_op)
            out.append(t)
        return out

    _compare(tw, groups, f)


@pytest.mark.mpi
@GROUPS
@ASYNC
@pytest.mark.parametrize("op", ["SUM", "MIN"])
def test_reduce(tw, groups, async_op, op):
    def f(g, me, ranks):
        out = []
        for dst in ranks:
            t = _data(6, me, (2, 3))
            _wait(tw.reduce(t, dst=dst, op=getattr(tw.ReduceOp, op), group=g, async_op=async_op), async_op)
            out.append(t if me == dst else None)  # other ranks' buffers are scratch in torch
        return out

    _compare(tw, groups, f)


@pytest.mark.mpi
@GROUPS
@ASYNC
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.complex64], ids=str)
def test_all_gather(tw, groups, async_op, dtype):
    def f(g, me, ranks):
        outs = [torch.zeros(3, 2, dtype=dtype) for _ in ranks]
        _wait(tw.all_gather(outs, _data(7, me, (3, 2), dtype), group=g, async_op=async_op), async_op)
        return outs

    _compare(tw, groups, f)


@pytest.mark.mpi
@GROUPS
@ASYNC
@pytest.mark.parametrize("inputs", ["one", "as_many_as_ranks", "ranks_plus_one", "mixed_shapes"])
def test_all_gather_coalesced(tw, groups, async_op, inputs):
    """torch's layout is output_tensor_lists[rank][input]; equal counts once hid a transpose."""

    def f(g, me, ranks):
        n = len(ranks)
        shapes = {"one": [(3,)], "as_many_as_ranks": [(2,)] * n, "ranks_plus_one": [(2,)] * (n + 1),
                  "mixed_shapes": [(3,), (2, 2), (1,)]}[inputs]
        ins = [_data(8 + k, me, s) for k, s in enumerate(shapes)]
        outs = [[torch.zeros(s) for s in shapes] for _ in ranks]
        fut = tw.all_gather_coalesced(outs, ins, group=g, async_op=async_op)
        if async_op:
            fut.wait()
        return outs

    _compare(tw, groups, f)


@pytest.mark.mpi
@GROUPS
@ASYNC
def test_all_gather_into_tensor(tw, groups, async_op):
    # only the flat output: gloo refuses the stacked (n, 4) form that NCCL and mpidist take
    def f(g, me, ranks):
        out = torch.zeros(4 * len(ranks))
        _wait(tw.all_gather_into_tensor(out, _data(9, me, (4,)), group=g, async_op=async_op), async_op)
        return out

    _compare(tw, groups, f)


@pytest.mark.mpi
@GROUPS
@ASYNC
@pytest.mark.parametrize("op", ["SUM", "MAX"])
def test_reduce_scatter(tw, groups, async_op, op):
    def f(g, me, ranks):
        ins = [_data(10 + j, me, (3,)) for j in range(len(ranks))]
        out = torch.zeros(3)
        _wait(tw.reduce_scatter(out, ins, op=getattr(tw.ReduceOp, op), group=g, async_op=async_op), async_op)
        return out

    _compare(tw, groups, f)


@pytest.mark.mpi
@GROUPS
@ASYNC
def test_reduce_scatter_tensor(tw, groups, async_op):
    def f(g, me, ranks):
        out = torch.zeros(2, 3)
        inp = _data(11, me, (2 * len(ranks), 3))
        _wait(tw.reduce_scatter_tensor(out, inp, group=g, async_op=async_op), async_op)
        return out

    _compare(tw, groups, f)


@pytest.mark.mpi
@GROUPS
@ASYNC
def test_gather(tw, groups, async_op):
    def f(g, me, ranks):
        out = []
        for dst in ranks:
            lst = [torch.zeros(2, 2) for _ in ranks] if me == dst else None
            _wait(tw.gather(_data(12, me, (2, 2)), lst, dst=dst, group=g, async_op=async_op), async_op)
            out.append(lst)
        return out

    _compare(tw, groups, f)


@pytest.mark.mpi
@GROUPS
@ASYNC
def test_scatter(tw, groups, async_op):
    def f(g, me, ranks):
        out = []
        for src in ranks:
            lst = [_data(13 + j, me, (5,)) for j in range(len(ranks))] if me == src else None
            t = torch.zeros(5)
            _wait(tw.scatter(t, lst, src=src, group=g, async_op=async_op), async_op)
            out.append(t)
        return out

    _compare(tw, groups, f)


@pytest.mark.mpi
@GROUPS
@ASYNC
def test_all_to_all_lists(tw, groups, async_op):
    # equal sizes: gloo's list form refuses uneven ones (all_to_all_single below takes them)
    def f(g, me, ranks):
        ins = [_data(14 + j, me, (3,)) for j in range(len(ranks))]
        outs = [torch.zeros(3) for _ in ranks]
        _wait(tw.all_to_all(outs, ins, group=g, async_op=async_op), async_op)
        return outs

    _compare(tw, groups, f)


@pytest.mark.mpi
@GROUPS
@ASYNC
@pytest.mark.parametrize("splits", [False, True])
def test_all_to_all_single(tw, groups, async_op, splits):
    def f(g, me, ranks):
        n, gi = len(ranks), ranks.index(me)
        if splits:
            ins_sp = [gi + j + 1 for j in range(n)]
            outs_sp = [j + gi + 1 for j in range(n)]
            inp, out = _data(15, me, (sum(ins_sp), 2)), torch.zeros(sum(outs_sp), 2)
            work = tw.all_to_all_single(out, inp, outs_sp, ins_sp, group=g, async_op=async_op)
        else:
            inp, out = _data(15, me, (2 * n, 3)), torch.zeros(2 * n, 3)
            work = tw.all_to_all_single(out, inp, group=g, async_op=async_op)
        _wait(work, async_op)
        return out

    _compare(tw, groups, f)


@pytest.mark.mpi
@GROUPS
def test_batch_isend_irecv_ring(tw, groups):
    def f(g, me, ranks):
        n, gi = len(ranks), ranks.index(me)
        if n == 1:
            return None
        send = _data(16, me, (4,))
        recv = torch.zeros(4)
        ops = [tw.P2POp(tw.isend, send, ranks[(gi + 1) % n], g),
               tw.P2POp(tw.irecv, recv, ranks[(gi - 1) % n], g)]
        for w in tw.batch_isend_irecv(ops):
            w.wait()
        return recv

    _compare(tw, groups, f)


@pytest.mark.mpi
@GROUPS
def test_send_recv_and_isend_irecv(tw, groups):
    def f(g, me, ranks):
        n, gi = len(ranks), ranks.index(me)
        if n == 1:
            return None
        out = []
        for tag in (0, 7):
            t = _data(17 + tag, me, (3,)) if gi == 0 else torch.zeros(3)
            if gi == 0:
                for r in ranks[1:]:
                    tw.send(t, dst=r, group=g, tag=tag)
            else:
                tw.recv(t, src=ranks[0], group=g, tag=tag)
            out.append(t)
        t = _data(19, me, (2,)) if gi == n - 1 else torch.zeros(2)
        works = ([tw.isend(t, dst=r, group=g) for r in ranks[:-1]] if gi == n - 1
                 else [tw.irecv(t, src=ranks[-1], group=g)])
        for w in works:
            w.wait()
        out.append(t)
        return out

    _compare(tw, groups, f)


@pytest.mark.mpi
@GROUPS
def test_barrier_and_object_calls(tw, groups):
    def f(g, me, ranks):
        tw.barrier(group=g)
        objs = [None] * len(ranks)
        tw.all_gather_object(objs, {"rank": me, "data": list(range(me))}, group=g)
        lst = [f"from {ranks[0]}", 3] if me == ranks[0] else [None, None]
        tw.broadcast_object_list(lst, src=ranks[0], group=g)
        gathered = [None] * len(ranks) if me == ranks[-1] else None
        tw.gather_object(("x", me), gathered, dst=ranks[-1], group=g)
        scattered = [None]
        tw.scatter_object_list(scattered, [i * 10 for i in range(len(ranks))] if me == ranks[0] else None,
                               src=ranks[0], group=g)
        return [objs, lst, gathered, scattered]

    _compare(tw, groups, f)


@pytest.mark.mpi
@GROUPS
@pytest.mark.parametrize("call", ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"])
def test_coalescing_manager(tw, groups, call):
    """``_coalescing_manager`` hands the backend's ``*_coalesced`` entry points several tensors at once."""

    def f(g, me, ranks):
        n = len(ranks)
        if call == "all_reduce":
            outs = [_data(30 + k, me, (k + 2,)) for k in range(3)]
            with tw._coalescing_manager(group=g, async_ops=True) as cm:
                for t in outs:
                    tw.all_reduce(t, group=g)
        elif call == "all_gather_into_tensor":
            outs = [torch.zeros((k + 1) * n) for k in range(3)]
            with tw._coalescing_manager(group=g, async_ops=True) as cm:
                for k, o in enumerate(outs):
                    tw.all_gather_into_tensor(o, _data(31 + k, me, (k + 1,)), group=g)
        else:
            outs = [torch.zeros(k + 1) for k in range(3)]
            with tw._coalescing_manager(group=g, async_ops=True) as cm:
                for k, o in enumerate(outs):
                    tw.reduce_scatter_tensor(o, _data(32 + k, me, ((k + 1) * n,)), group=g)
        cm.wait()
        return outs

    _compare(tw, groups, f)
