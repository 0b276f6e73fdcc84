"""Sphinx configuration of mpidist's documentation site: MyST Markdown pages, autodoc + napoleon.

Built with ``make docs`` (warnings are errors: ``-W --keep-going -n``); ``make test`` builds it too.
autodoc imports mpidist (so mpi4py and its MPI library), mpidist.torch (torch) and
mpidist.integrations.lightning (lightning): build it in the virtualenv ``make venv-docs`` makes.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))

import mpidist  # noqa: E402

project = "mpidist"
author = "the mpidist developers"
copyright = "the mpidist developers"  # noqa: A001 - Sphinx's name
release = version = mpidist.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "benchmark_plots"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_generated/*.json", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# NumPy-style docstrings
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True

# -n: every reference must resolve. Names from other projects have no inventory here (the build
# reaches no network), so their types are left unlinked rather than reported.
nitpick_ignore_regex = [
    # the internals the public docstrings point at (the layers below the API; see Layout)
    (r"py:.*", r"mpidist\.(core|calls|checks|start|gpu|training)(\..*)?"),
    (r"py:.*", r"mpidist\.torch\.(backend|progress|work|start|rendezvous|overlap|netaddr|profiling)(\..*)?"),
    (r"py:.*", r"(map_cpu_backend_to_mpidist|progress\..*|c10d::.*)"),
    # NumPy-style type descriptions that are prose or value sets, not names: "dict name -> array",
    # "tuple/list", '{"root", "shuffle"}'
    (r"py:class", r'.*[ /"{}>].*|arrays?'),
    (r"py:.*", r"(numpy|np|torch|mpi4py|MPI|pandas|pd|lightning|datetime|collections|typing|types|"
               r"threading|concurrent|argparse|ctypes|enum|pathlib|os)(\..*)?"),
    (r"py:class", r"(Any|Callable|Sequence|Iterable|Iterator|Mapping|ModuleType|FrameType|TracebackType|"
                  r"timedelta|ndarray|Tensor|Intracomm|Comm|Request|Status|Op|Datatype|ArrayLike|DTypeLike|"
                  r"Enum|IntEnum|ABC|Protocol|TypeVar|NamedTuple|optional|array[-_]like|buffer)"),
]

html_theme = "furo"
html_title = f"mpidist {release}"
html_static_path: list[str] = []
