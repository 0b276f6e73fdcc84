"""Data-parallel training of a small MLP on scikit-learn's bundled handwritten digits.

    mpiexec -n 8 python examples/train.py --epochs 10

Every rank holds the same model. Each step, a rank computes the gradient on its part of
the global batch (its indices come from ``mpidist.DistributedSampler``), then the
gradients are averaged with one ``all_reduce(AVG)`` on one flat buffer, and every rank
takes the same SGD step. ``--batch-size`` is the *global* batch, split over the ranks, so
a run at N ranks visits the same batches as a run at 1 rank and reaches the same accuracy.
At the end the ranks compare a hash of their parameters: they must be bitwise equal.

Rank 0 writes everything to stdout, so a terminal and a Slurm log read the same lines in
order: a start line, one line per epoch (written above the tqdm bar), a summary. The bar
shows when the launcher writes to a terminal (``--progress``/``--no-progress`` decide).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import numpy as np
from sklearn.datasets import load_digits
from tqdm import tqdm

import mpidist as dist
from mpidist import DistributedSampler, average_gradients
from mpidist.training.gradients import FlatBuffer

HIDDEN = 64


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64, help="global batch size (split over the ranks)")
    p.add_argument("--lr", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=0)
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="progress bar even when the output is not a terminal")
    bar.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return p.parse_args()


_LAUNCHERS = ("mpiexec", "mpirun", "prterun", "orterun")
_FORWARDERS = ("hydra_pmi_proxy", "prted", "orted", "timeout")


def writes_to_terminal() -> bool:
    """Whether rank 0's stdout ends up on a terminal (tqdm's own check says no under mpiexec).

    Under ``mpiexec`` a rank writes into a pipe (Open MPI: a pty) that the launcher copies
    to its own stdout, so only the launcher's stdout tells: a terminal for ``make demo``,
    the job's log file under ``sbatch``, a pipe under a test. Walk up the parent processes
    (Linux ``/proc``) through the launcher's helpers to ``mpiexec`` and ask its stdout.
    """
    pid = os.getppid()
    for _ in range(6):
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
            if name.startswith(_LAUNCHERS):
                return os.readlink(f"/proc/{pid}/fd/1").startswith(("/dev/pts/", "/dev/tty"))
            if not name.startswith(_FORWARDERS):
                break
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return sys.stdout.isatty()


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def load(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits scaled to [0, 1], split 80/20 with a fixed permutation (same on every rank)."""
    x, y = load_digits(return_X_y=True)
    x = x.astype(np.float64) / 16.0
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.8 * len(y))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def init_params(seed: int, n_in: int, n_out: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    return [rng.normal(0, 1 / np.sqrt(n_in), (n_in, HIDDEN)), np.zeros(HIDDEN),
            rng.normal(0, 1 / np.sqrt(HIDDEN), (HIDDEN, n_out)), np.zeros(n_out)]


def forward(params: list[np.ndarray], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w1, b1, w2, b2 = params
    h = np.tanh(x @ w1 + b1)
    logits = h @ w2 + b2
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    return h, p / p.sum(axis=1, keepdims=True)


def loss_and_grads(params: list[np.ndarray], x: np.ndarray, y: np.ndarray,
                   grads: list[np.ndarray]) -> tuple[float, int]:
    """Mean cross-entropy over the batch; writes its gradient into ``grads``; returns (loss, correct)."""
    w1, b1, w2, b2 = params
    h, p = forward(params, x)
    n = len(y)
    loss = float(-np.log(p[np.arange(n), y] + 1e-12).mean())
    correct = int((p.argmax(axis=1) == y).sum())
    d_logits = p
    d_logits[np.arange(n), y] -= 1.0
    d_logits /= n
    np.matmul(h.T, d_logits, out=grads[2])
    grads[3][...] = d_logits.sum(axis=0)
    d_h = (d_logits @ w2.T) * (1.0 - h * h)
    np.matmul(x.T, d_h, out=grads[0])
    grads[1][...] = d_h.sum(axis=0)
    return loss, correct


def main() -> None:
    args = parse_args()
    info = dist.init_distributed_mode(args)
    rank, world = info.rank, info.world_size
    if args.batch_size < world:
        raise SystemExit(f"--batch-size {args.batch_size} must be at least the number of ranks ({world})")
    local_batch = args.batch_size // world
    x_train, y_train, x_test, y_test = load(args.seed)
    params = init_params(args.seed, x_train.shape[1], 10)
    for p in params:  # as DDP does: rank 0's initial model wins, whatever the ranks computed
        dist.broadcast(p, src=0)
    flat = FlatBuffer(params)
    grads = flat.views()  # the gradients live in the flat buffer: averaging copies nothing
    sampler = DistributedSampler(x_train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    steps = -(-len(sampler) // local_batch)
    print(f"{_count(world, 'rank')} on {_count(info.num_nodes, 'node')}, launcher {info.launcher}; "
          f"{len(y_train)} training / {len(y_test)} test digits; global batch {local_batch * world}, "
          f"{steps} steps per epoch", flush=True)
    show_bar = rank == 0 and (writes_to_terminal() if args.progress is None else args.progress)
    # the bar and the lines share stdout: two streams would reach the terminal in any order
    bar = tqdm(total=args.epochs * steps, disable=not show_bar, unit="step", file=sys.stdout)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        idx = np.fromiter(sampler, dtype=np.int64)
        totals = np.zeros(3)  # loss * samples, correct, samples (this rank)
        for s in range(steps):
            batch = idx[s * local_batch:(s + 1) * local_batch]
            loss, correct = loss_and_grads(params, x_train[batch], y_train[batch], grads)
            average_gradients(grads, buffer=flat)
            for p, g in zip(params, grads):
                p -= args.lr * g
            totals += (loss * len(batch), correct, len(batch))
            bar.update()
        dist.all_reduce(totals)
        test_acc = float((forward(params, x_test)[1].argmax(axis=1) == y_test).mean())
        if rank == 0:  # above the bar; tqdm.write bypasses the quiet print of the other ranks
            bar.write(f"epoch {epoch + 1}/{args.epochs}: train loss {totals[0] / totals[2]:.4f}, "
                      f"train accuracy {totals[1] / totals[2]:.4f}, test accuracy {test_acc:.4f}",
                      file=sys.stdout)
            sys.stdout.flush()
    elapsed = time.perf_counter() - start
    bar.close()
    digest = hashlib.sha256(b"".join(p.tobytes() for p in params)).hexdigest()
    digests = [None] * world
    dist.all_gather_object(digests, digest)
    if len(set(digests)) != 1:
        raise AssertionError(f"parameters differ between ranks: {digests}")
    total_steps = args.epochs * steps
    print(f"summary: {_count(world, 'rank')} on {_count(info.num_nodes, 'node')}, {info.launcher}; "
          f"{total_steps} steps in {elapsed:.1f} s, {total_steps / elapsed:.1f} steps/s")
    print(f"summary: test accuracy {test_acc:.4f}; parameters identical on all {_count(world, 'rank')} "
          f"(sha256 {digest[:12]})")
    print(f"final: world_size={world} test_accuracy={test_acc:.4f} params_sha256={digest}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
