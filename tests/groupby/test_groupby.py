"""mpidist.groupby: every merge mode x aggregation x key type against pandas on the gathered input,
bad inputs raising on every rank, and a seeded-random property test of "root" and "shuffle".

Hashing across processes, the import check, the real job, the example and the benchmark smoke
run start their own processes; they are in ``test_groupby_jobs.py``."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest
from helpers import gathered

AGGS = ["sum", "count", "mean", "min", "max", "var", "std", "first", "last"]
KEY_TYPES = ["int", "sparse_int", "uint64", "int8", "float", "str", "bytes", "bool", "composite"]


def keys_for(kind: str, rank: int, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Key columns of one rank; string widths differ by rank on purpose."""
    if kind == "int":
        return {"k": rng.integers(-3, 12, n)}
    if kind == "sparse_int":  # range far wider than the rows: the sort-based path
        return {"k": rng.choice(np.array([-2**62, -1, 0, 7, 2**62, 2**63 - 1]), n)}
    if kind == "uint64":
        return {"k": rng.choice(np.array([0, 5, 2**63 + 3, 2**64 - 1], dtype=np.uint64), n)}
    if kind == "int8":
        return {"k": rng.integers(-128, 128, n).astype(np.int8)}
    if kind == "float":
        k = rng.integers(-4, 5, n) / 2.0
        k[rng.random(n) < 0.1] = np.nan  # NaN keys are dropped, as pandas does
        k[k == 0] = np.where(rng.random(int((k == 0).sum())) < 0.5, -0.0, 0.0)
        return {"k": k}
    if kind == "str":
        return {"k": np.char.add("x" * (rank + 1), rng.integers(0, 9, n).astype(str))}
    if kind == "bytes":
        return {"k": np.char.add(b"b", rng.integers(0, 9, n).astype("S"))}
    if kind == "bool":
        return {"k": rng.random(n) < 0.3}
    if kind == "composite":
        return {"k": rng.integers(0, 4, n), "s": np.char.add("s", rng.integers(0, 3, n).astype(str))}
    raise AssertionError(kind)


