"""A Lightning ``ClusterEnvironment`` from MPI: ranks, nodes and the rendezvous address.

Lightning picks its environment from variables: ``TorchElasticEnvironment`` (torchrun's),
then ``SLURMEnvironment``, then its own ``MPIEnvironment``. Inside an ``sbatch`` allocation
with ``mpiexec`` the Slurm variables describe mpiexec's launch step, not the ranks, so every
rank takes itself for rank 0 of 1; and neither environment checks ``devices`` against the
ranks MPI put on each node. :class:`MpidistEnvironment`, passed as ``plugins=[...]``, takes
everything from MPI and checks the Trainer's ``devices`` and ``num_nodes`` against MPI's
layout on every rank at once::

    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy
    import mpidist.torch  # noqa: F401  (registers the "mpidist" backend)
    from mpidist.integrations.lightning import MpidistEnvironment

    trainer = L.Trainer(accelerator="cpu", devices=2, num_nodes=1,   # ranks per node, nodes
                        strategy=DDPStrategy(process_group_backend="mpidist"),
                        plugins=[MpidistEnvironment()])

Requires the ``lightning`` package (``pip install 'mpidist[libraries]'``); imported here
only, so that mpidist runs without it.
"""

from __future__ import annotations

import logging

try:
    from lightning.fabric.plugins.environments import ClusterEnvironment
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("mpidist.integrations.lightning needs Lightning: pip install 'mpidist[libraries]' "
                      "(the `lightning` package)") from exc

from ..core import errors, job
from ..start import launcher
from ..torch import rendezvous

CALL = "MpidistEnvironment"
log = logging.getLogger(__name__)


def layout_problem(num_devices: int, num_nodes: int, ranks_per_node: list[int]) -> str | None:
    """Why ``Trainer(devices=num_devices, num_nodes=num_nodes)`` does not fit MPI's nodes, else ``None``.

    ``ranks_per_node`` is how many ranks MPI put on each node, in node order.
    """
    if num_nodes == len(ranks_per_node) and all(n == num_devices for n in ranks_per_node):
        return None
    have = (f"{sum(ranks_per_node)} rank(s) on {len(ranks_per_node)} node(s) "
            f"({', '.join(map(str, ranks_per_node))} per node)")
    if len(set(ranks_per_node)) == 1:
        fix = f"set devices={ranks_per_node[0]}, num_nodes={len(ranks_per_node)}"
    else:
        fix = ("Lightning needs the same number of ranks on every node: start them evenly "
               "(mpiexec -ppn K, srun --ntasks-per-node=K)")
    return (f"Trainer(devices={num_devices}, num_nodes={num_nodes}) asks for {num_devices} rank(s) on each "
            f"of {num_nodes} node(s), but MPI started {have}; {fix} (devices = ranks per node, num_nodes = "
            "nodes), or start the job with the layout the Trainer asks for")


class MpidistEnvironment(ClusterEnvironment):
    """Lightning's view of the job, from MPI: pass ``plugins=[MpidistEnvironment()]`` to the ``Trainer``.

    Construct it on every rank (collective over ``MPI_COMM_WORLD``:
    ``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`` for the node layout, ``MPI_Allgather`` of
    the ranks per node). Global rank and world size are MPI's; local rank and node rank
    come from the shared-memory split, never from launcher variables, so it is right under
    ``mpiexec``/``mpirun``, ``srun --mpi=pmi2`` and ``sbatch`` + ``mpiexec`` alike. Refuses
    the singleton trap.

    The first read of ``main_address`` or ``main_port`` (collective, on every rank:
    Lightning reads them just before ``init_process_group``) serves the store as ``mpidist.run``
    does (:func:`mpidist.torch.rendezvous.serve_env_store`): rank 0 starts it on one address
    (``127.0.0.1`` on one node) and ``TORCHELASTIC_USE_AGENT_STORE=True`` makes torch's
    ``env://`` rendezvous connect to it from every rank, so no rank starts torch's own server,
    which listens on every interface. A ``MASTER_PORT`` set by hand is kept, and torch's own
    server then runs.
    """

    def __init__(self) -> None:
        comm = job.world
        launcher.check_not_singleton_trap(CALL)
        self._comm = comm
        self._local_rank, self._local_size, self._node_rank, self._num_nodes = launcher.node_layout(comm)
        per_rank = comm.allgather((self._node_rank, self._local_size))
        self._ranks_per_node = [size for _, size in sorted(dict(per_rank).items())]
        self._address: tuple[str, int] | None = None

    @property
    def ranks_per_node(self) -> list[int]:
        """The number of ranks MPI put on each node, in node order (``devices`` must equal each)."""
        return list(self._ranks_per_node)

    @property
    def num_nodes(self) -> int:
        """The number of nodes the ranks are on (``MPI_COMM_TYPE_SHARED``), the Trainer's ``num_nodes``."""
        return self._num_nodes

    @property
    def creates_processes_externally(self) -> bool:
        """``True``: the MPI launcher started every rank."""
        return True

    def _rendezvous(self) -> tuple[str, int]:
        if self._address is None:  # collective: Lightning reads both on every rank, in the same order
            self._address = rendezvous.serve_env_store(call=CALL)
        return self._address

    @property
    def main_address(self) -> str:
        """The address of the store rank 0 serves (``127.0.0.1`` on one node), the same on every rank."""
        return self._rendezvous()[0]

    @property
    def main_port(self) -> int:
        """The port of the store rank 0 serves, the same on every rank."""
        return self._rendezvous()[1]

    @staticmethod
    def detect() -> bool:
        """``True`` in a job of several MPI ranks."""
        return job.world.Get_size() > 1

    def world_size(self) -> int:
        """MPI's world size."""
        return self._comm.Get_size()

    def set_world_size(self, size: int) -> None:
        """Ignored: MPI decides (a Trainer that disagrees is refused by :meth:`validate_settings`)."""
        log.debug("MpidistEnvironment.set_world_size(%s) ignored: MPI gives %s", size, self.world_size())

    def global_rank(self) -> int:
        """MPI's rank in ``MPI_COMM_WORLD``."""
        return self._comm.Get_rank()

    def set_global_rank(self, rank: int) -> None:
        """Ignored: MPI decides."""
        log.debug("MpidistEnvironment.set_global_rank(%s) ignored: MPI gives %s", rank, self.global_rank())

    def local_rank(self) -> int:
        """This rank's place on its node (``MPI_COMM_TYPE_SHARED``)."""
        return self._local_rank

    def node_rank(self) -> int:
        """This node's number, in order of the lowest rank on each node."""
        return self._node_rank

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Refuse a ``devices``/``num_nodes`` that does not match MPI's layout, on every rank at once.

        Collective over ``MPI_COMM_WORLD`` (``MPI_Allgather``): ``ValueError`` on every rank,
        naming the setting that fits, instead of a rank failing alone while the others wait
        in the rendezvous.
        """
        problem = layout_problem(num_devices, num_nodes, self._ranks_per_node)
        problems = self._comm.allgather(problem)
        first = next((p for p in problems if p is not None), None)
        if first is not None:
            raise errors.value_error(CALL, first)
