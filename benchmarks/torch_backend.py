"""The mpidist torch backend against gloo (and raw mpi4py), in one run.

Per-call ``all_reduce`` of float32 tensors (4 B ... 64 MiB by default) through
``torch.distributed`` on the mpidist default group — synchronous and ``async_op=True``
— against a gloo group of the same ranks and a bare ``mpi4py`` ``Allreduce``; then the
time of one DDP step (forward, backward, optimizer) for a small (~10 k parameters) and a
large (>= 10 M) MLP: gloo, mpidist with overlapped bucket all-reduces (nonblocking MPI
completed by the progress thread) and mpidist with every bucket reduced synchronously.
Every figure is the slowest rank's mean over ``--reps`` calls, best of ``--trials``.
``--rounds R`` interleaves the DDP steps of the backends R times: the step times are the
medians of the rounds, and each ratio is first taken within a round (the two sides ran under the
same load), then given as the median of those and their min-max.

    mpiexec -n 4 python benchmarks/torch_backend.py                       # full run
    mpiexec -n 2 python benchmarks/torch_backend.py --max-bytes 4MiB --reps 20 --large-width 1024

``--two-node`` (what ``benchmarks/network.py --ddp`` runs on its simulated nodes) times only
the large model's DDP step: its compute alone (no DDP), gloo and mpidist with float32
gradients (mpidist with the automatic blocking-or-overlap choice, and forced either way),
and both with ``fp16_compress_hook``.

``--breakdown`` splits the large model's DDP step: the compute alone, DDP with a comm hook
that moves nothing (the floor every backend shares), gloo and mpidist, and the all_reduce of
that step's buckets alone by raw ``MPI_Allreduce``, mpidist and gloo. A backend's step less
the floor is its communication in the step; the floor bounds what gloo ÷ mpidist can reach.

``--loader-workers N`` feeds every DDP step from a ``DataLoader`` with ``N`` workers per rank
whose samples cost ``--sample-us`` of CPU each (as decoding and augmenting do), so the workers
take a share of the cores while the ranks train and wait; ``--ddp-only`` skips the per-call table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from mpi4py import MPI
from suite.sizes import parse_size

import mpidist.torch  # noqa: F401
from mpidist.torch import backend


def timed(fn: Callable[[], None], reps: int, trials: int) -> float:
    """Seconds per call: the slowest rank's mean over ``reps`` calls, best of ``trials``."""
    best = float("inf")
    fn()
    for _ in range(trials):
        MPI.COMM_WORLD.Barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        dt = (time.perf_counter() - t0) / reps
        best = min(best, MPI.COMM_WORLD.allreduce(dt, op=MPI.MAX))
    return best


def allreduce_table(gloo: dist.ProcessGroup, max_bytes: int, reps: int, trials: int) -> list[dict]:
    rows = []
    nbytes = 4
    comm = MPI.COMM_WORLD.Dup()
    while nbytes <= max_bytes:
        t = torch.ones(nbytes // 4)
        arr = t.numpy()
        n = max(3, min(reps, int(reps * (1 << 16) / max(nbytes, 1 << 16))))

        calls = {
            "mpi4py_us": lambda arr=arr: comm.Allreduce(MPI.IN_PLACE, [arr, MPI.FLOAT]),
            "mpidist_us": lambda t=t: dist.all_reduce(t),
            "mpidist_async_us": lambda t=t: dist.all_reduce(t, async_op=True).wait(),
            "gloo_us": lambda t=t: dist.all_reduce(t, group=gloo),
        }
        row = {"bytes": nbytes, **{k: timed(fn, n, trials) * 1e6 for k, fn in calls.items()}}
        rows.append(row)
        nbytes *= 4 if nbytes < (1 << 20) else 2
    comm.Free()
    return rows


def mlp(width: int, depth: int) -> torch.nn.Module:
    layers: list[torch.nn.Module] = [torch.nn.Linear(32, width), torch.nn.ReLU()]
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*layers)


class Costly(torch.utils.data.Dataset):
    """Samples that take ``cost`` seconds of CPU each to make, as decoded, augmented images do."""

    def __init__(self, length: int, cost: float) -> None:
        self.length, self.cost = length, cost

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        end = time.perf_counter() + self.cost
        x = torch.full((32,), float(i % 7))
        while time.perf_counter() < end:  # a worker's CPU work, on a core the ranks also want
            x = torch.tanh(x)
        return x, i % 10


