"""The flight recorder in a job of its own: turned on by ``MPIDIST_FLIGHT_RECORDER`` at
``init_process_group``, it must leave a ``SIGUSR1`` handler the program set before it working.

Serial tests; each starts its own ``mpiexec`` through ``launcher``, under a timeout.
"""

from __future__ import annotations

import json
import textwrap

from launcher import run_mpi

CHAINED = """
import os, signal, sys
import numpy as np

ran = []
signal.signal(signal.SIGUSR1, lambda signum, frame: ran.append(signum))  # as Lightning's requeue does

import mpidist as dist

dist.init_process_group("mpi")  # MPIDIST_FLIGHT_RECORDER: the recorder starts here
x = np.ones(2)
dist.all_reduce(x)
os.kill(os.getpid(), signal.SIGUSR1)
print("OWN HANDLER", ran == [signal.SIGUSR1], flush=True)
dist.destroy_process_group()
"""


def test_sigusr1_writes_the_record_and_runs_the_programs_own_handler(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(CHAINED))
    folder = tmp_path / "records"
    proc = run_mpi(1, [str(script)], timeout=120,
                   env={"MPIDIST_FLIGHT_RECORDER": "10", "MPIDIST_FLIGHT_DIR": str(folder)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OWN HANDLER True" in proc.stdout, proc.stdout
    record = json.loads((folder / "mpidist-flight-rank0.json").read_text())
    assert record["reason"] == "SIGUSR1"
    assert [c["call"] for c in record["calls"]][-1:] == ["all_reduce"]
