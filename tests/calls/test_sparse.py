"""all_reduce SUM of sparse COO torch tensors: mpidist's own call and the torch backend, vs gloo.

Run under ``mpiexec -n {1,2,3,4} python -m pytest --only-mpi``. Every rank builds every
rank's input (seeded by rank), so the expected sum is computed densely here; the torch
backend is also compared with a gloo group over the same ranks in the same job.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")


def _sparse(rank: int, shape=(6, 4), dense_dims: int = 0, dtype=torch.float64, nnz=None) -> torch.Tensor:
    """Rank ``rank``'s input: uncoalesced (repeated indices), integer values, seeded by rank."""
    g = torch.Generator().manual_seed(77 + rank)
    sparse_shape, dense_shape = shape[: len(shape) - dense_dims], shape[len(shape) - dense_dims:]
    nnz = rank + 2 if nnz is None else nnz
    idx = torch.stack([torch.randint(0, s, (nnz,), generator=g) for s in sparse_shape])
    vals = torch.randint(-3, 6, (nnz, *dense_shape), generator=g).to(dtype)
    return torch.sparse_coo_tensor(idx, vals, shape)


@pytest.fixture
def mp():
    import mpidist

    if not mpidist.is_initialized():
        mpidist.init_process_group("mpi", abort_on_error=False)
    return mpidist


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.complex64], ids=str)
@pytest.mark.parametrize("dense_dims", [0, 1])
@pytest.mark.parametrize("async_op", [False, True])
def test_mpidist_all_reduce_sparse(mp, dtype, dense_dims, async_op):
    me, n = mp.get_rank(), mp.get_world_size()
    t = _sparse(me, (5, 3, 2), dense_dims, dtype)
    work = mp.all_reduce(t, async_op=async_op)
    if async_op:
        assert work.wait()
    want = sum(_sparse(r, (5, 3, 2), dense_dims, dtype).to_dense() for r in range(n))
    assert t.is_sparse and t.is_coalesced()
    assert t.dtype == dtype and t.dense_dim() == dense_dims
    torch.testing.assert_close(t.to_dense(), want, rtol=0, atol=0)


@pytest.mark.mpi
def test_mpidist_all_reduce_sparse_some_ranks_empty(mp):
    me, n = mp.get_rank(), mp.get_world_size()
    t = _sparse(me, nnz=0 if me % 2 else None)
    mp.all_reduce(t)
    want = sum(_sparse(r, nnz=0 if r % 2 else None).to_dense() for r in range(n))
    torch.testing.assert_close(t.to_dense(), want, rtol=0, atol=0)


@pytest.mark.mpi
def test_mpidist_all_reduce_sparse_on_a_subgroup(mp):
    me, n = mp.get_rank(), mp.get_world_size()
    members = list(range(0, n, 2))
    sub = mp.new_group(members)
    t = _sparse(me)
    if me in members:
        mp.all_reduce(t, group=sub)
        want = sum(_sparse(r).to_dense() for r in members)
        torch.testing.assert_close(t.to_dense(), want, rtol=0, atol=0)


@pytest.mark.mpi
def test_sparse_refusals_name_the_call(mp):
    me = mp.get_rank()
    with pytest.raises(ValueError, match=r"all_reduce: rank \d+: op .*MAX.* not defined for sparse"):
        mp.all_reduce(_sparse(me), op=mp.ReduceOp.MAX)
    with pytest.raises(TypeError, match="all_reduce.*sparse_csr.*only sparse COO"):
        mp.all_reduce(torch.eye(3).to_sparse_csr())
    with pytest.raises(TypeError, match=r"broadcast: rank \d+: argument 'tensor' is a torch.sparse_coo"):
        mp.broadcast(_sparse(me), 0)
    with pytest.raises(TypeError, match=r"all_gather: rank \d+: argument 'tensor_list\[0\]' is a torch.sp"):
        mp.all_gather([_sparse(me) for _ in range(mp.get_world_size())], torch.zeros(6, 4))
    t = torch.ones(2)
    mp.all_reduce(t)  # still works
    assert t[0] == mp.get_world_size()


@pytest.mark.mpi
def test_mpidist_all_reduce_sparse_shape_mismatch_raises_everywhere(mp):
    me, n = mp.get_rank(), mp.get_world_size()
    if n == 1:
        pytest.skip("a mismatch needs two ranks")
    shape = (6, 4) if me else (7, 4)
    with pytest.raises(ValueError, match=r"all_reduce: rank \d+: the ranks' sparse tensors differ"):
        mp.all_reduce(_sparse(me, shape))


# ---- the torch backend, compared with gloo in the same job ----

_GLOO: list = []


@pytest.fixture
def gloo(tw):
    if not tw.is_gloo_available():
        pytest.skip("this torch has no gloo backend to compare with")
    if not _GLOO:
        _GLOO.append(tw.new_group(backend="gloo"))
    return _GLOO[0]


def _same_sparse(a, b):
    assert (a.layout, a.dtype, a.shape, a.is_coalesced()) == (b.layout, b.dtype, b.shape, b.is_coalesced())
    a, b = a.coalesce(), b.coalesce()
    assert torch.equal(a.indices(), b.indices()), (a, b)
    assert torch.equal(a.values(), b.values()), (a, b)


@pytest.mark.mpi
@pytest.mark.parametrize("dense_dims", [0, 1])
@pytest.mark.parametrize("async_op", [False, True])
def test_backend_sparse_all_reduce_matches_gloo(tw, gloo, dense_dims, async_op):
    me = tw.get_rank()
    got, want = _sparse(me, (5, 4), dense_dims), _sparse(me, (5, 4), dense_dims)
    for t, g in ((got, None), (want, gloo)):
        work = tw.all_reduce(t, group=g, async_op=async_op)
        if async_op:
            work.wait()
    _same_sparse(got, want)


@pytest.mark.mpi
def test_backend_sparse_other_ops_refused(tw, gloo):
    me = tw.get_rank()
    with pytest.raises(ValueError, match="all_reduce.*not defined for sparse"):
        tw.all_reduce(_sparse(me), op=tw.ReduceOp.MAX)
    with pytest.raises(TypeError, match="broadcast.*sparse_coo"):
        tw.broadcast(_sparse(me), 0)


def _embedding_steps(tw, group, steps=3):
    """DDP over nn.Embedding(sparse=True) + a dense layer: each step's gradients and weights."""
    me = tw.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(20, 4, sparse=True), torch.nn.Flatten(),
                                torch.nn.Linear(12, 2))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + me)
    seen = []
    for _ in range(steps):
        opt.zero_grad()
        x = torch.randint(0, 20, (5, 3), generator=g)
        ddp(x).tanh().sum().backward()
        emb_grad = model[0].weight.grad
        assert emb_grad.is_sparse
        seen.append((emb_grad.coalesce().to_dense().clone(), model[2].weight.grad.clone()))
        opt.step()
    seen.append((model[0].weight.detach().clone(), model[2].weight.detach().clone()))
    return seen


@pytest.mark.mpi
def test_ddp_sparse_embedding_matches_gloo(tw, gloo):
    got = _embedding_steps(tw, None)
    want = _embedding_steps(tw, gloo)
    # the first sparse gradient is bit for bit gloo's; later steps inherit the last-bit
    # differences of the dense all_reduce (MPI and gloo add the ranks in different orders)
    assert torch.equal(got[0][0], want[0][0])
    for (ge, gl), (we, wl) in zip(got, want):
        torch.testing.assert_close(ge, we, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(gl, wl, rtol=1e-5, atol=1e-6)
