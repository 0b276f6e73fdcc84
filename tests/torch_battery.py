"""Run torch's own distributed test battery on the ``mpidist`` backend, under ``mpiexec``.

The battery is ``torch.testing._internal.distributed.distributed_test.DistributedTest._DistTestBase``
(shipped in the torch wheel). torch runs it by spawning one process per rank for each test
(``TestDistBackend``); here the ranks are the MPI job's, and every test gets a fresh default
process group, as under torch's harness: ``init_process_group("mpidist")``, the file barrier,
the test method, the file barrier, ``destroy_process_group``.

Skip rules are gloo's: ``BACKEND=gloo`` is in the environment when the battery is imported, so
its decorators (``skip_but_pass_in_sandcastle_if(BACKEND != "gloo", ...)``,
``require_backend_is_available``, ``DistTestCases.skip_collective``) decide as for a gloo run;
the process group itself is mpidist's. A test that leaves by ``sys.exit`` with one of torch's
``TEST_SKIPS`` codes (no CUDA, small world size...) is a skip, as under torch's harness.

Each rank appends one JSON line per event to ``<results>/rank<N>.jsonl``: ``{"test", "status":
"start"}`` before a test, then ``{"test", "status": "pass"|"fail"|"skip", "detail"}``. A test
that runs past ``--test-timeout`` seconds on a rank is recorded as ``"hang"`` and that rank exits
(ending the job); :mod:`test_torch_battery` restarts the job with the tests left.

Usage: ``mpiexec -n N python tests/torch_battery.py --results DIR [TEST_NAME ...]``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import tempfile
import threading
import time
import traceback
import unittest
from datetime import timedelta
from pathlib import Path
from typing import Any


def _prepare_environment() -> None:
    """What torch's harness sets before the battery is imported: gloo's rules, world size, temp dirs."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    os.environ["BACKEND"] = "gloo"  # the skip rules; the process group is mpidist's
    os.environ["WORLD_SIZE"] = str(comm.Get_size())
    os.environ.setdefault("INIT_METHOD", "env://")
    os.environ.setdefault("MPIDIST_ABORT_ON_ERROR", "0")
    temp = None
    if comm.Get_rank() == 0:
        temp = tempfile.mkdtemp(prefix="mpidist-battery-")
        for sub in ("barrier", "test_dir", "init_dir"):
            os.mkdir(os.path.join(temp, sub))
    os.environ["TEMP_DIR"] = comm.bcast(temp, 0)


_sync: list = []


def _new_sync_comm() -> None:
    from mpi4py import MPI

    _sync[:] = [MPI.COMM_WORLD.Dup()]  # the old one may hold a barrier a failed test left


def _sync_barrier(timeout: float) -> None:
    """The harness's barrier: ``MPI_Ibarrier`` polled with short sleeps, ``RuntimeError`` past ``timeout``."""
    req = _sync[0].Ibarrier()
    deadline = time.monotonic() + timeout
    pause = 1e-4
    while not req.Test():
        if time.monotonic() > deadline:
            raise RuntimeError("barrier timeout")
        time.sleep(pause)
        pause = min(2 * pause, 0.01)


class _Record:
    def __init__(self, path: str) -> None:
        self._f = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the run

    def __call__(self, test: str, status: str, detail: str = "", seconds: float = 0.0) -> None:
        self._f.write(json.dumps({"test": test, "status": status, "detail": detail,
                                  "seconds": round(seconds, 3)}) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())


