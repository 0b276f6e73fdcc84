"""Rank-0 printing: ``print(..., force=True)`` lines of every rank arrive whole, even unbuffered."""

from __future__ import annotations

import re
import textwrap

import pytest
from launcher import run_mpi

JOB = """
    import mpidist
    from mpidist.start import printing
    from mpi4py import MPI

    r = MPI.COMM_WORLD.Get_rank()
    printing.setup_for_distributed(r == 0)
    MPI.COMM_WORLD.Barrier()
    for i in range({lines}):
        # several pieces, a separator and a long payload: each was a write of its own before
        print("rank", r, "line", i, "payload", "x" * (40 + 7 * r), sep=" ", force=True)
    print("quiet", r)  # only rank 0 prints without force
"""
LINE = re.compile(r"^rank (\d) line (\d+) payload x+$")


@pytest.mark.parametrize("unbuffered", ["-u", "PYTHONUNBUFFERED=1"])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_forced_prints_of_all_ranks_stay_whole_lines(tmp_path, n, unbuffered):
    lines = 20
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB.format(lines=lines)))
    args = ["-u", str(script)] if unbuffered == "-u" else [str(script)]
    env = {"PYTHONUNBUFFERED": "1"} if unbuffered != "-u" else {"PYTHONUNBUFFERED": ""}
    proc = run_mpi(n, args, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    seen = set()
    for line in out:
        if line.startswith("quiet"):
            assert line == "quiet 0", out
            continue
        m = LINE.match(line)
        assert m, f"a line was cut or mixed with another rank's: {line!r}"
        r = int(m.group(1))
        assert line.count("x") == 40 + 7 * r, line
        seen.add((r, int(m.group(2))))
    assert seen == {(r, i) for r in range(n) for i in range(lines)}
    assert out.count("quiet 0") == 1


def test_print_keeps_print_arguments():
    import io

    from mpidist.start import printing

    try:
        printing.setup_for_distributed(False)
        buf = io.StringIO()
        print("a", 1, sep="-", end="|", file=buf, force=True)
        print("hidden", file=buf)
        print("b", None, sep=None, end=None, file=buf, force=True, flush=True)
        assert buf.getvalue() == "a-1|b None\n"
    finally:
        printing.restore()
