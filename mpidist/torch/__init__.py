"""``import mpidist.torch``: a torch.distributed backend named ``"mpidist"`` on mpidist.

PyTorch's wheels have no MPI backend. After this import, plain torch code runs on MPI::

    import torch.distributed as dist
    import mpidist.torch  # noqa: F401  (registers the backend)

    dist.init_process_group("mpidist")   # under mpiexec: rank, size and store come from MPI
    model = torch.nn.parallel.DistributedDataParallel(model)

Every collective, object collective, subgroup, DeviceMesh and DDP goes through mpidist's
collectives (MPI via mpi4py). The import also lets ``env://`` rendezvous take rank, world
size and the store address from MPI when ``MASTER_ADDR``/``MASTER_PORT`` are not set.

Code (or a library) that insists on ``"gloo"``: call :func:`use_for_cpu` first, and its
CPU groups run on ``"mpidist"``.

Imports: torch, and every mpidist layer below (:mod:`mpidist.start`, :mod:`mpidist.calls`,
:mod:`mpidist.checks`, :mod:`mpidist.core`).
"""

from __future__ import annotations

try:
    import torch.distributed as _tdist
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "mpidist.torch needs PyTorch 2.13 or later: pip install 'mpidist[torch]'"
    ) from exc

from . import rendezvous, shrinking
from .backend import NAME, MpidistProcessGroup, create
from .healing import heal
from .start import use_for_cpu
from .work import Work

__all__ = ["NAME", "MpidistProcessGroup", "Work", "heal", "register", "use_for_cpu"]


def register() -> None:
    """Register the ``"mpidist"`` backend with torch.distributed (idempotent; done on import)."""
    if NAME.upper() not in _tdist.Backend._plugins:
        _tdist.Backend.register_backend(NAME, create, extended_api=True, devices=["cpu"])
    shrinking.install()
    rendezvous.install()


register()
