"""Data-parallel training that goes on when a rank dies: DDP on mpidist over ULFM.

Start it so that a dead rank raises instead of ending the job (Open MPI 5 with ULFM)::

    mpiexec --with-ft ulfm --mca mpi_ft_detector true --mca mpi_ft_detector_thread true \\
        --mca mpi_ft_detector_period 0.1 --mca mpi_ft_detector_timeout 0.4 \\
        -n 4 python examples/survive.py --kill 3:25

``--kill RANK:STEP`` makes that rank SIGKILL itself at that step (``RANK:STEP:backward``: in the
middle of the step's backward, ``:exit``: ``os._exit`` instead of SIGKILL), so that the
recovery can be watched. Every survivor catches the failure and then:

- in a job started with spares (``MPIDIST_SPARES=1``, one more process: ``-x MPIDIST_SPARES=1
  -n 5``), heals the world back to its size (``mpidist.torch.heal``): a spare takes the dead
  rank's place and starts this script, which builds the model and DDP as at the start and takes
  the survivors' parameters, optimizer state and position (``catch_up``); the run goes on at full
  size with the data order of a run never killed;
- with no spare left, shrinks the world (``torch.distributed.shrink_group``), rebuilds DDP on it
  (the new rank 0's parameters are broadcast), shards the rest of the epoch over the survivors
  and trains on.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import time
import weakref

import mpidist  # first: MPI_Init before torch's import, see docs/survive.md

# isort: split
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import mpidist.torch  # noqa: F401  (registers the "mpidist" backend)
from mpidist.training.recovery import catch_up, process_failure, resume_sampler
from mpidist.training.sampler import DistributedSampler

try:
    from train_torch import data
except ImportError:  # run from elsewhere than examples/
    from examples.train_torch import data


def killer(spec: str | None) -> tuple[int, int, str]:
    """``RANK:STEP[:how]`` as (world rank, step, how); (-1, -1, '') for none."""
    if not spec:
        return -1, -1, ""
    parts = spec.split(":")
    return int(parts[0]), int(parts[1]), parts[2] if len(parts) > 2 else "step"


def die(how: str) -> None:
    if how == "exit":
        os._exit(1)
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--kill", default=None, action="append", help="RANK:STEP[:backward|:exit] (repeatable)")
    args = ap.parse_args()
    kills = [killer(k) for k in args.kill or []]

    torch.set_num_threads(1)
    train, _ = data()  # before init_process_group, where a spare waits: it starts warm
    dist.init_process_group("mpidist")
    me = dist.get_rank()  # the rank at start: --kill names these (a spare takes a dead rank's)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(module.parameters(), lr=args.lr, momentum=0.9)
    doomed = {"backward": False}

    def in_backward(grad: torch.Tensor) -> torch.Tensor:
        if doomed["backward"]:
            die("kill")
        return grad
    module[0].weight.register_hook(in_backward)

    step, epoch = 0, 0
    sampler = DistributedSampler(train, seed=0, rng="torch")
    if mpidist.is_newcomer():  # a spare called in: the survivors' state (before DDP, which
        # broadcasts rank 0's parameters), their step and position, and no kill of its own
        kills = []
        state = catch_up(module, opt, step=step, epoch=epoch, position=0)
        step, epoch = state["step"], state["epoch"]
        sampler = resume_sampler(sampler, state["position"])
        print(f"[rank {me}] joined as a spare at step {step}", flush=True)
    model = DistributedDataParallel(module)
    while epoch < args.epochs:
        sampler.set_epoch(epoch)
        order = sampler.indices()
        done = 0  # samples of the sampler's order that every rank together has finished
        losses = []
        failure = loss = x = y = None
        try:
            for i in range(0, len(order), args.batch_size):
                for rank, at, how in kills:
                    if rank == me and at == step:
                        if how == "backward":
                            doomed["backward"] = True
                        else:
                            die(how)
                x, y = train[order[i:i + args.batch_size]]
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                losses.append(loss.item())
                done += args.batch_size * dist.get_world_size()
                step += 1
        except Exception as exc:  # noqa: BLE001 - re-raised unless a rank died
            failure = process_failure(exc)
            if failure is None:
                raise
        if failure is not None:  # outside the except block: its traceback holds the old DDP
            t0 = time.monotonic()
            module = model.module
            old = weakref.ref(model)
            # the old DDP's autograd hooks (its reducer's) must go before the new DDP adds its
            # own: drop every reference to the failed step (its graph, the error's frames)
            del model, loss, x, y
            failure.__traceback__ = None
            gc.collect()
            if old() is not None:  # still held somewhere: end its reducer (that removes the hooks)
                old().reducer = old().logger = None
                gc.collect()
            healed = mpidist.spares_left() > 0
            if healed:  # the spare builds its DDP and calls catch_up as the survivors do here
                mpidist.torch.heal()
                catch_up(module, opt, step=step, epoch=epoch, position=sampler.start + done)
                model = DistributedDataParallel(module)
            else:
                dist.shrink_group(failure.failed_ranks)
                model = DistributedDataParallel(module)  # broadcasts the new rank 0's parameters
            sampler = resume_sampler(sampler, done)
            print(f"[rank {me}] step {step}: rank(s) {failure.failed_ranks} died; going on as rank "
                  f"{dist.get_rank()} of {dist.get_world_size()}, {'healed' if healed else 'shrunk'} "
                  f"(recovered in {(time.monotonic() - t0) * 1e3:.0f} ms)", flush=True)
            continue  # the rest of this epoch
        sampler = DistributedSampler(train, seed=0, rng="torch")
        epoch += 1
        mean = torch.tensor([sum(losses), len(losses)], dtype=torch.float64)
        dist.all_reduce(mean)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}  train loss {mean[0] / mean[1]:.4f}  ({dist.get_world_size()} ranks)",
                  flush=True)
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    print(f"[rank {me}] done as rank {dist.get_rank()} of {dist.get_world_size()}: parameter checksum "
          f"{checksum:.10f}", flush=True)
    del model, opt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
