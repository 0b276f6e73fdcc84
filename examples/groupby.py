"""Distributed group-by over synthetic sales events, in every merge mode.

Run:  mpirun -n 4 python examples/groupby.py [--rows 2000000]

Every rank generates its own share of sales events (store id, product, amount, quantity),
as if each had read one shard of a large file, then:

  merge="root"     revenue per store, merged exactly on rank 0
  merge="shuffle"  revenue per (store, product); each pair ends on exactly one rank
  merge="gather"   every rank's own top 3 stores by revenue, collected on rank 0 unmerged
  merge="none"     after partition_by_key(product): per-product totals with no further
                   communication, which is then the global answer
and, when pandas is installed, the same store totals through aggregate_frame.
"""

from __future__ import annotations

import argparse

import numpy as np

import mpidist as dist
import mpidist.groupby as gb

PRODUCTS = np.array(["apples", "bread", "coffee", "dates", "eggs", "flour", "grapes", "honey",
                     "ice-cream", "jam", "kale", "lemons"])


def sales(rank: int, rows: int, stores: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One shard of sales events: keys (store, product) and values (amount, quantity)."""
    rng = np.random.default_rng(1234 + rank)
    store = rng.zipf(1.3, rows) % stores  # a few busy stores, many quiet ones
    product = PRODUCTS[rng.integers(0, len(PRODUCTS), rows)]
    quantity = rng.integers(1, 6, rows)
    amount = np.round(quantity * rng.lognormal(1.0, 0.5, rows), 2)
    amount[rng.random(rows) < 0.001] = np.nan  # a few unreadable tills: skipped, as pandas does
    return {"store": store, "product": product}, {"amount": amount, "quantity": quantity}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=400_000, help="total rows over all ranks")
    ap.add_argument("--stores", type=int, default=200)
    args = ap.parse_args()

    dist.init_process_group("mpi")
    rank, size = dist.get_rank(), dist.get_world_size()
    keys, values = sales(rank, args.rows // size + (rank < args.rows % size), args.stores)
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"{size} ranks, {args.rows} sales events")

    # 1. merge="root": the exact global answer on rank 0, None elsewhere.
    per_store = gb.aggregate(keys["store"], values, {"amount": ["sum", "mean", "std"], "quantity": "sum"},
                             merge="root")
    if per_store is not None:
        top = per_store.sort(("amount", "sum"), ascending=False).head(3)
        say(f"merge=root: {len(per_store)} stores; busiest:")
        for s, rev, avg, qty in zip(top["key"], top[("amount", "sum")], top[("amount", "mean")],
                                    top[("quantity", "sum")]):
            say(f"    store {s:4d}  revenue {rev:12.2f}  mean ticket {avg:6.2f}  items {qty}")

    # 2. merge="shuffle": composite key; every (store, product) lives on exactly one rank.
    pairs = gb.aggregate((keys["store"], keys["product"]), values["amount"], ["sum", "count"],
                         merge="shuffle")
    owned = np.zeros(1, dtype=np.int64) + len(pairs)
    dist.all_reduce(owned)
    counts = [None] * size
    dist.all_gather_object(counts, len(pairs))
    say(f"merge=shuffle: {int(owned[0])} (store, product) pairs, owned per rank {counts}")

    # 3. merge="gather": each rank's own top 3 stores, concatenated on rank 0 (not merged).
    local_top = gb.aggregate(keys["store"], values["amount"], ["sum"], merge="gather",
                             sort_by=("value", "sum"), ascending=False, limit=3 * size)
    if local_top is not None:
        say(f"merge=gather: top {len(local_top)} (store, shard) revenues, unmerged: "
            + ", ".join(f"{s}:{v:.0f}" for s, v in zip(local_top["key"], local_top[("value", "sum")])))

    # 4. merge="none" after partition_by_key: each product's rows on one rank, no merge needed.
    pkeys, pvalues = gb.partition_by_key(keys["product"], values)
    mine = gb.aggregate(pkeys, pvalues, {"amount": "sum", "quantity": "sum"}, merge="none")
    rows = [None] * size
    dist.all_gather_object(rows, dict(zip(mine["key"].tolist(), mine[("amount", "sum")].tolist())))
    union = {k: v for part in rows for k, v in part.items()}
    check = gb.aggregate(keys["product"], values["amount"], ["sum"], merge="root")
    if check is not None:
        same = all(np.isclose(union[k], v) for k, v in zip(check["key"].tolist(), check[("value", "sum")]))
        say(f"merge=none: {len(union)} products, owned per rank {[len(r) for r in rows]}, "
            f"equal to the merged answer: {same}")

    # 5. The pandas front: the same DataFrame pandas would build from all shards.
    try:
        import pandas as pd
    except ImportError:
        pd = None
    if pd is not None:
        df = pd.DataFrame({**keys, **values})
        out = gb.aggregate_frame(df, ["store", "product"], {"amount": ["sum", "max"]}, merge="root")
        if out is not None:
            say(f"aggregate_frame: {out.shape[0]} rows x {out.shape[1]} columns; first rows:")
            say(out.head(3).to_string())

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
