"""Train a torch MLP on scikit-learn's digits with DistributedDataParallel over MPI.

Plain torch.distributed code; the only mpidist line is the import that registers the
``"mpidist"`` backend. Rank, world size and the rendezvous come from MPI::

    mpirun -n 4 python examples/train_torch.py --epochs 20
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import mpidist.torch  # noqa: F401  (registers the "mpidist" backend)


def data() -> tuple[TensorDataset, TensorDataset]:
    """The digits, standardised with the training split's statistics (same on every rank)."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    def as_set(a, b):
        return TensorDataset(torch.tensor((a - mean) / std, dtype=torch.float32), torch.tensor(b))
    return as_set(x_train, y_train), as_set(x_test, y_test)


def evaluate(model: torch.nn.Module, loader: DataLoader) -> tuple[float, float]:
    """Loss and accuracy over this rank's shard, summed over every rank with all_reduce."""
    totals = torch.zeros(3, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            totals += torch.tensor([torch.nn.functional.cross_entropy(out, y, reduction="sum").item(),
                                    (out.argmax(1) == y).sum().item(), len(y)], dtype=torch.float64)
    model.train()
    dist.all_reduce(totals)
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    torch.set_num_threads(1)  # one core per rank: MPI ranks already fill the machine
    dist.init_process_group("mpidist")
    rank, size = dist.get_rank(), dist.get_world_size()
    train, test = data()
    sampler = DistributedSampler(train, shuffle=True, seed=0)
    train_loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    test_loader = DataLoader(test, batch_size=256, sampler=DistributedSampler(test, shuffle=False))

    torch.manual_seed(0)  # DDP broadcasts rank 0's parameters anyway
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in train_loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        loss, acc = evaluate(model, test_loader)
        if rank == 0:
            print(f"epoch {epoch + 1:3d}  test loss {loss:.4f}  accuracy {acc:.4f}  ({size} ranks)",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
