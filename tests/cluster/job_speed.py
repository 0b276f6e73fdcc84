"""Job for tests/cluster/test_cluster_speed.py: 16-bit reductions and the torch backend's choice across nodes.

Prints ``NODES n``, ``LOWPREC ok <count>`` after checking every 16-bit all_reduce word for word
against numpy (float32 in rank order, rounded once), ``LIMIT <bytes>`` (the torch backend's
blocking limit for the world group) and ``DDP16 <digest>`` (parameters after DDP with
``fp16_compress_hook``), compared there with gloo's.
"""

from __future__ import annotations

import hashlib

import numpy as np

import mpidist
from mpidist.calls import lowprec_math
from mpidist.core import topology


def words_of(kind: str, rank: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(1000 + rank)
    vals = rng.standard_normal(n) * np.exp2(rng.integers(-6, 6, n))
    dt = np.float16 if kind == "f16" else lowprec_math.bf16_dtype()
    return vals.astype(np.float32).astype(dt).view(np.uint16)


def reference(rows: np.ndarray, kind: str, average: bool) -> np.ndarray:
    dt = np.float16 if kind == "f16" else lowprec_math.bf16_dtype()
    f = rows.view(dt).astype(np.float32)
    acc = f[0].copy()
    for r in range(1, f.shape[0]):
        acc = acc + f[r]
    if average:
        acc = acc / np.float32(f.shape[0])
    return acc.astype(dt).view(np.uint16)


def main() -> None:
    mpidist.init_process_group("mpi")
    rank, size = mpidist.get_rank(), mpidist.get_world_size()
    from mpi4py import MPI

    print(f"NODES {topology.node_count(MPI.COMM_WORLD)}", flush=True)
    checked = 0
    for kind in ("f16", "bf16"):
        dt = np.float16 if kind == "f16" else lowprec_math.bf16_dtype()
        for n in (7, 1001, 200_001):
            for average in (False, True):
                rows = np.stack([words_of(kind, r, n) for r in range(size)])
                x = rows[rank].copy().view(dt)
                mpidist.all_reduce(x, op=mpidist.ReduceOp.AVG if average else mpidist.ReduceOp.SUM)
                want = reference(rows, kind, average)
                if not np.array_equal(x.view(np.uint16), want):
                    raise SystemExit(f"rank {rank}: {kind} n={n} avg={average} differs from numpy")
                checked += 1
    print(f"LOWPREC ok {checked}", flush=True)

    import torch
    import torch.distributed as tdist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    import mpidist.torch as _registers_backend  # noqa: F401
    from mpidist.torch import backend, overlap

    torch.set_num_threads(1)
    tdist.init_process_group("mpidist")
    print(f"LIMIT {overlap.sync_bytes(MPI.COMM_WORLD, backend.SYNC_BYTES)}", flush=True)
    gloo = tdist.new_group(backend="gloo")

    def train(group) -> str:
        torch.manual_seed(5)
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.Tanh(), torch.nn.Linear(256, 4)),
            process_group=group, bucket_cap_mb=0.05)
        model.register_comm_hook(group, default_hooks.fp16_compress_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(3):
            opt.zero_grad()
            x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
        return hashlib.sha256(flat.tobytes()).hexdigest()[:16]

    ours, theirs = train(None), train(gloo)
    print(f"DDP16 {ours} {theirs}", flush=True)
    tdist.destroy_process_group()
    mpidist.destroy_process_group()


if __name__ == "__main__":
    main()