class Batches:
    """Endless batches from a ``DataLoader`` with ``workers`` persistent worker processes;
    :meth:`close` ends the workers before the process groups go."""

    def __init__(self, batch: int, workers: int, cost: float) -> None:
        self.loader = torch.utils.data.DataLoader(Costly(batch * 64, cost), batch_size=batch,
                                                  num_workers=workers, persistent_workers=True,
                                                  prefetch_factor=2)
        self.it: Iterator = itertools.chain.from_iterable(itertools.repeat(self.loader))

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return next(self.it)

    def close(self) -> None:
        workers = getattr(self.loader, "_iterator", None)
        if workers is not None:
            workers._shutdown_workers()
        self.it = iter(())


def ddp_step_time(width: int, depth: int, group: dist.ProcessGroup | None, batch: int, reps: int,
                  trials: int, hook: Callable | None = None, local: bool = False,
                  loader: Iterator | None = None) -> tuple[int, float]:
    """(parameters, seconds per step); ``local``: the bare model, no DDP (the compute alone);
    ``loader``: each step's batch comes from it (else one fixed batch)."""
    torch.manual_seed(0)
    model = mlp(width, depth)
    if not local:
        model = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        if hook is not None:
            model.register_comm_hook(group, hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, 32), torch.randint(0, 10, (batch,))

    def step() -> None:
        xb, yb = (x, y) if loader is None else next(loader)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()

    params = sum(p.numel() for p in model.parameters())
    return params, timed(step, reps, trials)