def values_for(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    v = rng.normal(10.0, 3.0, n)
    v[rng.random(n) < 0.15] = np.nan  # skipped like pandas
    return {"v": v, "i": rng.integers(-50, 50, n), "f": rng.random(n).astype(np.float32),
            "b": rng.random(n) < 0.5}


def rank_frame(kind: str, rank: int, seed: int = 0, n: int | None = None) -> pd.DataFrame:
    rng = np.random.default_rng([seed, rank])
    n = int(rng.integers(20, 60)) if n is None else n
    return pd.DataFrame({**keys_for(kind, rank, n, rng), **values_for(n, rng)})


def key_names(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c in ("k", "s")]


def expected(frames: list[pd.DataFrame], aggs=AGGS) -> pd.DataFrame:
    full = pd.concat(frames)
    return full.groupby(key_names(full)).agg(aggs)


def as_frame(res, by: list[str]) -> pd.DataFrame:
    """A GroupByResult as the DataFrame pandas builds (index named by the keys)."""
    out = res.to_pandas()
    out.index.names = by
    return out


def run_checks(dist, fn) -> None:
    """Run ``fn`` on every rank; fail on every rank if any rank's assertion failed."""
    try:
        fn()
        msg = ""
    except AssertionError as exc:
        msg = str(exc)[:2000] or "assertion failed"
    everyone = gathered(dist, msg)
    assert not any(everyone), {r: m for r, m in enumerate(everyone) if m}


def assert_same(got: pd.DataFrame, want: pd.DataFrame, check_dtype: bool = True) -> None:
    """Frames equal up to float rounding: 1e-9 relative for float64 columns, 1e-5 for float32."""
    if len(want) == 0:  # no rows anywhere: pandas' empty index has no dtype to match
        assert len(got) == 0 and list(got.columns) == list(want.columns), (got, want)
        return
    got, want = got.copy(), want.copy()
    single = [c for c in want.columns if want[c].dtype == np.float32 or got[c].dtype == np.float32]
    # pandas' mean of a float32 column is float32 or float64 depending on the frame's layout
    for frame in (got, want):
        for col in frame.columns:
            if col == "mean" or (isinstance(col, tuple) and col[-1] == "mean"):
                frame[col] = frame[col].astype(np.float64)
    if check_dtype:
        pd.testing.assert_series_equal(got.dtypes, want.dtypes)
    rest = [c for c in want.columns if c not in single]
    pd.testing.assert_frame_equal(got[rest], want[rest], check_exact=False, rtol=1e-9, atol=1e-9,
                                  check_dtype=check_dtype)
    pd.testing.assert_frame_equal(got[single].astype(np.float64), want[single].astype(np.float64),
                                  check_exact=False, rtol=1e-5, atol=1e-6)


def np_col(s: pd.Series) -> np.ndarray:
    """A column as the numpy array a user would pass (pandas 3 hands strings out as objects)."""
    kind = pd.api.types.infer_dtype(s) if s.dtype == object or not isinstance(s.dtype, np.dtype) else ""
    if kind == "string":
        return s.to_numpy(dtype=str)
    if kind == "bytes":
        return np.asarray(s.to_numpy(), dtype=bytes)
    return s.to_numpy()


def np_cols(df: pd.DataFrame) -> tuple[dict, dict]:
    by = key_names(df)
    return ({c: np_col(df[c]) for c in by}, {c: np_col(df[c]) for c in df.columns if c not in by})


def call_numpy(df: pd.DataFrame, merge: str, **kw):
    import mpidist.groupby as gb

    keys, values = np_cols(df)
    return gb.aggregate(keys, values, AGGS, merge=merge, **kw)


# ---------------------------------------------------------------------------- every mode x key type

@pytest.mark.mpi
@pytest.mark.parametrize("kind", KEY_TYPES)
@pytest.mark.parametrize("merge", ["root", "shuffle", "gather", "none"])
def test_numpy_api_matches_pandas(dist, rank, size, kind, merge):
    df = rank_frame(kind, rank, seed=1)
    frames = gathered(dist, df)
    by = key_names(df)
    res = call_numpy(df, merge)
    parts = gathered(dist, None if res is None else as_frame(res, by))

    def check():
        if merge == "root":
            assert (res is None) == (rank != 0)
            if rank == 0:
                assert_same(as_frame(res, by), expected(frames))
        elif merge == "shuffle":
            union = pd.concat(parts)
            assert not union.index.duplicated().any(), "a key is on two ranks"
            assert_same(union.sort_index(), expected(frames))
        elif merge == "gather":
            assert (res is None) == (rank != 0)
            if rank == 0:
                want = pd.concat([f.groupby(by).agg(AGGS) for f in frames])
                assert_same(as_frame(res, by), want)
        else:
            assert_same(as_frame(res, by), expected([df]))

    run_checks(dist, check)


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["int", "str", "composite", "float"])
@pytest.mark.parametrize("merge", ["root", "shuffle"])
def test_frame_front_matches_pandas_exactly(dist, rank, kind, merge):
    import mpidist.groupby as gb

    df = rank_frame(kind, rank, seed=2)
    frames = gathered(dist, df)
    by = key_names(df)
    by_arg = by[0] if len(by) == 1 else by
    got = gb.aggregate_frame(df, by_arg, AGGS, merge=merge)
    parts = gathered(dist, got)

    def check():
        want = pd.concat(frames).groupby(by_arg).agg(AGGS)
        if merge == "root":
            if rank == 0:
                assert_same(got, want)
            else:
                assert got is None
        else:
            union = pd.concat(parts)
            assert not union.index.duplicated().any()
            assert_same(union.sort_index(), want)

    run_checks(dist, check)


@pytest.mark.mpi
@pytest.mark.parametrize("aggs", [{"v": ["sum", "max"], "i": "mean"}, {"v": "std", "b": "sum"}, "mean",
                                  ["count"]], ids=["dict-mixed", "dict-str", "str", "list"])
def test_frame_agg_forms(dist, rank, aggs):
    import mpidist.groupby as gb

    df = rank_frame("int", rank, seed=3)
    frames = gathered(dist, df)
    got = gb.aggregate_frame(df, "k", aggs)

    def check():
        if rank == 0:
            assert_same(got, pd.concat(frames).groupby("k").agg(aggs))

    run_checks(dist, check)


# ---------------------------------------------------------------------------- edge cases

