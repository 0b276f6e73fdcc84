"""The benchmark suite's runner (``benchmarks/run.py``): one short real run, and a bad option.

Serial tests; each starts its own ``mpiexec`` through ``launcher``, under a timeout.
"""

from __future__ import annotations

import json
from pathlib import Path

from launcher import run_mpi


def test_short_run_writes_table_json_and_plot(tmp_path: Path):
    calls = "all_reduce,broadcast,all_gather,scatter,send_recv,barrier,all_gather_object"
    proc = run_mpi(2, ["benchmarks/run.py", "--sizes", "8,64", "--rounds", "2", "--target", "0.0005",
                       "--calls", calls, "--impls", "mpidist,mpi4py,c", "--out", str(tmp_path),
                       "--name", "t"], timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "mpidist/mpi4py" in proc.stdout and "goals" in proc.stdout
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["meta"]["world_size"] == 2
    got = {(r["call"], r["bytes"], r["impl"]) for r in data["results"]}
    for call in calls.split(","):
        for nbytes in ([0] if call == "barrier" else [8, 64]):
            assert (call, nbytes, "mpidist") in got and (call, nbytes, "mpi4py") in got
            if call != "all_gather_object" and "c" not in data["meta"]["notes"]:
                assert (call, nbytes, "c") in got
    assert all(r["median"] > 0 and len(r["samples"]) == 2 for r in data["results"])
    assert all("mpidist/mpi4py" in row for row in data["ratios"])
    png = tmp_path / "t.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_option_is_refused(tmp_path: Path):
    proc = run_mpi(1, ["benchmarks/run.py", "--calls", "all_reduse", "--out", str(tmp_path)], timeout=120)
    assert proc.returncode != 0 and "all_reduse" in proc.stderr
