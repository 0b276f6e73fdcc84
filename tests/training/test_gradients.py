"""Gradient averaging on one flat buffer: values, in-place results, buckets, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import gathered, rank_data

from mpidist.training.gradients import FlatBuffer, average_gradients, flatten, unflatten

SHAPES = [(3, 4), (5,), (), (0,), (2, 3, 2)]
TOL = {np.float16: 2e-3, np.float32: 1e-6, np.float64: 1e-13}


def _grads(rank, dtype, seed=0):
    return [rank_data(rank, s, dtype, seed=seed + i) for i, s in enumerate(SHAPES)]


def _expected(size, dtype, seed=0):
    per_rank = [_grads(r, dtype, seed) for r in range(size)]
    return [np.mean(np.stack([g[i].astype(np.float64) for g in per_rank]), axis=0)
            for i in range(len(SHAPES))]


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("bucket_cap_mb", [None, 16 / 2**20])  # 16-byte buckets: many Iallreduce
def test_average_gradients_is_the_mean_over_ranks(dist, rank, size, dtype, bucket_cap_mb):
    grads = _grads(rank, dtype)
    ids = [id(g) for g in grads]
    average_gradients(grads, bucket_cap_mb=bucket_cap_mb)
    assert [id(g) for g in grads] == ids  # in place
    for got, want in zip(grads, _expected(size, dtype)):
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=TOL[dtype], atol=TOL[dtype])
    digests = gathered(dist, b"".join(g.tobytes() for g in grads))
    assert len(set(digests)) == 1  # identical on every rank


@pytest.mark.mpi
def test_reused_buffer_whose_views_are_the_gradients(dist, rank, size):
    flat = FlatBuffer(_grads(rank, np.float64))
    grads = flat.views()
    for step in range(3):
        for g, src in zip(grads, _grads(rank, np.float64, seed=step)):
            g[...] = src
        average_gradients(grads, buffer=flat)
        for got, want in zip(grads, _expected(size, np.float64, seed=step)):
            np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


@pytest.mark.mpi
def test_subgroup_and_torch_tensors(dist, rank, size):
    torch = pytest.importorskip("torch")
    members = list(range(0, size, 2))
    sub = dist.new_group(members)
    grads = [torch.from_numpy(rank_data(rank, (4,), np.float32)), torch.full((2, 2), float(rank))]
    if rank in members:
        average_gradients(grads, group=sub)
        want0 = np.mean([rank_data(r, (4,), np.float32) for r in members], axis=0)
        np.testing.assert_allclose(grads[0].numpy(), want0, rtol=1e-6)
        np.testing.assert_allclose(grads[1].numpy(), np.full((2, 2), np.mean(members)), rtol=1e-6)


def test_flatten_unflatten_roundtrip():
    arrays = [np.arange(6.0).reshape(2, 3), np.array(7.0), np.arange(3.0)]
    buf = flatten(arrays)
    np.testing.assert_array_equal(buf.flat, np.concatenate([a.reshape(-1) for a in arrays]))
    buf.flat *= 2
    out = [np.zeros_like(a) for a in arrays]
    unflatten(buf, out)
    for a, b in zip(arrays, out):
        np.testing.assert_array_equal(b, 2 * a)
    assert flatten(arrays, out=buf) is buf  # reused, refilled
    np.testing.assert_array_equal(buf.flat[:6], np.arange(6.0))


def test_views_share_the_flat_buffer():
    buf = FlatBuffer([np.zeros((2, 2), np.float32), np.zeros(3, np.float32)])
    views = buf.views()
    assert all(np.shares_memory(v, buf.flat) for v in views)
    views[1][...] = 5
    np.testing.assert_array_equal(buf.flat, [0, 0, 0, 0, 5, 5, 5])
    assert buf.pack(views) is buf.flat


@pytest.mark.parametrize("make, exc, text", [
    (lambda: FlatBuffer([np.zeros(2), np.zeros(2, np.float32)]), ValueError, "holds one dtype"),
    (lambda: FlatBuffer([]), ValueError, "at least one array"),
    (lambda: FlatBuffer(np.zeros(3)), TypeError, "expected a list of arrays"),
    (lambda: FlatBuffer([[1.0, 2.0]]), TypeError, "must be a numpy array"),
    (lambda: FlatBuffer([np.zeros(2)]).pack([np.zeros(3)]), ValueError, r"expects float64 \(2,\)"),
    (lambda: FlatBuffer([np.zeros(2)]).pack([np.zeros(2), np.zeros(2)]), ValueError, "got 2 arrays"),
    (lambda: FlatBuffer([np.zeros(4)[::2]]), ValueError, "contiguous"),
])
def test_bad_input(make, exc, text):
    with pytest.raises(exc, match=text):
        make()


def test_bfloat16_and_bad_bucket_are_refused():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="bfloat16"):
        FlatBuffer([torch.zeros(2, dtype=torch.bfloat16)])
    with pytest.raises(ValueError, match="bucket_cap_mb must be positive"):
        average_gradients([np.zeros(2)], bucket_cap_mb=0)
