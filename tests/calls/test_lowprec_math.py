"""16-bit reductions, exactly: the C kernel and the numpy path against an independent numpy sum.

The contract (mpidist.calls.lowprec): every element widened exactly to float32, combined in float32 in
rank order, AVG divided / PREMUL_SUM multiplied in float32, rounded once to nearest even; every
rank gets the same words. So each result here must equal, word for word (NaN: position only),
numpy's float32 computation in rank order cast once by numpy / ml_dtypes -- for both means (the
C kernel, and the numpy fallback used where no compiler built it), both exchange algorithms,
chunked and whole, with inf, NaN, -0, subnormals, overflow and odd lengths in the inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import gathered

from mpidist.calls import lowprec
from mpidist.calls import lowprec_math as arithmetic

ml_dtypes = pytest.importorskip("ml_dtypes")

DT = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}
UFUNC = {"SUM": np.add, "AVG": np.add, "PREMUL_SUM": np.add, "PRODUCT": np.multiply,
         "MIN": np.minimum, "MAX": np.maximum}
OPS = list(UFUNC)
FACTOR = 0.3


def edge_words(kind: str) -> np.ndarray:
    """inf, -inf, NaN, +-0, the smallest and largest subnormals, the largest finite, 1 and -1."""
    if kind == "f16":
        return np.array([0x7C00, 0xFC00, 0x7E00, 0x0000, 0x8000, 0x0001, 0x03FF, 0x8001, 0x7BFF,
                         0xFBFF, 0x3C00, 0xBC00], np.uint16)
    return np.array([0x7F80, 0xFF80, 0x7FC0, 0x0000, 0x8000, 0x0001, 0x007F, 0x8001, 0x7F7F,
                     0xFF7F, 0x3F80, 0xBF80], np.uint16)


def rank_words(kind: str, rank: int, n: int, seed: int) -> np.ndarray:
    """Rank ``rank``'s words: mostly moderate values, some raw bit patterns, the edges sprinkled in."""
    rng = np.random.default_rng(seed * 100 + rank)
    vals = rng.standard_normal(n) * np.exp2(rng.integers(-8, 8, n))
    with np.errstate(over="ignore"):
        words = vals.astype(np.float32).astype(DT[kind]).view(np.uint16).copy()
    raw = rng.random(n) < 0.05
    words[raw] = rng.integers(0, 1 << 16, int(raw.sum()), dtype=np.uint16)
    edges = edge_words(kind)
    pick = rng.random(n) < 0.1
    words[pick] = edges[rng.integers(0, edges.size, int(pick.sum()))]
    return words


def reference(rows: np.ndarray, kind: str, op: str, size: int) -> np.ndarray:
    """numpy: float32 in rank order, scaled, cast once."""
    f = rows.view(DT[kind]).astype(np.float32)
    with np.errstate(all="ignore"):
        acc = f[0].copy()
        for r in range(1, f.shape[0]):
            acc = UFUNC[op](acc, f[r])
        if op == "AVG":
            acc = acc / np.float32(size)
        if op == "PREMUL_SUM":
            acc = acc * np.float32(FACTOR)
        return acc.astype(DT[kind]).view(np.uint16)


def assert_words_equal(got: np.ndarray, want: np.ndarray, kind: str) -> None:
    gnan = np.isnan(got.view(DT[kind]).astype(np.float32))
    wnan = np.isnan(want.view(DT[kind]).astype(np.float32))
    np.testing.assert_array_equal(gnan, wnan)
    bad = np.flatnonzero(got[~wnan] != want[~wnan])
    assert bad.size == 0, (f"{bad.size} words differ, first at {bad[0]}: "
                           f"{got[~wnan][bad[0]]:#06x} != {want[~wnan][bad[0]]:#06x}")


def rop(dist, op: str):
    return dist.make_premul_sum(FACTOR) if op == "PREMUL_SUM" else getattr(dist.ReduceOp, op)


def array_of(kind: str, words: np.ndarray) -> np.ndarray:
    return words.copy().view(DT[kind])


@pytest.fixture(params=["kernel", "numpy"])
def means(request, monkeypatch):
    if request.param == "kernel":
        if lowprec.kernel("f16") is None:
            pytest.skip("the C kernel is not built (python setup.py build_ext --inplace)")
    else:
        monkeypatch.setattr(arithmetic, "_kernel", None)
    return request.param


