"""mpidist.groupby in processes of its own: hashing across interpreters, what importing loads,
a mismatch in a real job, the example and the benchmark.

Serial tests; each starts its own ``mpiexec`` or plain ``python`` through ``launcher``, under a timeout.
"""

from __future__ import annotations

import numpy as np
from launcher import ROOT, run_mpi, run_python


def test_hash_is_deterministic_and_width_independent():
    from mpidist.groupby.hashing import hash_column, hash_keys

    a = hash_column(np.array(["ab", "héllo", ""], dtype="U5"))
    b = hash_column(np.array(["ab", "héllo", ""], dtype="U12"))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(hash_column(np.array([0.0, np.nan])),
                                  hash_column(np.array([-0.0, -np.nan])))
    assert len(set(hash_column(np.arange(1000)).tolist())) == 1000
    code = ("import numpy as np; from mpidist.groupby.hashing import hash_keys; "
            "print(hash_keys([np.array(['store-7', 'x']), np.array([3, 4])]).tolist())")
    outs = {run_python(["-c", code], timeout=120, env={"PYTHONHASHSEED": s}).stdout for s in ("1", "2")}
    assert len(outs) == 1
    here = hash_keys([np.array(["store-7", "x"]), np.array([3, 4])]).tolist()
    assert outs.pop().strip() == str(here)


def test_import_does_not_load_pandas():
    code = "import sys, mpidist.groupby; print('pandas' in sys.modules)"
    out = run_python(["-c", code], timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_mismatch_fails_fast_in_a_real_job():
    """A dtype mismatch on one of 3 ranks ends the job with the error, never a hang."""
    code = ("import numpy as np, mpidist as dist, mpidist.groupby as gb\n"
            "dist.init_process_group('mpi', abort_on_error=False)\n"
            "r = dist.get_rank()\n"
            "try:\n"
            "    gb.aggregate(np.arange(5, dtype='f8' if r == 2 else 'i8'), np.ones(5), merge='shuffle')\n"
            "except ValueError as e:\n"
            "    print('ERR', e)\n")
    out = run_mpi(3, ["-c", code], timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("ERR") == 3 and "rank 2 passed key column 'key'" in out.stdout


def test_example_runs_under_four_ranks():
    out = run_mpi(4, [str(ROOT / "examples" / "groupby.py"), "--rows", "20000"], timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    for mode in ("root", "shuffle", "gather", "none"):
        assert f"merge={mode}" in out.stdout


def test_benchmark_smoke():
    out = run_python([str(ROOT / "benchmarks" / "groupby.py"), "--rows", "20000", "--ranks", "1,2",
                      "--keys", "100", "--check"], timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "pandas" in out.stdout and "ratio" in out.stdout
