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
    assert f"stopped first: rank {late} (last call #2" in report, report
    stuck = "rank 0" if late == 1 else f"ranks 0–{late - 1}"  # runs of ranks read as ranges
    assert f"not completed: {stuck}" in report, report


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
    assert "diverged at #2: ranks 0–1 broadcast, rank 2 all_gather" in report
    assert "stopped first: rank 2 (last call #2" in report
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


# ---------------------------------------------------------------- files and the signal, in this process

@pytest.fixture
def flight_dir(tmp_path, monkeypatch):
    """A record folder of this test's own; the recorder is stopped again afterwards."""
    folder = tmp_path / "flight"
    folder.mkdir()
    monkeypatch.setenv(flight.ENV_DIR, str(folder))
    yield folder
    flight.enable(0)


def test_a_planted_link_is_never_written_through(tmp_path, flight_dir):
    from mpidist.core import errors

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victims = {name: elsewhere / name for name in ("via-tmp", "via-json")}
    for victim in victims.values():
        victim.write_text("precious")
    final = flight_dir / f"mpidist-flight-rank{errors.WORLD_RANK}.json"
    old_tmp = final.with_suffix(".tmp")  # the fixed name the recorder once wrote first
    old_tmp.symlink_to(victims["via-tmp"])
    final.symlink_to(victims["via-json"])
    flight.enable(5)
    assert flight.dump("test") == final
    assert all(v.read_text() == "precious" for v in victims.values())
    assert old_tmp.is_symlink()  # left alone, and not followed
    assert final.is_file() and not final.is_symlink()  # the link itself was replaced
    assert json.loads(final.read_text())["reason"] == "test"
    assert final.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in flight_dir.iterdir()) == sorted([final.name, old_tmp.name])  # no temp left
    flight.dump("again")  # over its own earlier file
    assert json.loads(final.read_text())["reason"] == "again"


def test_sigusr1_chains_to_the_earlier_handler_and_stopping_restores_it(flight_dir):
    from mpidist.core import errors

    seen = []

    def mine(signum, frame):
        seen.append(signum)

    before = signal.signal(signal.SIGUSR1, mine)
    try:
        flight.enable(5)
        flight.enable(5)  # enabled twice: still one record per signal, and `mine` once
        os.kill(os.getpid(), signal.SIGUSR1)
        assert seen == [signal.SIGUSR1]
        record = json.loads((flight_dir / f"mpidist-flight-rank{errors.WORLD_RANK}.json").read_text())
        assert record["reason"] == "SIGUSR1"
        flight.enable(0)
        assert signal.getsignal(signal.SIGUSR1) is mine
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_sigusr1_with_the_default_action_writes_the_record_and_does_not_end_the_process(flight_dir):
    from mpidist.core import errors

    before = signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    try:
        flight.enable(5)
        os.kill(os.getpid(), signal.SIGUSR1)  # SIG_DFL would terminate: the recorder does not pass it on
        assert (flight_dir / f"mpidist-flight-rank{errors.WORLD_RANK}.json").is_file()
        flight.enable(0)
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR1, before)