def _watchdog(record: _Record, limit: float) -> tuple[threading.Event, list]:
    """A thread that records ``hang`` and ends the process when a test runs past ``limit``."""
    from mpi4py import MPI

    current: list = [None, 0.0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(1.0):
            name, since = current
            if name is not None and time.monotonic() - since > limit:
                record(name, "hang", f"still running after {limit:.0f} s on rank {MPI.COMM_WORLD.Get_rank()}")
                sys.stderr.write(f"torch_battery: {name} hangs on rank {MPI.COMM_WORLD.Get_rank()}; "
                                 "ending the job. Where each thread is:\n")
                faulthandler.dump_traceback(all_threads=True)
                sys.stderr.flush()
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="battery-watchdog").start()
    return stop, current


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--test-timeout", type=float, default=90.0)
    ap.add_argument("--after", help="run only the tests that sort after this one")
    ap.add_argument("--not-run", action="append", default=[], help="record this test as not run")
    ap.add_argument("tests", nargs="*")
    a = ap.parse_args()
    _prepare_environment()
    import torch
    import torch.distributed as dist
    from mpi4py import MPI
    from torch.testing._internal import common_utils
    from torch.testing._internal.common_distributed import TEST_SKIPS
    from torch.testing._internal.distributed import distributed_test as dt

    import mpidist.torch  # noqa: F401  (registers the backend)

    torch.set_num_threads(1)
    skip_codes = {s.exit_code: s.message for s in TEST_SKIPS.values()}
    rank = MPI.COMM_WORLD.Get_rank()

    class Battery(dt.DistributedTest._DistTestBase, common_utils.TestCase):
        skip_return_code_checks: list = []

        @property
        def world_size(self) -> str:  # torch's harness gives it as the variable's text
            return os.environ["WORLD_SIZE"]

        @property
        def init_method(self) -> str:
            return os.environ["INIT_METHOD"]

        @property
        def destroy_pg_upon_exit(self) -> bool:
            return False

        def _barrier(self, wait_for: Any = None, timeout: float = 10) -> None:
            # torch's harness barrier (files polled every 0.1 s) as MPI_Ibarrier on a
            # communicator of the harness's own, with the same 10 s limit
            _sync_barrier(timeout)

    names = a.tests or sorted(n for n in dir(Battery) if n.startswith("test_"))
    if a.after:
        names = [n for n in names if n > a.after]
    record = _Record(os.path.join(a.results, f"rank{rank}.jsonl"))
    stop, current = _watchdog(record, a.test_timeout)
    for name in names:
        method = getattr(Battery, name)
        if getattr(method, "__unittest_skip__", False):
            record(name, "skip", str(getattr(method, "__unittest_skip_why__", "")))
            continue
        if name in a.not_run:
            record(name, "not-run")
            continue
        record(name, "start")
        current[:] = [name, time.monotonic()]
        # torch's harness starts each test in new processes: a barrier left unmatched by a
        # failed test must not pair with this one's, so each test syncs on a new communicator
        _new_sync_comm()
        case = Battery(name)
        case.rank = rank
        case.file_name = os.path.join(os.environ["TEMP_DIR"], "init_dir", "shared_init_file")
        status, detail = "pass", ""
        try:
            timeout = timedelta(seconds=dt.CUSTOM_PG_TIMEOUT.get(name, dt.default_pg_timeout))
            dist.init_process_group("mpidist", timeout=timeout)
            case._barrier()
            common_utils.set_rng_seed()
            getattr(case, name)()
            case._barrier()
        except unittest.SkipTest as exc:
            status, detail = "skip", str(exc)
        except SystemExit as exc:
            if exc.code in skip_codes:
                status, detail = "skip", skip_codes[exc.code]
            else:
                status, detail = "fail", f"sys.exit({exc.code!r})"
        except BaseException:  # noqa: BLE001 - every failure is a result to report
            status, detail = "fail", traceback.format_exc()
        finally:
            if dist.is_initialized():
                try:
                    dist.destroy_process_group()
                except Exception:  # noqa: BLE001
                    detail += "\n(destroy_process_group failed: " + traceback.format_exc() + ")"
        record(name, status, detail, time.monotonic() - current[1])
        current[:] = [None, 0.0]
    stop.set()
    MPI.COMM_WORLD.Barrier()
    return 0


# ---- the parent side: start the job, restart it after a hang, merge the ranks' records ----

