"""The suite runner's report: failing tests and hung ones are named at the end of the log.

CI shows only the log's tail, so ``run_suite.py`` repeats there what it found in a run's output.
These run a real pytest in a subprocess and read its output back the way the runner does.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_suite  # noqa: E402


def _pytest(tmp_path: Path, body: str, *args: str) -> str:
    (tmp_path / "test_case.py").write_text(textwrap.dedent(body))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-ra",
                           *args, str(tmp_path / "test_case.py")], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    return proc.stdout + proc.stderr


def test_a_test_past_the_hang_limit_is_named_with_the_call_it_sits_in(tmp_path):
    out = _pytest(tmp_path, """
        import time

        def wait_for_peer():
            time.sleep(3)

        def test_stuck():
            wait_for_peer()

        def test_fine():
            pass
    """, "-o", "faulthandler_timeout=1")
    where = run_suite.hung(out)
    assert len(where) == 1, out
    assert "in wait_for_peer" in where[0] and "in test_stuck" in where[0], where
    assert "_pytest" not in where[0]
    assert run_suite.counts(out) == {"passed": 2}


def test_failing_tests_are_listed_once_and_a_healthy_run_names_no_hang(tmp_path):
    out = _pytest(tmp_path, """
        def test_bad():
            assert 1 == 2

        def test_good():
            pass
    """, *run_suite.HUNG_AFTER)
    assert run_suite.hung(out) == []
    assert run_suite.failures(out) == [ln for ln in out.splitlines() if ln.startswith("FAILED")]
    assert len(run_suite.failures(out)) == 1 and "test_bad" in run_suite.failures(out)[0]
    assert run_suite.counts(out) == {"failed": 1, "passed": 1}


def test_every_subset_pattern_names_tests_that_exist():
    """A renamed file or test must not drop out of another virtualenv's subset unnoticed."""
    for pattern in (*run_suite.OPENMPI_SUBSET, *run_suite.TORCH_NEWEST_SUBSET):
        path, _, test = pattern.partition("::")
        test = test.split("[")[0]
        files = list((run_suite.ROOT / "tests").glob(path))
        assert files, f"{pattern}: no such file"
        if test:
            assert f"def {test}(" in files[0].read_text(), f"{pattern}: no such test"
