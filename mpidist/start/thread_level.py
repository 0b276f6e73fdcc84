"""The MPI thread level, chosen before ``mpi4py.MPI`` initialises MPI.

``MPIDIST_THREAD_LEVEL=single|funneled|serialized|multiple`` sets it; the default is
mpi4py's (``multiple``). Measured here (benchmarks/): ``single`` halves MPICH's
small-message latency when every rank has a core of its own, but with more ranks
than cores it is catastrophically slower, and ``multiple`` is also faster for
messages of 1 MiB and more, so ``multiple`` stays the default.
"""

from __future__ import annotations

import sys
import warnings

from ..core import settings

LEVELS = settings.SETTINGS["MPIDIST_THREAD_LEVEL"].choices


def _configure() -> None:
    level = settings.choice("MPIDIST_THREAD_LEVEL")
    if level is None:
        return
    if "mpi4py.MPI" in sys.modules:
        warnings.warn(
            f"MPIDIST_THREAD_LEVEL={level} has no effect: mpi4py.MPI was imported before mpidist",
            RuntimeWarning, stacklevel=3,
        )
        return
    import mpi4py

    mpi4py.rc.thread_level = level


_configure()
