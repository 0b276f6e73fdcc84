"""PyTorch Lightning on mpidist: ``Trainer`` + ``DDPStrategy`` under any MPI launcher.

A small classifier on synthetic data (a fixed random linear teacher), one epoch by default::

    mpiexec -n 2 python examples/lightning_ddp.py                 # MPI's backend and layout
    srun --mpi=pmi2 -n 2 python examples/lightning_ddp.py         # Slurm starts the ranks
    sbatch examples/slurm/lightning.sbatch                        # mpiexec inside the allocation
    mpiexec -n 2 python examples/lightning_ddp.py --backend gloo  # torch's gloo, for comparison

What makes it run on MPI is three lines: ``import mpidist.torch`` (the ``"mpidist"``
backend), ``DDPStrategy(process_group_backend="mpidist")`` and
``plugins=[MpidistEnvironment()]`` (ranks, nodes and the rendezvous from MPI; it also
refuses a ``devices``/``num_nodes`` that does not match the job). ``devices`` is the
number of ranks per node and ``num_nodes`` the number of nodes; both default to what MPI
started. ``--environment lightning`` leaves the choice of environment to Lightning
(its own ``MPIEnvironment`` under plain ``mpiexec``).

``--record DIR`` writes, per rank, the sample indices it trained on and its final
parameters (the tests check the shards are disjoint and the parameters equal); rank 0's
last line gives the loss and a hash of the parameters.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import lightning as L  # noqa: N812  (Lightning's own spelling)
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

import mpidist.torch  # noqa: F401  (registers the "mpidist" backend)
from mpidist.integrations.lightning import MpidistEnvironment


def synthetic(n: int, seed: int) -> TensorDataset:
    """Points in 20 dimensions labelled by a fixed random linear map into 4 classes, with their index."""
    teacher = torch.randn(20, 4, generator=torch.Generator().manual_seed(0))
    x = torch.randn(n, 20, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(x, (x @ teacher).argmax(1), torch.arange(n))


class Classifier(L.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        self.lr = lr
        self.seen: list[int] = []
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y, idx = batch
        self.seen += idx.tolist()
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--backend", choices=["mpidist", "gloo"], default="mpidist")
    ap.add_argument("--environment", choices=["mpidist", "lightning"], default="mpidist",
                    help="mpidist: plugins=[MpidistEnvironment()]; lightning: Lightning's own choice")
    ap.add_argument("--devices", type=int, help="ranks per node (default: what MPI started)")
    ap.add_argument("--num-nodes", type=int, help="nodes (default: what MPI started)")
    ap.add_argument("--record", help="folder for each rank's shard and parameters (JSON)")
    args = ap.parse_args()

    environment = MpidistEnvironment()  # collective: every rank builds it
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    model = Classifier(args.lr)
    trainer = L.Trainer(
        accelerator="cpu", devices=args.devices or environment.ranks_per_node[0],
        num_nodes=args.num_nodes or environment.num_nodes, max_epochs=args.epochs,
        strategy=DDPStrategy(process_group_backend=args.backend),
        plugins=[environment] if args.environment == "mpidist" else None,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    loader = DataLoader(synthetic(args.samples, seed=1), batch_size=args.batch_size, shuffle=True)
    trainer.fit(model, loader)

    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    digest = hashlib.sha256(params.numpy().tobytes()).hexdigest()
    rank, world_size = trainer.global_rank, trainer.world_size
    if args.record:
        with open(os.path.join(args.record, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "world_size": world_size, "seen": model.seen, "losses": model.losses,
                       "params": params.tolist(), "params_sha256": digest,
                       "backend": str(torch.distributed.get_backend()),
                       "environment": type(trainer.strategy.cluster_environment).__name__}, f)
    if rank == 0:
        print(f"final: world_size={world_size} backend={torch.distributed.get_backend()} "
              f"environment={type(trainer.strategy.cluster_environment).__name__} "
              f"last_loss={model.losses[-1]:.6f} params_sha256={digest}", flush=True)


if __name__ == "__main__":
    main()