@pytest.mark.mpi
@pytest.mark.parametrize("merge", ["root", "shuffle", "gather"])
def test_empty_ranks(dist, rank, size, merge):
    """Odd ranks have no rows (and an empty DataFrame's object dtypes); rank 0 has rows."""
    import mpidist.groupby as gb

    df = rank_frame("str", rank, seed=4)
    if rank % 2:
        df = pd.DataFrame({c: [] for c in df.columns})
    frames = gathered(dist, df)
    got = gb.aggregate_frame(df, "k", AGGS, merge=merge)
    parts = gathered(dist, got)

    def check():
        nonempty = [f for f in frames if len(f)]
        want = pd.concat(nonempty).groupby("k").agg(AGGS)
        if merge == "shuffle":
            assert_same(pd.concat(parts).sort_index(), want)
        elif rank == 0 and merge == "root":
            assert_same(got, want)
        elif rank == 0:
            assert_same(got, pd.concat([f.groupby("k").agg(AGGS) for f in nonempty]))

    run_checks(dist, check)


@pytest.mark.mpi
@pytest.mark.parametrize("merge", ["root", "shuffle", "gather", "none"])
def test_all_ranks_empty(dist, rank, merge):
    import mpidist.groupby as gb

    res = gb.aggregate(np.empty(0, np.int64), {"v": np.empty(0)}, AGGS, merge=merge)

    def check():
        if res is not None:
            assert len(res) == 0
            assert res[("v", "count")].dtype == np.int64

    run_checks(dist, check)


@pytest.mark.mpi
@pytest.mark.parametrize("layout", ["all_unique", "one_key"])
@pytest.mark.parametrize("merge", ["root", "shuffle"])
def test_all_unique_and_single_key(dist, rank, size, layout, merge):
    import mpidist.groupby as gb

    n = 40
    rng = np.random.default_rng([5, rank])
    k = np.arange(rank * n, (rank + 1) * n) * 3 if layout == "all_unique" else np.full(n, 42)
    v = rng.normal(size=n)
    frames = gathered(dist, pd.DataFrame({"k": k, "v": v}))
    res = gb.aggregate(k, {"v": v}, AGGS, merge=merge)
    parts = gathered(dist, None if res is None else as_frame(res, ["k"]))

    def check():
        want = pd.concat(frames).groupby("k").agg({"v": AGGS})
        got = pd.concat([p for p in parts if p is not None])
        assert not got.index.duplicated().any()
        assert_same(got.sort_index(), want)
        if layout == "one_key" and merge == "shuffle":  # the one key lives on exactly one rank
            assert sum(len(p) for p in parts) == 1

    run_checks(dist, check)


@pytest.mark.mpi
def test_all_nan_group_and_nan_skipping(dist, rank):
    import mpidist.groupby as gb

    k = np.array([1, 1, 2, 2, 3])
    v = np.array([np.nan, np.nan, 1.0 + rank, np.nan, 5.0])
    frames = gathered(dist, pd.DataFrame({"k": k, "v": v}))
    res = gb.aggregate(k, {"v": v}, AGGS)

    def check():
        if rank == 0:
            want = pd.concat(frames).groupby("k").agg({"v": AGGS})
            assert_same(as_frame(res, ["k"]), want)
            assert res[("v", "sum")][0] == 0.0 and np.isnan(res[("v", "mean")][0])

    run_checks(dist, check)


@pytest.mark.mpi
def test_variance_merge_is_numerically_sound(dist, rank):
    """Values 1e9 + noise of variance 1: a naive sum-of-squares merge loses every digit here."""
    import mpidist.groupby as gb

    rng = np.random.default_rng([6, rank])
    n = 500
    k = rng.integers(0, 5, n)
    v = 1e9 + rng.normal(0, 1, n)
    allk = np.concatenate(gathered(dist, k))
    allv = np.concatenate(gathered(dist, v))
    res = gb.aggregate(k, v, ["var", "std", "mean"], merge="shuffle")
    parts = gathered(dist, res.to_dict())

    def check():
        for part in parts:
            for i, key in enumerate(part["key"]):
                x = allv[allk == key]
                # reference: two-pass variance in float64 on the exact rows of the key
                ref = np.sum((x - x.mean()) ** 2) / (len(x) - 1)
                got = part[("value", "var")][i]
                assert abs(got - ref) <= 1e-6 * ref, (key, got, ref)

    run_checks(dist, check)


