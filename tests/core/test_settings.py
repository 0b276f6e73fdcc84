"""The settings table: one spelling of true and false, clear errors, every variable declared and documented.

Serial and MPI-free in what it checks: the readers take a mapping, and the source checks read files.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from mpidist.core import settings

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "mpidist"
DOC = ROOT / "docs" / "environment.md"
NAME = re.compile(r"MPIDIST_[A-Z_]+")

@pytest.mark.parametrize("text", ["1", "true", "TRUE", " yes ", "On", "\ttrue\n"])
def test_true_spellings(text):
    assert settings.flag("MPIDIST_MALLOC", {"MPIDIST_MALLOC": text}) is True


@pytest.mark.parametrize("text", ["0", "false", "False", " no", "OFF "])
def test_false_spellings(text):
    assert settings.flag("MPIDIST_MALLOC", {"MPIDIST_MALLOC": text}) is False


@pytest.mark.parametrize("text", ["2", "y", "enabled", "nope", "1.0"])
def test_any_other_flag_spelling_is_refused_naming_variable_value_and_spellings(text):
    with pytest.raises(ValueError) as info:
        settings.flag("MPIDIST_ABORT_ON_ERROR", {"MPIDIST_ABORT_ON_ERROR": text})
    message = str(info.value)
    assert f"MPIDIST_ABORT_ON_ERROR={text.strip()!r}" in message
    assert all(word in message for word in settings.TRUE + settings.FALSE), message


def test_unset_and_blank_are_the_default():
    assert settings.flag("MPIDIST_MALLOC", {}) is True
    assert settings.flag("MPIDIST_CUDA_AWARE", {"MPIDIST_CUDA_AWARE": "  "}) is None
    assert settings.seconds("MPIDIST_STALL_WARN_S", {"MPIDIST_STALL_WARN_S": ""}) == 60.0
    assert settings.integer("MPIDIST_TORCH_SYNC_BYTES", {}) is None
    assert settings.choice("MPIDIST_DEBUG", {}) is None
    assert settings.path("MPIDIST_FLIGHT_DIR", {}) == "."
    assert not settings.is_set("MPIDIST_DEBUG", {"MPIDIST_DEBUG": " "})
    assert settings.is_set("MPIDIST_DEBUG", {"MPIDIST_DEBUG": "off"})


def test_os_environ_is_read_at_call_time(monkeypatch):
    monkeypatch.setenv("MPIDIST_STALL_WARN_S", "2.5")
    assert settings.seconds("MPIDIST_STALL_WARN_S") == 2.5
    monkeypatch.setenv("MPIDIST_STALL_WARN_S", "off")
    assert settings.seconds("MPIDIST_STALL_WARN_S") == 0.0


def test_numbers():
    def seconds(text):
        return settings.seconds("MPIDIST_EXIT_TIMEOUT", {"MPIDIST_EXIT_TIMEOUT": text})

    assert seconds("2") == 2.0 and seconds("1e-3") == 0.001 and seconds("None") == 0.0
    for bad in ("soon", "-1", "nan", "5s"):
        with pytest.raises(ValueError, match=f"MPIDIST_EXIT_TIMEOUT={bad!r} is not a number of seconds"):
            seconds(bad)
    env = "MPIDIST_FLIGHT_RECORDER"
    assert settings.integer(env, {env: " 64 "}) == 64
    for bad in ("many", "-1", "1.5"):
        with pytest.raises(ValueError, match=f"{env}={bad!r} is not a whole number of 0 or more"):
            settings.integer(env, {env: bad})


def test_choices_in_any_case_come_back_in_the_table_spelling():
    assert settings.choice("MPIDIST_DEBUG", {"MPIDIST_DEBUG": "detail"}) == "DETAIL"
    assert settings.choice("MPIDIST_THREAD_LEVEL", {"MPIDIST_THREAD_LEVEL": " Funneled"}) == "funneled"
    with pytest.raises(ValueError, match="MPIDIST_DEBUG='chatty' is not one of OFF, INFO, DETAIL"):
        settings.choice("MPIDIST_DEBUG", {"MPIDIST_DEBUG": "chatty"})


def test_a_reader_must_match_the_declared_kind_and_name():
    with pytest.raises(TypeError, match="MPIDIST_DEBUG is a choice setting"):
        settings.flag("MPIDIST_DEBUG", {})
    with pytest.raises(KeyError):
        settings.flag("MPIDIST_NO_SUCH_THING", {})


def test_every_declared_default_reads_back():
    readers = {"flag": settings.flag, "int": settings.integer, "seconds": settings.seconds,
               "choice": settings.choice, "path": settings.path}
    for name, setting in settings.SETTINGS.items():
        assert readers[setting.kind](name, {}) == setting.default, name
        assert setting.meaning and name.startswith("MPIDIST_")


def _sources() -> dict[str, str]:
    return {path.relative_to(SRC).as_posix(): path.read_text() for path in sorted(SRC.rglob("*.py"))}


def test_every_name_in_the_sources_is_declared_and_documented():
    found = {name for text in _sources().values() for name in NAME.findall(text)}
    undeclared = sorted(found - set(settings.SETTINGS))
    assert not undeclared, f"declare in mpidist/core/settings.py: {undeclared}"
    documented = set(NAME.findall(DOC.read_text()))
    assert documented == set(settings.SETTINGS), (
        f"docs/environment.md lacks {sorted(set(settings.SETTINGS) - documented)}, "
        f"names undeclared {sorted(documented - set(settings.SETTINGS))}")


def _direct_reads(text: str) -> list[str]:
    """``os.environ.get``/``os.getenv``/``os.environ[...]``/``in os.environ`` on an MPIDIST_ name."""
    tree = ast.parse(text)
    constants = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                 for t in ast.walk(node.targets[0]) if isinstance(t, ast.Name)
                 and any(isinstance(c, ast.Constant) and isinstance(c.value, str) and NAME.fullmatch(c.value)
                         for c in ast.walk(node.value))}

    def named(node: ast.AST | None) -> bool:
        if isinstance(node, ast.Name):
            return node.id in constants
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(NAME.match(node.value))

    reads = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and named(node.args[0]):
            func = ast.unparse(node.func)
            if func.endswith("getenv") or (func.endswith(".get") and "env" in func):
                reads.append(ast.unparse(node))
        elif isinstance(node, ast.Subscript) and "environ" in ast.unparse(node.value) and named(node.slice):
            reads.append(ast.unparse(node))
        elif isinstance(node, ast.Compare) and named(node.left) and any(
                isinstance(op, ast.In) for op in node.ops) and "environ" in ast.unparse(node):
            reads.append(ast.unparse(node))
    return reads


def test_only_settings_reads_the_environment_for_mpidist_variables():
    assert _direct_reads('import os\nA = "MPIDIST_X"\nos.environ.get(A)\nos.getenv("MPIDIST_Y")')
    found = {}
    for rel, text in _sources().items():
        if rel == "core/settings.py":
            continue
        reads = _direct_reads(text)
        if reads:
            found[rel] = reads
    assert not found, f"read these through mpidist.core.settings: {found}"


def test_settings_imports_only_the_standard_library():
    """It is read before mpi4py.MPI initialises MPI (the thread level, the MPI_Init bound)."""
    tree = ast.parse((SRC / "core" / "settings.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
        n.module or "." for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
    relative = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
    assert not relative and imported <= {"__future__", "math", "os", "typing"}, imported