@pytest.fixture(params=["gather", "split", "split-chunked"])
def algo(request, monkeypatch):
    """gather: every rank reduces all words; split: pairwise halves (2 ranks) or Alltoallv slices."""
    monkeypatch.setattr(lowprec, "_gather_all", lambda n, size: request.param == "gather")
    if request.param == "split-chunked":
        monkeypatch.setattr(lowprec, "CHUNK", 97)  # many chunks, odd, the last one short
    return request.param


@pytest.fixture(params=["auto", "portable"])
def isa(request):
    """The kernel's loops: the CPU's best (AVX2 + F16C where it has both), and the portable ones
    that a CPU without them runs (chosen at run time: see ``select`` in ``_lowprec.c``)."""
    k = lowprec.kernel("bf16")
    if k is None:
        if request.param == "portable":
            pytest.skip("the C kernel is not built (python setup.py build_ext --inplace)")
        yield None
        return
    yield k.select(request.param)
    k.select("auto")


# ------------------------------------------------------------ the kernel alone (no MPI)

def test_kernel_casts_every_word_exactly(isa):
    k = lowprec.kernel("bf16")
    if k is None:
        pytest.skip("the C kernel is not built")
    words = np.arange(1 << 16, dtype=np.uint16)
    for kind in ("f16", "bf16"):
        if lowprec.kernel(kind) is None:
            continue
        wide = np.empty(words.size, np.float32)
        k.widen(words, wide, arithmetic._KIND[kind])
        expect = words.view(DT[kind]).astype(np.float32)
        nan = np.isnan(expect)
        np.testing.assert_array_equal(wide.view(np.uint32)[~nan], expect.view(np.uint32)[~nan])
        assert np.isnan(wide[nan]).all()
        rng = np.random.default_rng(3)
        bits = np.concatenate([rng.integers(0, 1 << 32, 200003, dtype=np.uint32),
                               wide.view(np.uint32), wide.view(np.uint32) + 0x1000,
                               wide.view(np.uint32) + 0x8000])  # ties and near-ties
        vals = bits.view(np.float32)
        got = np.empty(vals.size, np.uint16)
        k.narrow(vals, got, arithmetic._KIND[kind])
        with np.errstate(all="ignore"):
            assert_words_equal(got, vals.astype(DT[kind]).view(np.uint16), kind)