@pytest.mark.mpi
def test_int_sums_are_exact(dist, rank):
    """int64 sums beyond 2**53 stay exact (no float round trip)."""
    import mpidist.groupby as gb

    k = np.array([0, 0, 1])
    v = np.array([2**60 + 1, 3, -(2**55) - 1], dtype=np.int64)
    res = gb.aggregate(k, v, ["sum"], merge="root")
    size = len(gathered(dist, 0))

    def check():
        if rank == 0:
            assert res[("value", "sum")].dtype == np.int64
            assert int(res[("value", "sum")][0]) == size * (2**60 + 4)
            assert int(res[("value", "sum")][1]) == size * (-(2**55) - 1)

    run_checks(dist, check)


# ---------------------------------------------------------------------------- gather order/limit

@pytest.mark.mpi
def test_gather_sort_and_limit(dist, rank):
    import mpidist.groupby as gb

    df = rank_frame("int", rank, seed=7)
    frames = gathered(dist, df)
    res = gb.aggregate(df["k"].to_numpy(), {"v": df["v"].to_numpy()}, ["sum", "count"], merge="gather",
                       sort_by=[("v", "sum"), "key"], ascending=False, limit=5)

    def check():
        if rank != 0:
            assert res is None
            return
        locals_ = pd.concat([f.groupby("k")["v"].agg(["sum", "count"]).reset_index() for f in frames])
        want = locals_.sort_values(["sum", "k"], ascending=False).head(5)
        np.testing.assert_allclose(res[("v", "sum")], want["sum"].to_numpy())
        np.testing.assert_array_equal(res["key"], want["k"].to_numpy())

    run_checks(dist, check)


# ---------------------------------------------------------------------------- partition_by_key

@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["int", "str", "composite", "float"])
def test_partition_by_key_then_no_merge(dist, rank, size, kind):
    import mpidist.groupby as gb

    df = rank_frame(kind, rank, seed=8)
    frames = gathered(dist, df)
    by = key_names(df)
    keys = tuple(np_col(df[c]) for c in by) if len(by) > 1 else np_col(df[by[0]])
    values = {"v": df["v"].to_numpy(), "i": df["i"].to_numpy()}
    pk, pv = gb.partition_by_key(keys, values)
    aggs = ["sum", "mean", "count", "first"]
    local = gb.aggregate(pk, pv, aggs, merge="none")
    shuffled = gb.aggregate(keys, values, aggs, merge="shuffle")
    names = list(local.keys)
    rows = gathered(dist, pd.DataFrame({**dict(zip(by, pk if len(by) > 1 else (pk,))), **pv}))
    parts = gathered(dist, as_frame(local, by))

    def check():
        assert type(pk) is type(keys) and set(pv) == {"v", "i"}
        full = pd.concat(frames)
        moved = pd.concat(rows)
        assert len(moved) == len(full)
        # same multiset of rows (sorted on every column; NaN compares equal in frame_equal)
        srt = list(moved.columns)
        assert_same(moved.sort_values(srt).reset_index(drop=True),
                    full[srt].sort_values(srt).reset_index(drop=True))
        union = pd.concat(parts)
        assert not union.index.duplicated().any(), "a key is on two ranks after partition_by_key"
        assert_same(union.sort_index(), full.groupby(by).agg({"v": aggs, "i": aggs}))
        # same owner as merge="shuffle"
        got = {tuple(r) for r in zip(*(local.keys[n].tolist() for n in names))}
        want = {tuple(r) for r in zip(*(shuffled.keys[n].tolist() for n in names))}
        assert got == want

    run_checks(dist, check)


# ---------------------------------------------------------------------------- bad inputs

def _raises_everywhere(dist, exc_type, words, fn) -> None:
    try:
        fn()
        msg = "did not raise"
    except exc_type as exc:
        text = str(exc)
        missing = [w for w in words if w not in text]
        msg = f"message {text!r} lacks {missing}" if missing else ""
    except Exception as exc:  # noqa: BLE001 - report the wrong type on every rank
        msg = f"raised {type(exc).__name__}: {exc}"
    everyone = gathered(dist, msg)
    assert not any(everyone), {r: m for r, m in enumerate(everyone) if m}


