"""Training that resumes where it stopped: DDP on mpidist with torch.distributed.checkpoint.

Where the MPI cannot survive a dead rank (MPICH, or a job not started for ULFM), a death ends
the job; rerun the same command (or let ``sbatch --requeue`` do it) and training goes on from
the last checkpoint, ending with the same parameters as a run never killed::

    mpiexec -n 4 python examples/resume.py --dir ckpt --steps 60 --every 10
    mpiexec -n 4 python examples/resume.py --dir ckpt --steps 60 --every 10   # after a kill

Each step's batch follows from the step number alone, so a resumed run sees the same data.
``--kill RANK:STEP`` makes that rank exit at that step (to try it).
"""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

import mpidist.torch  # noqa: F401  (registers the "mpidist" backend)

try:
    from train_torch import data
except ImportError:  # run from elsewhere than examples/
    from examples.train_torch import data


def latest(folder: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint (DCP writes ``.metadata`` last), as (step, path)."""
    done = [(int(p.name.split("-")[1]), p) for p in folder.glob("step-*") if (p / ".metadata").exists()]
    return max(done) if done else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="checkpoint folder (shared by every rank)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=10, help="steps between checkpoints")
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--kill", default=None, help="RANK:STEP: that rank exits at that step")
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("mpidist")
    rank, size = dist.get_rank(), dist.get_world_size()
    train, _ = data()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    folder = Path(args.dir)
    start = 0
    found = latest(folder)
    if found is not None:
        model_sd, optim_sd = get_state_dict(model, opt)
        state = {"model": model_sd, "optim": optim_sd, "step": torch.tensor(0)}
        dcp.load(state, checkpoint_id=str(found[1]))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = int(state["step"])
        if rank == 0:
            print(f"resuming at step {start} from {found[1]}", flush=True)
    kill = tuple(map(int, args.kill.split(":"))) if args.kill else (-1, -1)
    for step in range(start, args.steps):
        if (rank, step) == kill:
            os._exit(1)
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(step))
        x, y = train[order[(rank * args.batch_size) % len(train):][:args.batch_size]]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if (step + 1) % args.every == 0:
            model_sd, optim_sd = get_state_dict(model, opt)
            dcp.save({"model": model_sd, "optim": optim_sd, "step": torch.tensor(step + 1)},
                     checkpoint_id=str(folder / f"step-{step + 1}"))
            if rank == 0:
                print(f"step {step + 1}  loss {loss.item():.4f}  checkpoint saved ({size} ranks)", flush=True)
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    print(f"[rank {rank}] parameter checksum {checksum!r}", flush=True)
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