def _merge(records: list[list[dict]]) -> dict[str, tuple[str, str, float]]:
    """One outcome per test over all ranks: fail/hang on any rank wins, then skip, then pass."""
    by_test: dict[str, list[tuple[str, str, float]]] = {}
    for rank, events in enumerate(records):
        for e in events:
            if e["status"] != "start":
                by_test.setdefault(e["test"], []).append(
                    (e["status"], f"rank {rank}: {e['detail']}", e.get("seconds", 0.0)))
    out = {}
    for name, results in by_test.items():
        statuses = {s for s, _, _ in results}
        seconds = max(t for _, _, t in results)
        for status in ("hang", "fail", "not-run", "skip", "pass"):
            if status in statuses:
                details = [d for s, d, _ in results if s == status]
                detail = "\n".join(details) if status in ("hang", "fail") else details[0]
                out[name] = (status, detail, seconds)
                break
    return out


def run(n: int, tests: list[str] | None = None, not_run: tuple[str, ...] = (), test_timeout: float = 60,
        job_timeout: float = 900) -> dict[str, tuple[str, str, float]]:
    """The battery at ``n`` ranks: ``{test: (status, detail, seconds)}``; status pass/fail/hang/skip/not-run.

    A hang ends the job (see :func:`_watchdog`); the job is started again with the tests
    after the one that hung, until every test has an outcome.
    """
    from launcher import run_mpi

    results: dict[str, tuple[str, str, float]] = {}
    after = None
    while True:
        with tempfile.TemporaryDirectory(prefix="mpidist-battery-results-") as tmp:
            args = [str(Path(__file__).resolve()), "--results", tmp, "--test-timeout", str(test_timeout)]
            args += [x for name in not_run for x in ("--not-run", name)]
            args += ["--after", after] if after else []
            proc = run_mpi(n, args + list(tests or []), timeout=job_timeout,
                           env={"MPIDIST_ABORT_ON_ERROR": "0", "PYTHONWARNINGS": "ignore"})
            records = []
            for rank in range(n):
                path = Path(tmp) / f"rank{rank}.jsonl"
                lines = path.read_text().splitlines() if path.exists() else []
                records.append([json.loads(line) for line in lines])
        merged = _merge(records)
        results.update(merged)
        hung = sorted(t for t, (s, _, _) in merged.items() if s == "hang")
        started = {e["test"] for events in records for e in events if e["status"] == "start"}
        unfinished = sorted(started - set(merged))
        if proc.returncode == 0 and not hung and not unfinished:
            return results
        last = (hung or unfinished or [None])[-1]
        if last is None:
            raise RuntimeError(f"battery job at {n} ranks failed before any test (rc {proc.returncode}):\n"
                               f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        for t in unfinished:
            results.setdefault(t, ("hang", f"no outcome: the job ended in it (rc {proc.returncode})\n"
                                          f"{proc.stderr[-3000:]}", 0.0))
        if tests:
            tests = [t for t in tests if t > last]
            if not tests:
                return results
        after = last


def _main_parent(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="run the battery at N ranks and print the outcome")
    ap.add_argument("--np", type=int, required=True)
    ap.add_argument("--test-timeout", type=float, default=60)
    ap.add_argument("--not-run", action="append", default=[])
    ap.add_argument("tests", nargs="*")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    t0 = time.monotonic()
    res = run(a.np, a.tests, tuple(a.not_run), a.test_timeout)
    counts: dict[str, int] = {}
    for name, (status, detail, _) in sorted(res.items()):
        counts[status] = counts.get(status, 0) + 1
        if status in ("fail", "hang"):
            print(f"--- {status.upper()}: {name}\n{detail[-1500:]}")
    slow = sorted(res.items(), key=lambda kv: -kv[1][2])[:25]
    print("slowest: " + ", ".join(f"{k} {v[2]:.1f} s" for k, v in slow))
    print(f"battery at {a.np} ranks: {counts} in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__" and "--np" in sys.argv:
    sys.exit(_main_parent(sys.argv[1:]))
elif __name__ == "__main__":
    sys.exit(main())
