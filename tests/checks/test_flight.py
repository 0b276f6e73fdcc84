"""The flight recorder: every rank's last calls, written on a timeout or SIGUSR1, merged into a report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from helpers import gathered

from mpidist import flight as flight_report
from mpidist.checks import flight


@pytest.fixture
def recording(dist, monkeypatch):
    where = [tempfile.mkdtemp(prefix="mpidist-flight-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(where, src=0)
    monkeypatch.setenv(flight.ENV_DIR, where[0])
    flight.enable(50)
    yield Path(where[0])
    flight.enable(0)


@pytest.mark.mpi(min_size=2)
def test_a_timeout_writes_every_rank_and_the_report_names_the_late_rank(dist, rank, size, recording):
    g = dist.new_group(timeout=timedelta(seconds=1))
    late = size - 1
    t = np.ones(3, np.float32)
    dist.all_reduce(t, group=g)
    dist.broadcast(t, src=0, group=g)
    if rank != late:
        with pytest.raises(dist.GroupTimeoutError):
            dist.all_reduce(t, group=g)  # the late rank never comes: the timeout writes the record
    else:
        os.kill(os.getpid(), signal.SIGUSR1)  # how a user asks a live rank for its record
    dist.barrier()
    mine = json.loads((recording / f"mpidist-flight-rank{rank}.json").read_text())
    assert mine["reason"].startswith("SIGUSR1" if rank == late else "timeout: all_reduce #3")
    on_g = [c for c in mine["calls"] if c.get("group") == g.group_name]
    want = ["all_reduce", "broadcast"] + (["all_reduce"] if rank != late else [])
    assert [c["call"] for c in on_g] == want
    assert [c["seq"] for c in on_g] == list(range(1, len(want) + 1))
    assert on_g[0]["args"]["tensor"] == "float32 (3,)" and on_g[0]["state"] == "completed"
    if rank != late:
        assert on_g[-1]["state"] == "started"  # written at the timeout, while the call still waited
    report = flight_report.merge(sorted(recording.glob("mpidist-flight-rank*.json"))) if rank == 0 else None
    report = gathered(dist, report)[0]
    assert f"group {g.group_name!r}" in report
    assert f"rank {late}: last broadcast #2 completed" in report
    assert f"stopped first: rank(s) [{late}] (last call #2" in report, report
    assert "not completed: rank(s) [" + ", ".join(map(str, range(late))) + "]" in report


def test_merge_names_the_rank_that_diverged(tmp_path):
    def write(rank, calls):
        (tmp_path / f"mpidist-flight-rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "reason": "SIGUSR1", "calls": [
                {"call": c, "group": "g", "ranks": [0, 1, 2], "seq": i + 1, "state": "completed"}
                for i, c in enumerate(calls)]}))
    write(0, ["all_reduce", "broadcast", "all_reduce"])
    write(1, ["all_reduce", "broadcast", "all_reduce"])
    write(2, ["all_reduce", "all_gather"])
    report = flight_report.merge(sorted(tmp_path.glob("*.json")))
    assert "diverged at #2: rank 0 broadcast, rank 1 broadcast, rank 2 all_gather" in report
    assert "stopped first: rank(s) [2] (last call #2" in report
    # the command the README gives prints the same report
    cmd = subprocess.run([sys.executable, "-m", "mpidist.flight", str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert cmd.returncode == 0 and cmd.stdout.strip() == report, cmd.stderr
    empty = subprocess.run([sys.executable, "-m", "mpidist.flight", str(tmp_path / "none")],
                           capture_output=True, text=True, timeout=60)
    assert empty.returncode == 1 and "no mpidist-flight-rank*.json" in empty.stderr


def test_off_by_default_costs_nothing(dist):
    from mpidist.core import registry

    assert not flight.enabled()
    assert registry.hook() is None or dist.get_debug_level() != dist.DebugLevel.OFF
