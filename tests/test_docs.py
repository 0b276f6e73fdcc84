"""The documentation site's sources: every public name is in the API reference, every page in a toctree.

Serial and quick: it reads docs/ (the build itself, warnings as errors, is ``make docs``, which
``make test`` runs through ``run_suite.py --docs``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
DOCUMENTED = re.compile(r"^\.\. auto(?:function|class|data|exception):: (\S+)", re.MULTILINE)
TOCTREE = re.compile(r"```\{toctree\}\n(.*?)```", re.DOTALL)


def _documented() -> set[str]:
    return {name for page in (DOCS / "api").glob("*.md") for name in DOCUMENTED.findall(page.read_text())}


@pytest.mark.parametrize("module", ["mpidist", "mpidist.torch", "mpidist.groupby"])
def test_every_public_name_is_in_the_api_reference(module):
    if module == "mpidist.torch":
        pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")
    mod = __import__(module, fromlist=["__all__"])
    missing = sorted(f"{module}.{n}" for n in mod.__all__ if f"{module}.{n}" not in _documented())
    assert not missing, f"add to docs/api/: {missing}"


def test_every_page_is_in_a_toctree():
    listed = set()
    for page in DOCS.rglob("*.md"):
        if "_build" in page.parts:
            continue
        for block in TOCTREE.findall(page.read_text()):
            for line in block.splitlines():
                line = line.strip()
                if line and not line.startswith(":"):
                    listed.add(str((page.parent / line).resolve().relative_to(DOCS)))
    pages = {str(p.relative_to(DOCS).with_suffix("")) for p in DOCS.rglob("*.md") if "_build" not in p.parts}
    assert pages - listed == {"index"}, f"pages in no toctree: {sorted(pages - listed - {'index'})}"
