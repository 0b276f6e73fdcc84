"""Shared-memory segments that killed MPI ranks leave in ``/dev/shm``, removed after their job.

A rank that exits normally unlinks its segments (MPICH's ``mpich_shm_*``, Open MPI's
``sm_segment.*``); one killed by a test (SIGKILL, ``os._exit``, ``MPI_Abort``) cannot. Each is
a few MiB of the machine's memory until reboot. So does every Open MPI 5.0.11 singleton (a
plain ``python`` that initialises MPI, such as pytest's own process), even when it finalizes.
The tests remove what their jobs left (and pytest's own process, a singleton, its own segment
as it ends: :func:`unlink_own`):
:func:`sweep` takes the segments that appeared since :func:`entries` was taken and that no
running process still maps.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

SHM = Path("/dev/shm")
#: The names MPICH's and Open MPI's shared-memory transports give their segments.
PREFIXES = ("mpich_shm_", "sm_segment.")


def entries() -> set[str]:
    """The MPI segments in ``/dev/shm`` now (empty where there is no ``/dev/shm``)."""
    try:
        return {n for n in os.listdir(SHM) if n.startswith(PREFIXES)}
    except OSError:
        return set()


def _maps(pid: str) -> set[str]:
    """Names under ``/dev/shm`` that process ``pid`` maps (empty where its maps cannot be read)."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return {ln.rsplit("/dev/shm/", 1)[1].split()[0] for ln in maps if "/dev/shm/" in ln}
    except (OSError, IndexError):
        return set()


def _mapped() -> set[str]:
    """Names under ``/dev/shm`` that a running process maps (readable ``/proc/*/maps`` only)."""
    found: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        found |= _maps(pid)
    return found


def sweep(before: set[str], linger: float = 3.0) -> list[str]:
    """Remove the segments that appeared since ``before`` and that no process maps; their names.

    A segment still mapped is given up to ``linger`` seconds: ranks of a ULFM job may still be
    exiting when its ``mpiexec`` returns.
    """
    gone: list[str] = []
    end = time.monotonic() + linger
    while True:
        new = entries() - before - set(gone)
        mapped = _mapped() & new if new else set()
        for name in sorted(new - mapped):
            try:
                (SHM / name).unlink()
                gone.append(name)
            except OSError:
                pass
        if not mapped or time.monotonic() > end:
            return gone
        time.sleep(0.2)


def unlink_own() -> list[str]:
    """Remove the MPI segments this process maps; their names. For an Open MPI singleton only
    (nothing else attaches to its segment, and its ``MPI_Finalize`` leaves it behind)."""
    gone = []
    for name in sorted(n for n in _maps("self") if n.startswith(PREFIXES)):
        try:
            (SHM / name).unlink()
            gone.append(name)
        except OSError:
            pass
    return gone


@contextmanager
def swept() -> Iterator[None]:
    """Around jobs that may kill ranks: :func:`sweep` what they left, however the block ends."""
    before = entries()
    try:
        yield
    finally:
        sweep(before)


def private_mount_reason() -> str | None:
    """Why a test cannot give its job a /dev/shm of its own (``unshare -m`` and a tmpfs mount);
    ``None`` where it can."""
    if not shutil.which("unshare"):
        return "no unshare command (util-linux)"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"unshare -m / mount of a tmpfs is not permitted: {probe.stderr.strip() or probe.returncode}"
    return None
