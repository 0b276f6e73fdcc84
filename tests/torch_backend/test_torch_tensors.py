"""torch CPU tensors as buffers: zero-copy results, every reduce dtype incl. bfloat16, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import rank_data

torch = pytest.importorskip("torch")

TORCH_DTYPES = {"bool": torch.bool, "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16,
                "int32": torch.int32, "int64": torch.int64, "float16": torch.float16,
                "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
                "complex64": torch.complex64, "complex128": torch.complex128}


def tensor_data(rank: int, shape, name: str, seed: int = 0) -> torch.Tensor:
    """rank_data as a torch tensor (bfloat16 via float32, rounded by torch)."""
    if name == "bfloat16":
        return torch.from_numpy(rank_data(rank, shape, np.float32, seed)).to(torch.bfloat16)
    return torch.from_numpy(rank_data(rank, shape, np.dtype(name), seed))


def wide(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(np.float64)
    return t.numpy()


def still_works(dist, size):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == size


@pytest.mark.mpi
@pytest.mark.parametrize("name", sorted(TORCH_DTYPES))
def test_all_reduce_sum_and_max_every_torch_dtype(dist, rank, size, name):
    ins = [tensor_data(r, (2, 3), name, seed=1) for r in range(size)]
    for op, fold in ((dist.ReduceOp.SUM, np.add), (dist.ReduceOp.MAX, np.maximum)):
        if op is dist.ReduceOp.MAX and name.startswith("complex"):
            continue
        t = ins[rank].clone()
        storage = t.data_ptr()
        dist.all_reduce(t, op=op)
        assert t.data_ptr() == storage and t.dtype == TORCH_DTYPES[name]  # in place, zero-copy
        if name == "bool":
            want = np.logical_or.reduce([x.numpy() for x in ins])
            np.testing.assert_array_equal(t.numpy(), want)
        else:
            want = fold.reduce([wide(x).astype(np.complex128 if "complex" in name else np.float64)
                                for x in ins])
            rtol = {"bfloat16": 3e-2, "float16": 4e-3}.get(name, 1e-6)
            np.testing.assert_allclose(wide(t), want, rtol=rtol)


@pytest.mark.mpi
def test_bfloat16_avg_matches_torch_rounding(dist, rank, size):
    ins = [tensor_data(r, (8,), "bfloat16", seed=2) for r in range(size)]
    t = ins[rank].clone()
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    want = (sum(x.float() for x in ins) / size)
    np.testing.assert_allclose(t.float().numpy(), want.numpy(), rtol=2e-2)


@pytest.mark.mpi
def test_torch_reduce_op_is_accepted(dist, rank, size):
    import torch.distributed as tdist

    t = torch.tensor([float(rank), -float(rank)])
    dist.all_reduce(t, op=tdist.ReduceOp.MAX)
    assert t.tolist() == [size - 1.0, 0.0]


@pytest.mark.mpi
def test_views_with_offset_and_requires_grad(dist, rank, size):
    base = torch.zeros(10)
    view = base[3:6]
    view.fill_(rank + 1.0)
    dist.all_reduce(view)
    total = float(sum(range(1, size + 1)))
    assert base.tolist() == [0.0] * 3 + [total] * 3 + [0.0] * 4
    w = torch.full((2,), rank + 1.0, requires_grad=True)
    dist.all_reduce(w)
    assert w.tolist() == [total, total] and w.requires_grad
    s = torch.tensor(float(rank))  # 0-dim
    dist.all_reduce(s)
    assert s.item() == sum(range(size))


@pytest.mark.mpi
def test_collectives_with_tensors(dist, rank, size):
    # broadcast
    t = torch.arange(4, dtype=torch.int64) + 10 * rank
    dist.broadcast(t, src=size - 1)
    assert t.tolist() == (torch.arange(4) + 10 * (size - 1)).tolist()
    # all_gather into torch.chunk views of one tensor (no staging copy)
    whole = torch.zeros(size * 3)
    dist.all_gather(list(torch.chunk(whole, size)), torch.full((3,), float(rank)))
    assert whole.tolist() == [float(r) for r in range(size) for _ in range(3)]
    # all_gather_into_tensor, stacked
    out = torch.zeros(size, 2, dtype=torch.float64)
    dist.all_gather_into_tensor(out, torch.tensor([rank, -rank], dtype=torch.float64))
    assert out.tolist() == [[float(r), -float(r)] for r in range(size)]
    # reduce_scatter_tensor
    inp = torch.arange(size * 2, dtype=torch.float32) * (rank + 1)
    res = torch.zeros(2)
    dist.reduce_scatter_tensor(res, inp)
    k = sum(range(1, size + 1))
    assert res.tolist() == [float(2 * rank * k), float((2 * rank + 1) * k)]
    # all_to_all_single with uneven splits: rank i sends i + j + 1 rows of width 2 to rank j
    ins = torch.cat([torch.full((rank + j + 1, 2), 100.0 * rank + j) for j in range(size)])
    out = torch.zeros(sum(j + rank + 1 for j in range(size)), 2)
    w = dist.all_to_all_single(out, ins, [j + rank + 1 for j in range(size)],
                               [rank + j + 1 for j in range(size)], async_op=True)
    assert w.get_future().wait()[0] is out
    want = torch.cat([torch.full((j + rank + 1, 2), 100.0 * j + rank) for j in range(size)])
    assert torch.equal(out, want)


@pytest.mark.mpi(min_size=2)
def test_send_recv_tensors(dist, rank, size):
    if rank == 0:
        dist.send(torch.tensor([1.5, 2.5], dtype=torch.bfloat16), dst=size - 1, tag=9)
    elif rank == size - 1:
        t = torch.zeros(2, dtype=torch.bfloat16)
        assert dist.recv(t, tag=9) == 0
        assert t.tolist() == [1.5, 2.5]
    still_works(dist, size)


@pytest.mark.mpi
def test_tensor_errors(dist, rank, size):
    cases = [
        (lambda: dist.all_reduce(torch.zeros(4, 2).t()), ValueError, "not contiguous"),
        (lambda: dist.all_reduce(torch.zeros(8)[::2]), ValueError, "not contiguous"),
        (lambda: dist.all_reduce(torch.zeros(2, dtype=torch.float8_e4m3fn)), TypeError,
         "torch.float8_e4m3fn"),
        (lambda: dist.all_reduce(torch.zeros(2), op=dist.ReduceOp.BAND), TypeError, "bitwise"),
        (lambda: dist.all_reduce(torch.zeros(2, dtype=torch.int32), op=dist.ReduceOp.AVG), TypeError,
         "floating-point"),
        (lambda: dist.all_gather_into_tensor(torch.zeros(2 * size, dtype=torch.float64), torch.zeros(2)),
         TypeError, "float64"),
    ]
    for fn, exc, text in cases:
        with pytest.raises(exc, match=rf"rank {rank}: .*{text}"):
            fn()
    still_works(dist, size)


@pytest.mark.mpi
def test_conjugated_views(dist, rank, size):
    x = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64) * (rank + 1)
    # as an input, a lazily conjugated view sends the conjugated values
    out = torch.zeros(2 * size, dtype=torch.complex64)
    dist.all_gather_into_tensor(out, x.conj())
    want = torch.cat([(torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64) * (r + 1)).conj()
                      for r in range(size)])
    assert torch.equal(out, want)
    # as an output it cannot receive in place: refused instead of losing the result
    with pytest.raises(ValueError, match=rf"^all_reduce: rank {rank}: argument 'tensor' is a lazily conj"):
        dist.all_reduce(x.conj())
    still_works(dist, size)
