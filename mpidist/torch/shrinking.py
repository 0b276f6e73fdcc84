"""``torch.distributed.shrink_group`` on the ``"mpidist"`` backend.

torch 2.13 implements ``shrink_group`` for backends registered per device (NCCL): it asks the
group for its device backend (``_get_backend``), calls the backend's ``shrink`` and wraps the
result in a new ``ProcessGroup`` over a clone of the group's store. mpidist's group is a
``ProcessGroup`` of its own (torch's Python process-group path), which has no per-device
backend, and a clone of the store would reach rank 0's ``TCPStore``, gone when rank 0 died.
:func:`install` lets torch's two steps take mpidist's group as it is: the group is its own
backend (:meth:`~mpidist.torch.backend.MpidistProcessGroup.shrink`), and the group ``shrink``
returns is the new process group, named as torch names it. Everything else of torch's
``shrink_group`` (the checks, destroying the other groups, the new default group) runs as written.
"""

from __future__ import annotations

from typing import Any

import torch.distributed.distributed_c10d as c10d

from .backend import MpidistProcessGroup


def install() -> None:
    """Wrap torch's backend lookup and group construction of ``shrink_group`` (idempotent)."""
    if getattr(c10d._validate_shrink_backend_requirements, "_mpidist", False):
        return
    lookup, build = c10d._validate_shrink_backend_requirements, c10d._create_shrunk_process_group

    def backend_of(group_info: dict) -> Any:
        pg = group_info["process_group"]
        return pg if isinstance(pg, MpidistProcessGroup) else lookup(group_info)

    def new_group(new_backend: Any, remaining_ranks: list[int], metadata: dict,
                  is_default_group: bool) -> Any:
        if not isinstance(new_backend, MpidistProcessGroup):
            return build(new_backend, remaining_ranks, metadata, is_default_group)
        new_backend.setGroupName(metadata["new_group_name"])
        new_backend.setGroupDesc("default:shrunken" if is_default_group
                                 else f"{metadata['original_group_name']}:shrunk")
        return new_backend

    backend_of._mpidist = new_group._mpidist = True  # type: ignore[attr-defined]
    c10d._validate_shrink_backend_requirements = backend_of
    c10d._create_shrunk_process_group = new_group
