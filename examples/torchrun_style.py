"""A script written for torchrun: environment variables, ``init_process_group("gloo")``, DDP.

Synthetic data (a fixed random linear teacher), a few seconds on CPU. Start it with::

    torchrun --nproc-per-node 4 examples/torchrun_style.py
    mpirun -n 4 python -m mpidist.run examples/torchrun_style.py
    mpirun -n 4 python -m mpidist.run --backend-for-cpu mpidist examples/torchrun_style.py

Under ``mpirun`` without ``mpidist.run`` it stops at once: ``RANK`` is not set. The last
line (rank 0) gives the final loss, the accuracy and a hash of the parameters, after every
rank checked that its parameters equal rank 0's.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def synthetic(n: int, seed: int) -> TensorDataset:
    """Points in 20 dimensions labelled by a fixed random linear map into 4 classes."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(20, 4, generator=torch.Generator().manual_seed(0))
    x = torch.randn(n, 20, generator=g)
    return TensorDataset(x, (x @ teacher).argmax(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.2)
    args = ap.parse_args()

    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    assert (dist.get_rank(), dist.get_world_size()) == (rank, world_size)
    torch.set_num_threads(1)

    train, test = synthetic(2048, seed=1), synthetic(512, seed=2)
    sampler = DistributedSampler(train, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    # each rank scores its share of the test set; sums over the ranks
    with torch.no_grad():
        x, y = test.tensors
        mine = slice(rank, None, world_size)
        out = model.module(x[mine])
        sums = torch.tensor([torch.nn.functional.cross_entropy(out, y[mine], reduction="sum").item(),
                             (out.argmax(1) == y[mine]).sum().item(), len(y[mine])], dtype=torch.float64)
    dist.all_reduce(sums)
    h = hashlib.sha256()
    for p in model.module.parameters():
        h.update(p.detach().numpy().tobytes())
    every = [None] * world_size
    dist.all_gather_object(every, h.hexdigest())
    assert len(set(every)) == 1, f"ranks hold different parameters: {every}"
    if rank == 0:
        print(f"final: world_size={world_size} local_rank0={local_rank} backend={dist.get_backend()} "
              f"test_loss={sums[0] / sums[2]:.6f} test_accuracy={sums[1] / sums[2]:.4f} "
              f"params_sha256={every[0]}", flush=True)
    del model, opt  # DDP holds the group: free it first (see examples/detr_style/main.py)
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
