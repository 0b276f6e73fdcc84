"""Real GPU buffers (torch CUDA, CuPy) through every collective; run by tests/gpu/run.sh.

The run sets ``MPIDIST_CUDA_AWARE=0`` (host staging) or ``1`` (device pointers straight to
MPI, skipped unless the MPI library says it is CUDA-aware). Expectations come from numpy on
the known per-rank inputs.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from mpidist import gpu

pytestmark = pytest.mark.mpi

if os.environ.get(gpu.ENV_CUDA_AWARE) == "1" and gpu.query_cuda_support() != 1:
    pytest.skip("MPIDIST_CUDA_AWARE=1 needs a CUDA-aware MPI", allow_module_level=True)

LIBS = []
try:
    import torch

    if torch.cuda.is_available():
        LIBS.append("torch")
except ImportError:
    torch = None
try:
    import cupy

    if cupy.cuda.runtime.getDeviceCount() > 0:
        LIBS.append("cupy")
except Exception:
    cupy = None
if not LIBS:
    pytest.skip("no GPU library with a device", allow_module_level=True)

CASES = [(lib, dt) for lib in LIBS for dt in ("float32", "float16", "bfloat16")
         if not (lib == "cupy" and dt == "bfloat16")]


@pytest.fixture(autouse=True)
def device(rank):
    n = torch.cuda.device_count() if "torch" in LIBS else cupy.cuda.runtime.getDeviceCount()
    if "torch" in LIBS:
        torch.cuda.set_device(rank % n)
    if cupy is not None:
        cupy.cuda.Device(rank % n).use()


def values(rank: int, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed * 100 + rank)
    return rng.integers(1, 5, n).astype(np.float64) / 4  # exact in every dtype, small sums exact


def dev(lib: str, dt: str, v: np.ndarray):
    if lib == "torch":
        return torch.tensor(v, dtype=getattr(torch, dt), device="cuda")
    return cupy.asarray(v.astype(dt))


def host(x) -> np.ndarray:
    if torch is not None and isinstance(x, torch.Tensor):
        return x.float().cpu().numpy().astype(np.float64)
    return cupy.asnumpy(x).astype(np.float64)


@pytest.mark.parametrize("lib,dt", CASES)
def test_reductions(dist, rank, size, lib, dt):
    n = 1 << 16
    xs = np.stack([values(r, n) for r in range(size)])
    t = dev(lib, dt, xs[rank])
    dist.all_reduce(t)
    np.testing.assert_array_equal(host(t), xs.sum(0))
    t = dev(lib, dt, xs[rank])
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    np.testing.assert_allclose(host(t), xs.mean(0), rtol=2**-7)
    t = dev(lib, dt, xs[rank])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True).wait()
    np.testing.assert_array_equal(host(t), xs.max(0))
    t = dev(lib, dt, xs[rank])
    dist.reduce(t, dst=0)
    np.testing.assert_array_equal(host(t), xs.sum(0) if rank == 0 else xs[rank])
    m = n // size
    out = dev(lib, dt, np.zeros(m))
    dist.reduce_scatter_tensor(out, dev(lib, dt, xs[rank][:m * size]))
    np.testing.assert_array_equal(host(out), xs[:, rank * m:(rank + 1) * m].sum(0))
    out = dev(lib, dt, np.zeros(m))
    dist.reduce_scatter(out, [dev(lib, dt, xs[rank][i * m:(i + 1) * m]) for i in range(size)])
    np.testing.assert_array_equal(host(out), xs[:, rank * m:(rank + 1) * m].sum(0))


@pytest.mark.parametrize("lib,dt", CASES)
def test_data_movement(dist, rank, size, lib, dt):
    n = 1000
    xs = [values(r, n, seed=1) for r in range(size)]
    t = dev(lib, dt, xs[rank])
    dist.broadcast(t, src=0)
    np.testing.assert_array_equal(host(t), xs[0])
    outs = [dev(lib, dt, np.zeros(n)) for _ in range(size)]
    dist.all_gather(outs, dev(lib, dt, xs[rank]))
    np.testing.assert_array_equal(np.stack([host(o) for o in outs]), np.stack(xs))
    big = dev(lib, dt, np.zeros(n * size))
    dist.all_gather_into_tensor(big, dev(lib, dt, xs[rank]))
    np.testing.assert_array_equal(host(big), np.concatenate(xs))
    outs = [dev(lib, dt, np.zeros(n)) for _ in range(size)] if rank == 0 else None
    dist.gather(dev(lib, dt, xs[rank]), outs, dst=0)
    if rank == 0:
        np.testing.assert_array_equal(np.stack([host(o) for o in outs]), np.stack(xs))
    t = dev(lib, dt, np.zeros(n))
    dist.scatter(t, [dev(lib, dt, x) for x in xs] if rank == 0 else None, src=0)
    np.testing.assert_array_equal(host(t), xs[rank])
    recv = dev(lib, dt, np.zeros(n * size))
    dist.all_to_all_single(recv, dev(lib, dt, np.concatenate([xs[rank]] * size)))
    np.testing.assert_array_equal(host(recv), np.concatenate(xs))
    outs = [dev(lib, dt, np.zeros(n)) for _ in range(size)]
    dist.all_to_all(outs, [dev(lib, dt, xs[rank]) for _ in range(size)])
    np.testing.assert_array_equal(np.stack([host(o) for o in outs]), np.stack(xs))
    if size > 1:
        t = dev(lib, dt, np.zeros(n))
        if rank == 0:
            dist.send(dev(lib, dt, xs[0]), dst=1)
        elif rank == 1:
            dist.recv(t, src=0)
            np.testing.assert_array_equal(host(t), xs[0])


@pytest.mark.skipif("torch" not in LIBS, reason="needs torch CUDA")
def test_producing_stream_is_synchronised(dist, rank, size):
    x = torch.full((1 << 22,), float(rank), device="cuda")
    for _ in range(20):  # queue work on the current stream; MPI must see its result
        x.mul_(1.0).add_(0.0)
    x.add_(1.0)
    dist.all_reduce(x)
    assert float(x[-1]) == sum(r + 1 for r in range(size))


def test_path_in_use(dist, rank, size):
    lib = LIBS[0]
    before = gpu.POOL.allocations
    big = dev(lib, "float32", np.zeros(4 * size))
    dist.all_gather_into_tensor(big, dev(lib, "float32", np.ones(4)))
    if os.environ.get(gpu.ENV_CUDA_AWARE) == "1":
        assert gpu.POOL.allocations == before  # device pointers went to MPI directly
    else:
        assert gpu.POOL.allocations > 0  # staged through the pool (reused: maybe no new buffer)
    assert gpu.POOL.in_use == 0
