"""``python -m mpidist info``: the facts about this MPI installation that a bug report needs.

Run it as the job would run (``mpiexec -n 4 python -m mpidist info [--json]``): rank 0
prints the versions, the MPI library that mpi4py loaded, the thread level, CUDA
awareness, the launcher, how the ranks sit on its node's cores and which ranks landed on
which host.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from importlib import metadata
from typing import Any

import mpi4py
from mpi4py import MPI

from .. import gpu
from .._version import __version__
from ..core import faults, job
from . import heap, launcher, libmpi, spares, threads

#: Variables that choose the network MPI uses between nodes (reported when set).
NETWORK_VARS = ("MPIR_CVAR_CH4_NETMOD", "FI_PROVIDER", "FI_TCP_IFACE", "UCX_TLS", "UCX_NET_DEVICES",
                "OMPI_MCA_pml", "OMPI_MCA_btl", "OMPI_MCA_btl_tcp_if_include", "I_MPI_FABRICS",
                "I_MPI_OFI_PROVIDER", "I_MPI_HYDRA_IFACE")
#: The variables of :data:`NETWORK_VARS` that each library reads, for the line that says none is set.
NETWORK_VARS_OF = {"Intel MPI": ("I_MPI_FABRICS", "I_MPI_OFI_PROVIDER", "FI_PROVIDER"),
                   "MPICH": ("MPIR_CVAR_CH4_NETMOD", "FI_PROVIDER", "UCX_TLS"),
                   "Open MPI": ("OMPI_MCA_pml", "OMPI_MCA_btl", "UCX_TLS")}
#: How each library's own blocking waits give up a core that ranks share, where they spin by
#: default (mpidist's waits always do: :mod:`mpidist.core.waiting`). Intel MPI's spin, measured:
#: a waiting rank took three quarters of the core its peer computed on, and none with this.
YIELD_SETTINGS = {"Intel MPI": "I_MPI_THREAD_YIELD=3", "Open MPI": "OMPI_MCA_mpi_yield_when_idle=1"}

_THREAD_LEVELS = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
                  MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}


def cuda_aware() -> str:
    """``"yes"``, ``"no"`` or ``"unknown"``, as :func:`mpidist.gpu.cuda_aware` answers."""
    return gpu.cuda_aware()


def _gpu_path() -> str:
    """How device buffers travel (direct to a CUDA-aware MPI, or staged), from mpidist.gpu."""
    return gpu.describe()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def collect(comm: MPI.Intracomm | None = None) -> dict[str, Any]:
    """Everything ``info`` reports, as a dict (complete on rank 0 of ``comm``).

    Collective over ``comm`` (default ``MPI_COMM_WORLD``): ``MPI_Gather`` of the host
    names and ``MPI_Comm_split_type`` for the node layout.
    """
    comm = comm if comm is not None else job.world

    size = comm.Get_size()
    host = MPI.Get_processor_name()
    local_rank, local_size, node_rank, num_nodes = launcher.node_layout(comm)
    hosts = comm.gather(host, root=0)
    masks = threads.gather_masks(comm)
    vendor, vendor_version = MPI.get_vendor()
    problems = []
    try:
        launcher.check_not_singleton_trap("info")
    except RuntimeError as exc:
        problems.append(str(exc))
    out: dict[str, Any] = {
        "mpidist": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "mpi4py": mpi4py.__version__,
        "numpy": _version("numpy"),
        "torch": _version("torch"),
        "mpi_vendor": f"{vendor} {'.'.join(map(str, vendor_version))}",
        "mpi_standard": "{}.{}".format(*MPI.Get_version()),
        "mpi_library_version": MPI.Get_library_version().strip(),
        "mpi_library_path": libmpi.loaded_path(),
        "MPI4PY_LIBMPI": os.environ.get("MPI4PY_LIBMPI"),
        "MPI4PY_MPIABI": os.environ.get("MPI4PY_MPIABI"),
        "thread_level": _THREAD_LEVELS.get(MPI.Query_thread(), str(MPI.Query_thread())),
        "thread_level_requested": str(mpi4py.rc.thread_level),
        "cuda_aware": cuda_aware(),
        "gpu_path": _gpu_path(),
        "heap": heap.describe(),
        "launcher": launcher.detect_launcher(size),
        "network_env": {v: os.environ[v] for v in NETWORK_VARS if v in os.environ},
        "network_vars": list(NETWORK_VARS_OF.get(vendor, NETWORK_VARS)),
        "cores": _cores(masks, vendor),
        "survive_failure": faults.survival(),
        "world_size": size,
        "num_nodes": num_nodes,
        "hosts": None,
        "problems": problems,
    }
    if hosts is not None:
        by_host: dict[str, list[int]] = {}
        for r, h in enumerate(hosts):
            by_host.setdefault(h, []).append(r)
        out["hosts"] = by_host
    return out


def _cores(masks: list[frozenset[int]], vendor: str) -> str:
    """How rank 0's node's ranks sit on its cores (their real CPU masks), with the loaded
    library's setting for waits where they share one."""
    cores = len(frozenset().union(*masks))
    busiest = threads.busiest_core(masks, 1)
    text = (f"{len(masks)} rank(s) on {cores} core(s) of rank 0's node; load of the busiest core: "
            f"{float(busiest):g} rank(s)")
    if busiest > 1:
        text += ": ranks share cores"
        setting = YIELD_SETTINGS.get(vendor)
        var = setting.split("=")[0] if setting else None
        if var and var in os.environ:
            text += f" ({var}={os.environ[var]} is set)"
        elif setting:
            text += f" ({vendor}'s own blocking waits yield the core with {setting})"
    return text