def two_node(args: argparse.Namespace, gloo: dist.ProcessGroup) -> dict:
    """The large model's DDP step: compute alone, gloo vs mpidist, float32 and fp16-compressed."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from mpidist.core import topology
    from mpidist.torch import overlap

    fp16 = default_hooks.fp16_compress_hook
    width, depth, batch = args.large_width, 4, 64
    params, compute = ddp_step_time(width, depth, None, batch, args.ddp_reps, args.trials, local=True)
    nodes = topology.node_count(MPI.COMM_WORLD)
    out = {"params": params, "compute_ms": compute * 1e3, "nodes": nodes,
           "auto_sync_bytes": overlap.choose(nodes, overlap.shared_cores()), "steps": {}}
    overlapped, blocking = mpidist_group(0), mpidist_group(1 << 62)
    for key, group, hook in (("gloo:fp32", gloo, None), ("mpidist:fp32", None, None),
                             ("mpidist-overlap:fp32", overlapped, None),
                             ("mpidist-sync:fp32", blocking, None), ("gloo:fp16", gloo, fp16),
                             ("mpidist:fp16", None, fp16)):
        _, t = ddp_step_time(width, depth, group, batch, args.ddp_reps, args.trials, hook=hook)
        out["steps"][key] = t * 1e3
        if dist.get_rank() == 0:
            print(f"  {key:<22} {t * 1e3:9.1f} ms", flush=True)
    return out


def breakdown(args: argparse.Namespace, gloo: dist.ProcessGroup) -> dict:
    """Where the large model's DDP step goes, per round: the compute alone; DDP with a comm hook
    that moves nothing (its bucket copies and hooks: the floor of any backend); DDP on gloo and
    on mpidist; and the all_reduce of one step's buckets alone, by raw ``MPI_Allreduce``,
    mpidist and gloo. A backend's step less the floor is what its communication cost in the
    step, to compare with its all_reduce alone."""
    width, depth, batch = args.large_width, 4, 64
    seen: list[int] = []

    def nothing(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations
        seen.append(bucket.buffer().numel())
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    params, _ = ddp_step_time(width, depth, None, batch, 1, 1, hook=nothing)
    buckets: list[int] = []  # the last step's: DDP rebuilds its buckets after the first step
    while sum(buckets) < params:
        buckets.insert(0, seen.pop())
    tensors = [torch.ones(n) for n in buckets]
    world = MPI.COMM_WORLD

    def raw() -> None:
        for t in tensors:
            world.Allreduce(MPI.IN_PLACE, t.numpy())

    def through(group: dist.ProcessGroup | None) -> Callable[[], None]:
        return lambda: [dist.all_reduce(t, group=group) for t in tensors] and None

    reps, trials = args.ddp_reps, args.trials
    rounds = []
    for _ in range(args.rounds):  # interleaved: the machine's load moves between rounds
        r = {"compute": ddp_step_time(width, depth, None, batch, reps, trials, local=True)[1],
             "floor": ddp_step_time(width, depth, None, batch, reps, trials, hook=nothing)[1],
             "gloo": ddp_step_time(width, depth, gloo, batch, reps, trials)[1],
             "mpidist": ddp_step_time(width, depth, None, batch, reps, trials)[1],
             "buckets raw MPI_Allreduce": timed(raw, reps, trials),
             "buckets mpidist": timed(through(None), reps, trials),
             "buckets gloo": timed(through(gloo), reps, trials)}
        rounds.append({k: v * 1e3 for k, v in r.items()})
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    if dist.get_rank() == 0:
        print(f"DDP step of {params} parameters, {dist.get_world_size()} ranks x {args.threads} threads; "
              f"buckets of {', '.join(map(str, buckets))} float32 (ms, slowest rank; median of "
              f"{args.rounds} rounds, then each round)")
        for k, v in med.items():
            print(f"  {k:<26} {v:9.2f}   " + " ".join(f"{r[k]:.2f}" for r in rounds))
        print(f"  step less floor: gloo {med['gloo'] - med['floor']:.2f}, mpidist "
              f"{med['mpidist'] - med['floor']:.2f}; gloo / mpidist {med['gloo'] / med['mpidist']:.2f}, "
              f"bound with mpidist's all_reduce free {med['gloo'] / med['floor']:.2f}")
    return {"params": params, "buckets": buckets, "rounds": rounds, "medians": med}


def mpidist_group(limit: int) -> dist.ProcessGroup:
    """A group of every rank on the mpidist backend whose asynchronous calls of at most ``limit``
    bytes run blocking (0: every one overlaps). The limit is read when a group is made
    (``mpidist.torch.overlap``), so setting ``backend.SYNC_BYTES`` later changes no group."""
    saved = backend.SYNC_BYTES
    backend.SYNC_BYTES = limit
    try:
        group = dist.new_group()
    finally:
        backend.SYNC_BYTES = saved
    if getattr(group, "_sync_limit", None) != limit:
        raise RuntimeError(f"the new group's blocking limit is {getattr(group, '_sync_limit', None)}, "
                           f"not {limit}")
    return group


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-bytes", default="64MiB")
    ap.add_argument("--reps", type=int, default=200, help="calls per trial for small messages")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--large-width", type=int, default=1600, help="width of the large MLP (4 layers)")
    ap.add_argument("--ddp-reps", type=int, default=None, help="steps per trial (default 10, --two-node 3)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    ap.add_argument("--loader-workers", type=int, default=0,
                    help="DataLoader worker processes per rank feeding the DDP steps (0: one fixed batch)")
    ap.add_argument("--sample-us", type=float, default=50.0, help="CPU time per sample in a worker (µs)")
    ap.add_argument("--rounds", type=int, default=1, help="DDP rounds (gloo, overlap, sync), interleaved")
    ap.add_argument("--models", default="small,large", help="DDP models: small (7 k parameters), large")
    ap.add_argument("--ddp-only", action="store_true", help="only the DDP steps, not the per-call table")
    ap.add_argument("--noise", action="store_true",
                    help="also time gloo a second time in each round: gloo/gloo, the ratios' noise floor")
    ap.add_argument("--json", help="also write the results here (rank 0)")
    ap.add_argument("--breakdown", action="store_true",
                    help="only the large model's DDP step, its floor, and its buckets' all_reduce alone")
    ap.add_argument("--two-node", action="store_true",
                    help="only the large model's DDP step, with its compute and fp16 compression")
    args = ap.parse_args()
    if args.rounds < 1 or args.loader_workers < 0 or args.sample_us < 0:
        ap.error("--rounds must be at least 1, --loader-workers and --sample-us at least 0")
    unknown = set(args.models.split(",")) - {"small", "large"}
    if unknown:
        ap.error(f"--models: unknown {sorted(unknown)} (small, large)")

    torch.set_num_threads(args.threads)
    dist.init_process_group("mpidist")
    gloo = dist.new_group(backend="gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    # steps across a network take its time: keep --two-node's run short
    args.ddp_reps = args.ddp_reps or (3 if args.two_node else 10)
    if args.two_node or args.breakdown:  # the large model's step alone
        res = (two_node if args.two_node else breakdown)(args, gloo)
        if rank == 0 and args.json:
            with open(args.json, "w") as fh:
                json.dump(res, fh, indent=1)
        dist.destroy_process_group()
        return
    out = {"ranks": size, "threads": args.threads, "loader_workers": args.loader_workers, "allreduce": []}
    if not args.ddp_only:
        out["allreduce"] = allreduce_table(gloo, parse_size(args.max_bytes), args.reps, args.trials)
    loader = Batches(64, args.loader_workers, args.sample_us * 1e-6) if args.loader_workers else None
    # every bucket nonblocking (completed by the progress thread), and every bucket blocking
    mine = {"mpidist_overlap_ms": mpidist_group(0), "mpidist_sync_ms": mpidist_group(1 << 62)}
    ddp = []
    for label, width, depth in (("small", 64, 1), ("large", args.large_width, 4)):
        if label not in args.models.split(","):
            continue
        row: dict = {"model": label, "rounds": []}
        for _ in range(args.rounds):  # interleaved: the machine's load moves between rounds
            r: dict = {}
            row["params"], r["gloo_ms"] = ddp_step_time(width, depth, gloo, 64, args.ddp_reps,
                                                        args.trials, loader=loader)
            for key, group in mine.items():
                _, r[key] = ddp_step_time(width, depth, group, 64, args.ddp_reps, args.trials, loader=loader)
            if args.noise:  # the same backend twice: what a ratio of one round can tell apart
                _, r["gloo_again_ms"] = ddp_step_time(width, depth, gloo, 64, args.ddp_reps,
                                                      args.trials, loader=loader)
            row["rounds"].append({k: v * 1e3 for k, v in r.items()})
        for k in ("gloo_ms", "mpidist_overlap_ms", "mpidist_sync_ms"):
            row[k] = statistics.median(r[k] for r in row["rounds"])
        for k in ("overlap", "sync"):  # per round, so that a slow round slows both sides
            row[f"gloo_over_{k}"] = [r["gloo_ms"] / r[f"mpidist_{k}_ms"] for r in row["rounds"]]
        if args.noise:
            row["gloo_over_gloo"] = [r["gloo_ms"] / r["gloo_again_ms"] for r in row["rounds"]]
        ddp.append(row)
    if loader is not None:
        loader.close()
    out["ddp"] = ddp
    if rank == 0 and out["allreduce"]:
        print(f"all_reduce float32, {size} ranks (us per call, slowest rank)")
        print(f"{'bytes':>10} {'mpi4py':>10} {'mpidist':>10} {'md async':>10} {'gloo':>10} {'gloo/md':>8}")
        for r in out["allreduce"]:
            print(f"{r['bytes']:>10} {r['mpi4py_us']:>10.1f} {r['mpidist_us']:>10.1f} "
                  f"{r['mpidist_async_us']:>10.1f} {r['gloo_us']:>10.1f} "
                  f"{r['gloo_us'] / r['mpidist_us']:>8.2f}")
    if rank == 0:
        feed = f", {args.loader_workers} loader workers each" if args.loader_workers else ""
        print(f"\nDDP step, {size} ranks x {args.threads} threads{feed} (ms per step, slowest rank)")
        noise = f" {'gloo/gloo':>19}" if args.noise else ""
        print(f"{'model':>6} {'params':>10} {'gloo':>9} {'md overlap':>11} {'md sync':>9} "
              f"{'gloo/overlap':>19} {'gloo/sync':>19}{noise}"
              "   (ms: medians of the rounds; ratios: the median of the rounds' own, then their min-max)")
        for r in ddp:
            spans = [f"{statistics.median(r[k]):.2f} {min(r[k]):.2f}-{max(r[k]):.2f}"
                     for k in ("gloo_over_overlap", "gloo_over_sync", "gloo_over_gloo") if k in r]
            print(f"{r['model']:>6} {r['params']:>10} {r['gloo_ms']:>9.2f} {r['mpidist_overlap_ms']:>11.2f} "
                  f"{r['mpidist_sync_ms']:>9.2f} {spans[0]:>19} {spans[1]:>19}"
                  + (f" {spans[2]:>19}" if args.noise else ""))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(out, fh, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
