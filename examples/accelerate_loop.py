"""accelerate's ``Accelerator`` on mpidist: a plain training loop, ``use_for_cpu()``, ``mpiexec``.

::

    mpiexec -n 2 python examples/accelerate_loop.py          # instead of `accelerate launch`
    srun --mpi=pmi2 -n 2 python examples/accelerate_loop.py

accelerate picks ``"gloo"`` on a CPU and refuses any other name; :func:`mpidist.torch.use_for_cpu`,
called first on every rank, runs it on mpidist's MPI backend, with rank, size and
rendezvous from MPI. ``--no-use-for-cpu`` leaves it out (for ``python -m mpidist.run``).
``--record DIR`` writes each rank's shard and parameters, as the other examples do.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import torch

import mpidist.torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--no-use-for-cpu", action="store_true", help="started through python -m mpidist.run")
    ap.add_argument("--record", help="folder for each rank's shard and parameters (JSON)")
    args = ap.parse_args()
    if not args.no_use_for_cpu:
        mpidist.torch.use_for_cpu()  # first, on every rank
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    teacher = torch.randn(20, 4, generator=torch.Generator().manual_seed(0))
    x = torch.randn(args.samples, 20, generator=torch.Generator().manual_seed(1))
    data = torch.utils.data.TensorDataset(x, (x @ teacher).argmax(1), torch.arange(args.samples))
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    seen, loss = [], None
    for xb, yb, idx in loader:
        seen += idx.tolist()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        accelerator.backward(loss)
        opt.step()

    params = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()])
    digest = hashlib.sha256(params.numpy().tobytes()).hexdigest()
    rank, backend = accelerator.process_index, str(torch.distributed.get_backend())
    if args.record:
        with open(os.path.join(args.record, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "world_size": accelerator.num_processes, "seen": seen,
                       "params": params.tolist(), "params_sha256": digest, "backend": backend}, f)
    if accelerator.is_main_process:
        print(f"final: world_size={accelerator.num_processes} backend={backend} last_loss={loss.item():.6f} "
              f"params_sha256={digest}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