@pytest.mark.mpi(min_size=2)
def test_mismatched_key_dtype_names_rank_and_column(dist, rank, size):
    import mpidist.groupby as gb

    last = size - 1
    k = np.arange(6, dtype=np.float64 if rank == last else np.int64)
    _raises_everywhere(dist, ValueError, [f"rank {last}", "'store'", "float64", "int64"],
                       lambda: gb.aggregate({"store": k}, np.ones(6), ["sum"], merge="root"))


@pytest.mark.mpi(min_size=2)
def test_mismatched_value_columns(dist, rank, size):
    import mpidist.groupby as gb

    last = size - 1
    values = {"a": np.ones(4)} if rank == last else {"a": np.ones(4), "b": np.ones(4)}
    _raises_everywhere(dist, ValueError, [f"rank {last}", "value columns"],
                       lambda: gb.aggregate(np.arange(4), values, ["sum"], merge="shuffle"))


@pytest.mark.mpi(min_size=2)
def test_mismatched_value_dtype(dist, rank, size):
    import mpidist.groupby as gb

    v = np.ones(4, dtype=np.int32 if rank == 1 else np.float64)
    _raises_everywhere(dist, ValueError, ["rank 1", "'amount'", "int32"],
                       lambda: gb.aggregate_frame(pd.DataFrame({"k": np.arange(4), "amount": v}), "k",
                                                  ["sum"], merge="gather"))


@pytest.mark.mpi(min_size=2)
def test_ragged_columns_on_one_rank(dist, rank, size):
    import mpidist.groupby as gb

    v = np.ones(3 if rank == 1 else 5)
    _raises_everywhere(dist, ValueError, ["rank 1", "'value'", "3 rows"],
                       lambda: gb.aggregate(np.arange(5), v, ["mean"]))


@pytest.mark.mpi(min_size=2)
def test_missing_column_in_one_ranks_frame(dist, rank, size):
    import mpidist.groupby as gb

    df = pd.DataFrame({"k": np.arange(4), "v": np.ones(4)})
    if rank == 1:
        df = df.rename(columns={"v": "w"})
    _raises_everywhere(dist, ValueError, ["rank 1", "'v'"],
                       lambda: gb.aggregate_frame(df, "k", {"v": "sum"}))


@pytest.mark.mpi
@pytest.mark.parametrize("case", ["agg", "merge", "root", "object_key", "string_value", "2d", "limit",
                                  "sort_by", "scalar"])
def test_bad_arguments_raise_on_every_rank(dist, size, case):
    import mpidist.groupby as gb

    k, v = np.arange(4), np.ones(4)
    calls = {
        "agg": (ValueError, ["'median'"], lambda: gb.aggregate(k, v, ["sum", "median"])),
        "merge": (ValueError, ["'bogus'"], lambda: gb.aggregate(k, v, merge="bogus")),
        "root": (ValueError, [f"root={size}"], lambda: gb.aggregate(k, v, root=size)),
        "object_key": (TypeError, ["'key'", "object"], lambda: gb.aggregate(k.astype(object), v)),
        "string_value": (TypeError, ["'value'"], lambda: gb.aggregate(k, k.astype(str))),
        "2d": (ValueError, ["1-D"], lambda: gb.aggregate(k, v.reshape(2, 2))),
        "limit": (ValueError, ["limit"], lambda: gb.aggregate(k, v, merge="gather", limit=-1)),
        "sort_by": (ValueError, ["'nope'"], lambda: gb.aggregate(k, v, merge="gather", sort_by="nope")),
        "scalar": (TypeError, ["1-D array"], lambda: gb.aggregate(3, v)),
    }
    exc_type, words, fn = calls[case]
    _raises_everywhere(dist, exc_type, ["aggregate: rank", *words], fn)
    # the runtime stays usable after the error
    res = gb.aggregate(k, v, ["sum"], merge="shuffle")
    assert res is not None


@pytest.mark.mpi(min_size=2)
def test_mismatched_aggs_and_merge_args(dist, rank):
    import mpidist.groupby as gb

    k, v = np.arange(4), np.ones(4)
    _raises_everywhere(dist, ValueError, ["rank 1", "aggs"],
                       lambda: gb.aggregate(k, v, ["sum"] if rank != 1 else ["max"]))
    _raises_everywhere(dist, ValueError, ["rank 1", "root="],
                       lambda: gb.aggregate(k, v, ["sum"], root=1 if rank == 1 else 0))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("odd", ["root", "shuffle", "gather"])
