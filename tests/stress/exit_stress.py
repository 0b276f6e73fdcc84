"""Run the torch examples many times and count the runs that did not end cleanly.

Not a suite test (it takes long): ``python tests/stress/exit_stress.py --runs 200`` starts each
example under ``mpiexec -n 4`` in turn (the DETR-style script through ``init_distributed_mode``
and through ``python -m mpidist.run``, the torchrun-style script, ``train_torch.py``), with
``--load N`` busy processes beside them, and reports every run whose exit status is not 0 or
whose output holds an abort ("terminate called", "Aborted", a signal).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EX = ROOT / "examples"
CASES = {
    "detr-init": [str(EX / "detr_style" / "main.py"), "--dist-init", "mpidist", "--epochs", "1"],
    "detr-run": ["-m", "mpidist.run", str(EX / "detr_style" / "main.py"), "--epochs", "1"],
    "torchrun-style": ["-m", "mpidist.run", "--backend-for-cpu", "mpidist", str(EX / "torchrun_style.py"),
                       "--epochs", "1"],
    "train-torch": [str(EX / "train_torch.py"), "--epochs", "1"],
}
BAD = re.compile(r"terminate called|Aborted|core dumped|Segmentation fault|signal \d+|MPI_ABORT")


def burn(stop: float) -> None:
    x = 0
    while time.monotonic() < stop:
        x += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--load", type=int, default=2, help="busy processes beside the jobs")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("-n", type=int, default=4)
    args = ap.parse_args()
    names = args.cases.split(",")
    stop = time.monotonic() + 24 * 3600
    burners = [multiprocessing.Process(target=burn, args=(stop,), daemon=True) for _ in range(args.load)]
    for b in burners:
        b.start()
    bad: list[tuple[int, str, int, str]] = []
    t0 = time.monotonic()
    try:
        for i in range(args.runs):
            name = names[i % len(names)]
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [str(BIN / "mpiexec"), "-n", str(args.n), sys.executable, *CASES[name]]
                if name.startswith("detr"):
                    cmd += ["--output_dir", tmp]
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
            out = r.stdout + r.stderr
            if r.returncode != 0 or BAD.search(out):
                found = BAD.search(out)
                bad.append((i, name, r.returncode, found.group(0) if found else out[-300:]))
                print(f"run {i} ({name}): exit {r.returncode}: {bad[-1][3]}", flush=True)
            elif (i + 1) % 10 == 0:
                print(f"{i + 1} runs, {len(bad)} bad, {time.monotonic() - t0:.0f} s", flush=True)
    finally:
        for b in burners:
            b.terminate()
    print(f"{args.runs} runs ({', '.join(names)}; {args.load} busy processes beside): {len(bad)} bad")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