def render(facts: dict[str, Any]) -> str:
    """The human-readable form of :func:`collect`'s dict."""
    lib_version = facts["mpi_library_version"].splitlines()
    rows = [
        ("mpidist", facts["mpidist"]),
        ("python", f"{facts['python']} ({facts['platform']})"),
        ("mpi4py", facts["mpi4py"]),
        ("numpy", facts["numpy"]),
        ("torch", facts["torch"] or "not installed"),
        ("MPI vendor", facts["mpi_vendor"]),
        ("MPI standard", facts["mpi_standard"]),
        ("MPI library", lib_version[0] if lib_version else "?"),
        ("MPI library path", facts["mpi_library_path"] or "unknown"),
        ("MPI4PY_LIBMPI", facts["MPI4PY_LIBMPI"] or "(unset)"),
        ("MPI4PY_MPIABI", facts["MPI4PY_MPIABI"] or "(unset)"),
        ("thread level", f"{facts['thread_level']} (requested {facts['thread_level_requested']})"),
        ("CUDA-aware MPI", facts["cuda_aware"]),
        ("GPU path", facts.get("gpu_path") or "unknown"),
        ("C heap limits", facts.get("heap") or "unknown"),
        ("launcher", facts["launcher"]),
        ("network", " ".join(f"{k}={v}" for k, v in facts.get("network_env", {}).items())
         or f"the MPI library's default (none of {', '.join(facts['network_vars'])} set)"),
        ("cores", facts["cores"]),
        ("survive a death", facts["survive_failure"]),
        ("world size", f"{facts['world_size']} on {facts['num_nodes']} node(s)"),
    ]
    lines = [f"{k + ':':<18} {v}" for k, v in rows]
    for h, ranks in (facts["hosts"] or {}).items():
        lines.append(f"{'host ' + h + ':':<18} {len(ranks)} rank(s): {_spans(ranks)}")
    lines += [f"{'MPI library info:':<18} {ln.strip()}" for ln in lib_version[1:] if ln.strip()]
    lines += [f"PROBLEM: {p}" for p in facts["problems"]]
    return "\n".join(lines)


def _spans(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``"0-2,5"``."""
    out, start = [], ranks[0]
    for a, b in zip(ranks, ranks[1:] + [None]):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ",".join(out)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m mpidist info [--json]``; rank 0 prints, once."""
    parser = argparse.ArgumentParser(prog="python -m mpidist info", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    spares.park()  # a spare waits here until called in or released (MPIDIST_SPARES)
    facts = collect()
    if job.world.Get_rank() == 0:
        sys.stdout.write((json.dumps(facts, indent=2) if args.json else render(facts)) + "\n")
        sys.stdout.flush()
    return 0

