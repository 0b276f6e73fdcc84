"""mpidist: the torch.distributed programming model on MPI.

``import mpidist as dist`` and a program written for torch.distributed runs under
``mpiexec -n N`` with numpy arrays or torch CPU tensors as buffers.
"""

from __future__ import annotations

# isort: off
from .start import startup as _startup  # first: it bounds MPI_Init, which the next import runs
from .start import finalize as _finalize  # noqa: F401  (under ULFM: set before mpi4py.MPI loads)
from .start import mpi_library as _mpi_library  # noqa: F401  (loads mpi4py.MPI, or says why it cannot)
from .start import thread_level as _thread_level  # noqa: F401  (must run before mpi4py.MPI loads)
# isort: on
from ._version import __version__  # noqa: F401  (mpidist.__version__)
from .calls.collectives import (
    all_reduce,
    barrier,
    broadcast,
    reduce,
    reduce_scatter,
    reduce_scatter_single,
    reduce_scatter_tensor,
)
from .calls.exchange import (
    all_gather,
    all_gather_into_tensor,
    all_gather_single,
    all_to_all,
    all_to_all_single,
    gather,
    scatter,
)
from .calls.objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from .calls.ops import ReduceOp, make_premul_sum, reduce_op, supports_complex
from .calls.p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
from .checks.debug import DebugLevel, get_debug_level, set_debug_level, set_debug_level_from_env
from .checks.monitor import monitored_barrier
from .core.concurrency import ConcurrentCallError
from .core.faults import ProcessFailureError
from .core.groups import (
    GroupMember,
    ProcessGroup,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    group,
)
from .core.job import is_newcomer
from .core.subgroups import new_group, new_subgroups, new_subgroups_by_enumeration, split_group
from .core.timeouts import GroupTimeoutError
from .core.topology import (
    new_local_rank_group,
    new_node_group,
    new_subgroups_by_local_rank,
    new_subgroups_by_node,
    node_mesh,
    node_ranks,
)
from .core.work import Future, Work
from .start import spares as _spares
from .start.heal import heal_group, spares_left
from .start.shrink import SHRINK_ABORT, SHRINK_DEFAULT, shrink_group
from .start.world import (
    Backend,
    default_pg_timeout,
    destroy_process_group,
    get_backend,
    get_backend_config,
    get_default_backend_for_device,
    get_node_local_rank,
    get_pg_count,
    get_rank,
    get_world_size,
    init_process,
    init_process_group,
    is_available,
    is_backend_available,
    is_gloo_available,
    is_initialized,
    is_mpi_available,
    is_nccl_available,
    is_torchelastic_launched,
    is_ucc_available,
    is_xccl_available,
)
from .training.distributed_mode import DistInfo, init_distributed_mode
from .training.gradients import average_gradients
from .training.sampler import DistributedSampler

_make_nccl_premul_sum = make_premul_sum
_startup.disarm()  # MPI_Init has returned
_spares.set_aside()  # MPIDIST_SPARES=k: the last k processes wait here until called in


__all__ = [
    "DistInfo", "DistributedSampler", "average_gradients", "init_distributed_mode",
    "DebugLevel", "get_debug_level", "monitored_barrier", "set_debug_level", "set_debug_level_from_env",
    "Backend", "ConcurrentCallError", "Future", "GroupMember", "GroupTimeoutError", "ProcessFailureError",
    "SHRINK_ABORT", "SHRINK_DEFAULT", "shrink_group", "heal_group", "spares_left", "is_newcomer",
    "P2POp", "ProcessGroup", "ReduceOp", "Work",
    "all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce", "all_to_all",
    "all_to_all_single", "barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list",
    "default_pg_timeout", "destroy_process_group", "gather", "gather_object", "get_backend",
    "get_global_rank", "get_group_rank", "get_process_group_ranks", "get_rank", "get_world_size",
    "group", "init_process", "init_process_group", "irecv", "is_available", "is_gloo_available",
    "is_initialized", "is_mpi_available", "is_nccl_available", "is_torchelastic_launched", "isend",
    "make_premul_sum", "new_group", "new_subgroups", "new_subgroups_by_enumeration", "recv",
    "recv_object_list", "reduce", "reduce_op", "reduce_scatter", "reduce_scatter_tensor",
    "scatter", "scatter_object_list", "send", "send_object_list", "split_group",
    "new_local_rank_group", "new_node_group", "new_subgroups_by_local_rank", "new_subgroups_by_node",
    "node_mesh", "node_ranks",
    "all_gather_single", "reduce_scatter_single", "supports_complex", "get_backend_config",
    "get_default_backend_for_device", "get_node_local_rank", "get_pg_count", "is_backend_available",
    "is_ucc_available", "is_xccl_available",
]
