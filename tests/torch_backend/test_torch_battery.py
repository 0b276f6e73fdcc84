"""torch's own distributed test battery on the ``mpidist`` backend, held to gloo's skip rules.

The battery is ``DistributedTest._DistTestBase`` from the torch wheel, run by
:mod:`torch_battery` under ``mpiexec`` with ``BACKEND=gloo`` (gloo's decorators decide the
skips) and a fresh mpidist default group per test. torch's own skips stay as they are:
CUDA/NCCL-only tests, tests for other backends' names, world-size requirements. Every other
test must pass, except those listed below, each with its reason.

In the suite (a serial test that starts its own jobs) the battery runs in full at 3 ranks
and, at 2 ranks, the tests of the calls themselves on the default group (:data:`QUICK_AT_2`):
the subgroup, DDP, model-averaging and profiler tests exercise the same calls again, so one
size of them keeps the part within the suite's time budget. ``make test-torch`` (``MPIDIST_BATTERY=full``)
runs everything at both sizes.
"""

from __future__ import annotations

import os
import re

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")
pytest.importorskip("expecttest", reason="torch's test battery imports expecttest (pip install expecttest)")

from torch_battery import run  # noqa: E402

#: Tests that check a gloo-only name or API: they fail on any backend not called "gloo".
GLOO_ONLY = {
    "test_get_backend": "asserts dist.get_backend() == 'gloo'",
}
#: Tests not run, with why. Running them would only wait out a harness timeout.
NOT_RUN = {
    # torch.distributed.monitored_barrier raises ValueError("... only implemented for GLOO
    # backend") for every other backend, and ProcessGroup.monitored_barrier dispatches to gloo
    # only; the failing rank then leaves its peers in the harness's 10 s file barrier.
    # mpidist.monitored_barrier is mpidist's equivalent (tests/checks/test_monitor.py).
    "test_monitored_barrier_gloo": "gloo-only torch API (dist.monitored_barrier)",
    "test_monitored_barrier_gloo_rank_0_timeout": "gloo-only torch API (ProcessGroup.monitored_barrier)",
    "test_monitored_barrier_gloo_subgroup": "gloo-only torch API (dist.monitored_barrier)",
}
#: At 2 ranks in the suite: the tests of each call on the default group (collectives, p2p,
#: objects, sparse). Their subgroup, profiler and DDP variants run at 3 ranks, where the
#: battery's subgroup [1, 2] exists.
QUICK_AT_2 = re.compile(r"test_(?!.*(group|profiler|cuda))(all_|broadcast|reduce|gather|scatter|send_recv|"
                        r"isend|irecv|barrier|batch_isend|sparse)")


def _full() -> bool:
    return os.environ.get("MPIDIST_BATTERY", "quick") == "full"


@pytest.mark.parametrize("n", [2, 3])
def test_torch_battery_under_gloo_rules(n):
    names = None
    if n == 2 and not _full():
        names = _all_names()
        names = [t for t in names if QUICK_AT_2.match(t)]
    results = run(n, names, not_run=tuple(NOT_RUN), test_timeout=60)
    counts: dict[str, int] = {}
    for status, _, _ in results.values():
        counts[status] = counts.get(status, 0) + 1
    print(f"battery at {n} ranks: {counts}")
    assert counts.get("pass", 0) > 0, counts
    unexpected = {t: d for t, (s, d, _) in results.items() if s in ("fail", "hang") and t not in GLOO_ONLY}
    assert not unexpected, "\n\n".join(f"{t}:\n{d[-2500:]}" for t, d in sorted(unexpected.items()))
    for t in GLOO_ONLY:
        if t in results:  # a gloo-name check that passes means the list is out of date
            assert results[t][0] == "fail", f"{t} no longer fails ({results[t][0]}): drop it from GLOO_ONLY"
    for t in NOT_RUN:
        if t in results:
            assert results[t][0] in ("not-run", "skip"), (t, results[t])


def _all_names() -> list[str]:
    """The battery's test names, read from its source without importing torch's test harness."""
    import torch.testing._internal.distributed as pkg

    src = open(os.path.join(os.path.dirname(pkg.__file__), "distributed_test.py")).read()
    return sorted(set(re.findall(r"^        def (test_\w+)\(", src, re.MULTILINE)))
