"""The distributed helpers of DETR's ``util/misc.py`` (DeiT's ``utils.py`` has the same ones).

Kept as those projects write them, so that ``main.py`` shows what such a script needs to run
under MPI: nothing, with ``python -m mpidist.run``; or ``mpidist.init_distributed_mode(args)``
in place of :func:`init_distributed_mode` here. The one change from DETR: CPU-only hosts get
gloo instead of a CUDA device, so the example runs anywhere.
"""

from __future__ import annotations

import builtins
import os

import torch
import torch.distributed as dist


def setup_for_distributed(is_master: bool) -> None:
    """Disable printing when not in the master process (``print(..., force=True)`` still prints)."""
    builtin_print = builtins.print

    def print(*args, **kwargs):  # noqa: A001
        force = kwargs.pop("force", False)
        if is_master or force:
            builtin_print(*args, **kwargs)

    builtins.print = print


def is_dist_avail_and_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_world_size() -> int:
    return dist.get_world_size() if is_dist_avail_and_initialized() else 1


def get_rank() -> int:
    return dist.get_rank() if is_dist_avail_and_initialized() else 0


def is_main_process() -> bool:
    return get_rank() == 0


def save_on_master(*args, **kwargs) -> None:
    if is_main_process():
        torch.save(*args, **kwargs)


def init_distributed_mode(args) -> None:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
        args.gpu = int(os.environ["LOCAL_RANK"]) if torch.cuda.is_available() else None
    elif "SLURM_PROCID" in os.environ:
        args.rank = int(os.environ["SLURM_PROCID"])
        args.gpu = args.rank % torch.cuda.device_count() if torch.cuda.is_available() else None
    else:
        print("Not using distributed mode")
        args.distributed = False
        args.gpu = None
        return

    args.distributed = True
    if args.gpu is not None:
        torch.cuda.set_device(args.gpu)
    args.dist_backend = "nccl" if args.gpu is not None else "gloo"
    print(f"| distributed init (rank {args.rank}): {args.dist_url}", flush=True)
    dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                            world_size=args.world_size, rank=args.rank)
    dist.barrier()
    setup_for_distributed(args.rank == 0)


def reduce_dict(input_dict: dict, average: bool = True) -> dict:
    """Reduce the values in the dictionary from all processes, so that all processes have the
    averaged results. Returns a dict with the same fields as input_dict, after reduction."""
    world_size = get_world_size()
    if world_size < 2:
        return input_dict
    with torch.no_grad():
        names = sorted(input_dict.keys())
        values = torch.stack([input_dict[k] for k in names], dim=0)
        dist.all_reduce(values)
        if average:
            values /= world_size
        return dict(zip(names, values))
