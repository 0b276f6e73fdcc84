"""The C kernel as built: it assumes nothing of the build machine's CPU and links nothing new.

A wheel built here must load and run on any x86-64 (or leave float16/bfloat16 to numpy where
it cannot load). So the machine code outside the ``*_avx2`` functions uses no AVX (VEX/EVEX)
instruction, the loops are chosen at run time (``select``), and the module needs no library
beyond the C library, at symbol versions a 2014 glibc (manylinux2014's 2.17) has.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess

import pytest

from mpidist.calls import lowprec_math

kernel = lowprec_math._kernel
pytestmark = pytest.mark.skipif(kernel is None, reason="the C kernel is not built (no compiler at install)")
# AT&T syntax: a VEX/EVEX instruction is a "v" mnemonic; ymm/zmm registers need AVX
VECTOR = re.compile(r"\t(v[a-z0-9]+)\b|%[yz]mm\d")
FUNCTION = re.compile(r"^[0-9a-f]+ <([^>]+)>:$")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (binutils)")
    return path


def test_select_switches_the_loops_and_rejects_unknown_names():
    best = kernel.select("auto")
    try:
        assert kernel.select("portable") == "portable" == kernel.isa
        assert kernel.select("auto") == best == kernel.isa
        with pytest.raises(ValueError, match="'sse9' is not 'auto', 'portable' or 'avx2\\+f16c'"):
            kernel.select("sse9")
        assert kernel.isa == best  # a bad name changes nothing
    finally:
        kernel.select("auto")


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the AVX2 loops exist on x86-64 only")
def test_avx_instructions_only_in_the_avx2_functions():
    dump = subprocess.run([_tool("objdump"), "-d", "--no-show-raw-insn", kernel.__file__], check=True,
                          capture_output=True, text=True).stdout
    found: dict[str, int] = {}
    fn = ""
    for line in dump.splitlines():
        m = FUNCTION.match(line)
        if m:
            fn = m.group(1)
        elif VECTOR.search(line):
            found[fn] = found.get(fn, 0) + 1
    assert found, "no AVX instruction at all: the vector loops were not built"
    assert {f for f in found if "_avx2" not in f} == set(), found
    assert {f.split(".")[0] for f in found} <= {"reduce_avx2", "widen_avx2", "narrow_avx2"}


def test_needs_only_the_c_library_of_2014():
    dynamic = subprocess.run([_tool("readelf"), "-d", "-W", "--dyn-syms", kernel.__file__], check=True,
                             capture_output=True, text=True).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))
    assert needed <= {"libc.so.6", "libm.so.6", "libpthread.so.0"}, needed
    versions = set(re.findall(r"@(GLIBC|GCC|CXXABI|GLIBCXX)_([\d.]+)", dynamic))
    assert {v for v in versions if v[0] != "GLIBC"} == set(), versions  # no libgcc_s, no C++
    too_new = {v for v in versions if tuple(map(int, v[1].split("."))) > (2, 17)}
    assert too_new == set(), too_new