@pytest.mark.parametrize("kind", ["f16", "bf16"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_reduce_rows_both_means_match_numpy(kind, op, k, isa, monkeypatch):
    m = 1037  # odd: the vector loops' tail runs too
    rows = np.stack([rank_words(kind, r, m, seed=7) for r in range(k)])
    red = lowprec.Reduction(kind, UFUNC[op], op == "AVG", FACTOR if op == "PREMUL_SUM" else None)
    want = reference(rows, kind, op, k)
    if lowprec.kernel(kind) is not None:
        assert_words_equal(lowprec.reduce_rows(rows, red, k, np.empty(m, np.uint16)), want, kind)
    monkeypatch.setattr(arithmetic, "_kernel", None)
    assert_words_equal(lowprec.reduce_rows(rows, red, k, np.empty(m, np.uint16)), want, kind)


def test_kernel_rejects_short_buffers():
    k = lowprec.kernel("bf16")
    if k is None:
        pytest.skip("the C kernel is not built")
    with pytest.raises(ValueError, match="buffer sizes"):
        k.reduce(np.zeros(10, np.uint16), 2, np.zeros(6, np.uint16), 1, 0, 0.0, False, 0.0)
    with pytest.raises(ValueError, match="bad kind"):
        k.widen(np.zeros(4, np.uint16), np.zeros(4, np.float32), 7)


# ------------------------------------------------------------ under MPI

@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["f16", "bf16"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [1, 1001])
def test_all_reduce_exact_and_identical(dist, rank, size, kind, op, n, means, algo):
    rows = np.stack([rank_words(kind, r, n, seed=n) for r in range(size)])
    x = array_of(kind, rows[rank])
    dist.all_reduce(x, op=rop(dist, op))
    got = x.view(np.uint16)
    assert_words_equal(got, reference(rows, kind, op, size), kind)
    assert len(set(gathered(dist, got.tobytes()))) == 1  # bit-identical on every rank, NaNs too


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["f16", "bf16"])
@pytest.mark.parametrize("n", [200_001, 3 * 4096 + 5])
def test_all_reduce_large_count(dist, rank, size, kind, n, monkeypatch):
    monkeypatch.setattr(lowprec, "CHUNK", 4096)  # the second count spans chunks, the last one short
    rows = np.stack([rank_words(kind, r, n, seed=11) for r in range(size)])
    x = array_of(kind, rows[rank])
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    assert_words_equal(x.view(np.uint16), reference(rows, kind, "AVG", size), kind)
    assert len(set(gathered(dist, x.view(np.uint16).tobytes()))) == 1


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["f16", "bf16"])
@pytest.mark.parametrize("op", ["SUM", "AVG", "PREMUL_SUM", "MAX"])
def test_reduce_exact(dist, rank, size, kind, op, means, algo):
    n = 503
    rows = np.stack([rank_words(kind, r, n, seed=5) for r in range(size)])
    x = array_of(kind, rows[rank])
    dst = size - 1
    dist.reduce(x, dst=dst, op=rop(dist, op))
    want = reference(rows, kind, op, size) if rank == dst else rows[rank]
    assert_words_equal(x.view(np.uint16), want, kind)


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["f16", "bf16"])
@pytest.mark.parametrize("op", ["SUM", "AVG", "PREMUL_SUM", "PRODUCT", "MIN"])
def test_reduce_scatter_exact(dist, rank, size, kind, op, means):
    m = 131
    rows = np.stack([rank_words(kind, r, m * size, seed=9) for r in range(size)])
    out = np.zeros(m, np.uint16).view(DT[kind])
    dist.reduce_scatter_tensor(out, array_of(kind, rows[rank]), op=rop(dist, op))
    want = reference(rows[:, rank * m:(rank + 1) * m], kind, op, size)
    assert_words_equal(out.view(np.uint16), want, kind)


@pytest.mark.mpi(min_size=2)
def test_large_all_reduce_on_groups_that_come_and_go(dist, rank, size):
    """The two-rank path keeps a private duplicate per communicator; it goes with the group."""
    n = 100_003
    rows = np.stack([rank_words("bf16", r, n, seed=13) for r in range(size)])
    for _ in range(3):
        g = dist.new_group(list(range(size)))
        x = array_of("bf16", rows[rank])
        dist.all_reduce(x, group=g)
        assert_words_equal(x.view(np.uint16), reference(rows, "bf16", "SUM", size), "bf16")
        dist.destroy_process_group(g)
    x = array_of("bf16", rows[rank])
    dist.all_reduce(x)
    assert_words_equal(x.view(np.uint16), reference(rows, "bf16", "SUM", size), "bf16")


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1001, 200_001])
def test_async_all_reduces_in_flight_together(dist, rank, size, n):
    """Several async 16-bit all-reduces, a float32 one between them, then the waits: each exact."""
    kinds = ["f16", "bf16", "f16"]
    rows = [np.stack([rank_words(k, r, n, seed=20 + i) for r in range(size)]) for i, k in enumerate(kinds)]
    xs = [array_of(k, rw[rank]) for k, rw in zip(kinds, rows)]
    works = [dist.all_reduce(xs[0], op=dist.ReduceOp.AVG, async_op=True),
             dist.all_reduce(xs[1], async_op=True)]
    f = np.full(5, rank + 1.0, np.float32)
    dist.all_reduce(f)  # the caller's own collective while the 16-bit ones run
    works.append(dist.all_reduce(xs[2], op=dist.make_premul_sum(FACTOR), async_op=True))
    for w in reversed(works):
        assert w.wait() is True
    np.testing.assert_array_equal(f, size * (size + 1) / 2)
    for x, k, rw, op in zip(xs, kinds, rows, ["AVG", "SUM", "PREMUL_SUM"]):
        assert_words_equal(x.view(np.uint16), reference(rw, k, op, size), k)
        assert len(set(gathered(dist, x.view(np.uint16).tobytes()))) == 1