@pytest.mark.parametrize("odd_rank", ["first", "last"])
def test_merge_none_on_some_ranks_raises_everywhere(dist, rank, size, odd, odd_rank):
    """"none" on some ranks and another mode on the rest: every rank raises (it once hung)."""
    import mpidist.groupby as gb

    k, v = np.arange(5) % 3, np.ones(5)
    who = 0 if odd_rank == "first" else size - 1
    merge = odd if rank == who else "none"
    _raises_everywhere(dist, ValueError, ["merge=", "'none'", repr(odd), "every rank must pass the same"],
                       lambda: gb.aggregate(k, v, ["sum"], merge=merge))
    # the group still works, and "none" alone still gives each rank its local result
    local = gb.aggregate(k, v, ["sum"], merge="none")
    np.testing.assert_array_equal(local[("value", "sum")], [2.0, 2.0, 1.0])
    frames = gathered(dist, rank)
    assert frames == list(range(size))


# ---------------------------------------------------------------------------- property test

@pytest.mark.mpi
@pytest.mark.parametrize("seed", range(12))
def test_property_random_data_root_and_shuffle(dist, rank, seed):
    """Seeded random shapes (every rank derives the same plan from the seed): key type, rows per
    rank (zero included), NaN share, aggs; "root" and "shuffle" against one-process pandas."""
    import mpidist.groupby as gb

    plan = np.random.default_rng(seed)
    kind = KEY_TYPES[plan.integers(len(KEY_TYPES))]
    aggs = list(plan.choice(AGGS, size=int(plan.integers(1, len(AGGS) + 1)), replace=False))
    rng = np.random.default_rng([seed, rank, 99])
    n = int(rng.choice([0, 1, 3, 50, 300]))
    df = pd.DataFrame({**keys_for(kind, rank, n, rng), **values_for(n, rng)})
    by = key_names(df)
    frames = gathered(dist, df)
    keys, values = np_cols(df)
    root = gb.aggregate(keys, values, aggs, merge="root")
    shuf = gb.aggregate(keys, values, aggs, merge="shuffle")
    parts = gathered(dist, as_frame(shuf, by))

    def check():
        nonempty = [f for f in frames if len(f)] or frames[:1]
        want = pd.concat(nonempty).groupby(by).agg(aggs)
        if rank == 0:
            assert_same(as_frame(root, by), want, check_dtype=False)
        union = pd.concat(parts)
        assert not union.index.duplicated().any()
        assert_same(union.sort_index(), want, check_dtype=False)

    run_checks(dist, check)


# ---------------------------------------------------------------------------- serial tests

def test_merge_algebra_hypothesis():
    """Splitting rows into any parts and merging the parts' states equals one-shot aggregation."""
    hyp = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")
    from mpidist.groupby import states
    from mpidist.groupby.factorize import group_ids

    names = states.needed(AGGS)

    @hyp.given(st.lists(st.tuples(st.integers(0, 5), st.one_of(st.floats(-1e6, 1e6), st.just(np.nan))),
                        max_size=60),
               st.lists(st.integers(0, 60), max_size=4))
    @hyp.settings(max_examples=150, deadline=None)
    def prop(rows, cuts):
        k = np.array([r[0] for r in rows], dtype=np.int64)
        v = np.array([r[1] for r in rows], dtype=np.float64)
        gid, (uk,) = group_ids([k])
        whole = states.finish(states.from_rows(gid, len(uk), v, names), AGGS, v.dtype)
        bounds = [0, *sorted(min(c, len(k)) for c in cuts), len(k)]
        tables = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            g, (u,) = group_ids([k[a:b]])
            tables.append((u, states.from_rows(g, len(u), v[a:b], names)))
        allk = np.concatenate([t[0] for t in tables])
        parts = {s: np.concatenate([t[1][s] for t in tables]) for s in names}
        gid2, (uk2,) = group_ids([allk])
        merged = states.finish(states.merge(gid2, len(uk2), parts, names, v.dtype), AGGS, v.dtype)
        np.testing.assert_array_equal(uk, uk2)
        for a in AGGS:
            np.testing.assert_allclose(merged[a], whole[a], rtol=1e-7, atol=1e-6, err_msg=a)

    prop()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
