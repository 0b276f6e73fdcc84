"""Instructions per call of the cross-rank checks, counted by callgrind (immune to a loaded machine).

Runs itself under ``valgrind --tool=callgrind`` as an MPI singleton whose group claims two
ranks (``_size = 2``), so that every collective takes the path of a real group (the default
check's recording, its sampled ``MPI_Iallreduce``, DETAIL's exchange) while MPI moves the data
locally; the difference between runs of ``-n`` and ``2n`` calls, over ``n``, is the cost of one
call, in instructions::

    python benchmarks/check_instructions.py [-n 2000] [--bytes 8]
    PYTHONPATH=/tmp/old python benchmarks/check_instructions.py --modes OFF,DETAIL   # an older mpidist

Prints instructions per ``all_reduce`` for ``MPIDIST_DEBUG=OFF``, the default check and DETAIL,
and each one's ratio to OFF. The wire's latency is not in it: see ``debug_overhead.py``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile


def child(mode: str, n: int, nbytes: int) -> None:
    import logging

    import numpy as np

    import mpidist as dist
    from mpidist.checks import debug

    try:
        from mpidist.checks import signature
    except ImportError:  # an mpidist from before the default check (PYTHONPATH=...)
        signature = None

    dist.init_process_group("mpi", abort_on_error=False)
    logging.getLogger("mpidist").disabled = True
    g = dist.new_group([0])
    g._size = 2  # the path of a real group; MPI still runs on one rank
    debug.set_debug_level("DETAIL" if mode == "DETAIL" else "OFF")
    if signature is not None:
        signature.enable(mode != "OFF")
    x = np.ones(max(nbytes // 4, 1), np.float32)
    for _ in range(n):
        dist.all_reduce(x, group=g)


def count(mode: str, n: int, nbytes: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__,
               "--child", mode, "-n", str(n), "--bytes", str(nbytes)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        m = re.search(r"Collected : (\d+)", proc.stderr)
        return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--child", default=None)
    ap.add_argument("--modes", default="OFF,default,DETAIL")
    a = ap.parse_args()
    if a.child:
        child(a.child, a.n, a.bytes)
        return
    per = {}
    for mode in a.modes.split(","):
        per[mode] = (count(mode, 2 * a.n, a.bytes) - count(mode, a.n, a.bytes)) / a.n
    print(f"instructions per all_reduce of {a.bytes} B (callgrind, {a.n} calls):")
    off = per.get("OFF")
    for mode, ins in per.items():
        against = f"  x{ins / off:.3f} of OFF  (+{ins - off:.0f})" if off else ""
        print(f"  {mode:8s} {ins:10.0f}{against}")


if __name__ == "__main__":
    main()
