"""Unit: ``docs/reference.md`` names what the plugin has, and the plugin has what it names.

Held against what a user reaches: ``pytest_distrank.__all__``, the plugin's fixtures, the
markers ``pytest --markers`` lists, the options ``pytest --help`` lists (flags and ini keys,
with ``options.OPTIONS``' environment variables), the hooks (``hookspecs``), and every
``DISTRANK_*`` variable, an option's or a constant of ``envvars.py``. Every documented name
exists; every public name is documented (this replaces test_docs.py's one-way check).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import pytest_distrank
from pytest_distrank import envvars, hookspecs, options

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pytest_distrank"
REFERENCE = (ROOT / "docs" / "reference.md").read_text()

pytest_plugins = ["pytester"]


def section(title: str) -> str:
    """The text of ``## title`` up to the next ``## `` heading."""
    start = REFERENCE.index(f"\n## {title}\n")
    end = REFERENCE.find("\n## ", start + 1)
    return REFERENCE[start : end if end >= 0 else None]


def first_column(text: str) -> list[str]:
    """The first cell of each table row whose first cell is code: ``| `x` | ...``."""
    return re.findall(r"^\| `([^`]+)` \|", text, re.MULTILINE)


def table(text: str, first_title: str) -> str:
    """The table of ``text`` whose first column is titled ``first_title``."""
    start = text.index(f"\n| {first_title} |")
    end = text.find("\n\n", start + 1)
    return text[start : end if end >= 0 else None]


def names(cells: list[str]) -> set[str]:
    """``world_size(*sizes, ...)`` -> ``world_size``; ``--distrank-seed=N`` -> the flag."""
    return {re.split(r"[(=]", cell)[0] for cell in cells}


def test_the_documented_python_api_is_all_and_all_is_documented() -> None:
    checks = names(first_column(section("Checks across ranks")))
    spelled = set(re.findall(r"pytest_distrank\.(\w+)", REFERENCE))
    spelled |= set(re.findall(r"from pytest_distrank import (\w+)", REFERENCE))
    documented = checks | (spelled - {"plugin"})  # the entry point's module, not the API
    assert sorted(documented - set(pytest_distrank.__all__)) == []
    assert [n for n in pytest_distrank.__all__ if not hasattr(pytest_distrank, n)] == []
    code = spelled | set(re.findall(r"`(\w+)", REFERENCE))
    assert sorted(set(pytest_distrank.__all__) - code) == []


def _fixture_names() -> set[str]:
    """The fixtures the package defines (``@pytest.fixture``-decorated functions; ``name=``
    where given): the plugin registers the modules that hold them."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for deco in node.decorator_list:
                call = deco if isinstance(deco, ast.Call) else None
                if ast.unparse(call.func if call else deco) != "pytest.fixture":
                    continue
                given = [k.value for k in (call.keywords if call else []) if k.arg == "name"]
                found.add(ast.literal_eval(given[0]) if given else node.name)
    return found


def test_the_documented_fixtures_are_the_plugins() -> None:
    documented = names(first_column(section("Fixtures")))
    assert documented == _fixture_names()
    assert {"rank", "faults", "fixture_path"} <= documented  # the reader sees the table


def test_the_documented_hooks_are_the_hookspecs() -> None:
    documented = names(first_column(table(section("Hooks"), "hook")))
    assert documented == {n for n in vars(hookspecs) if n.startswith("pytest_distrank_")}


def _markers(pytester: pytest.Pytester, *args: str) -> set[str]:
    lines = pytester.parseconfigure(*args).getini("markers")
    return {re.split(r"[(:]", line)[0] for line in lines}


def test_the_documented_markers_are_the_registered_ones(pytester: pytest.Pytester) -> None:
    own = _markers(pytester, "-p", "distrank") - _markers(pytester, "-p", "no:distrank")
    text = section("Markers")
    headings = re.findall(r"^### `([^`]+)`", text, re.MULTILINE)
    documented = names(first_column(table(text, "marker"))) | names(headings)
    assert documented - {"timeout"} == own  # pytest-timeout's, for what the plugin makes of it


def test_the_documented_options_are_the_registered_ones(pytester: pytest.Pytester) -> None:
    help_text = pytester.runpytest_inprocess("-p", "distrank", "--help").stdout.str()
    rows = re.findall(
        r"^\| (`--distrank-[^`]+`|\(ini only\)) \| `(\w+)` \| (`\w+`)? ?\|",
        section("Options"),
        re.MULTILINE,
    )
    flags = {re.split(r"=", f.strip("`"))[0] for f, _, _ in rows if f.startswith("`")}
    inis = {ini for _, ini, _ in rows}
    envs = {env.strip("`") for _, _, env in rows if env}
    assert flags == set(re.findall(r"^  (--distrank-[a-z-]+)", help_text, re.MULTILINE))
    assert inis == set(re.findall(r"^  (distrank_\w+) \(", help_text, re.MULTILINE))
    assert flags == {o.flag for o in options.OPTIONS}
    assert envs == {o.env for o in options.OPTIONS}
    assert inis >= {o.ini for o in options.OPTIONS}


def _settings_variables() -> set[str]:
    """Every ``DISTRANK_*`` name of the plugin: ``envvars.py``'s constants, the options' ``env``."""
    constants = {
        value
        for name, value in vars(envvars).items()
        if name.isupper() and isinstance(value, str) and value.startswith("DISTRANK_")
    }
    return constants | {o.env for o in options.OPTIONS}


def test_every_documented_variable_is_a_setting_and_every_setting_is_documented() -> None:
    documented = set(re.findall(r"\bDISTRANK_[A-Z][A-Z0-9_]*[A-Z0-9]", REFERENCE))
    assert sorted(documented - _settings_variables()) == []
    assert sorted(_settings_variables() - documented) == []


def test_the_options_row_of_the_environment_names_every_options_variable() -> None:
    row = next(
        line for line in section("Environment variables").splitlines() if "the [options]" in line
    )
    assert set(re.findall(r"DISTRANK_\w+", row)) == {o.env for o in options.OPTIONS}


#: Modules that still spell a variable of their own, to import it from ``envvars`` instead
#: (the pool's controller side, being moved into rooms elsewhere). Remove each when it does.
NOT_YET: set[str] = set()


def test_the_variables_are_spelled_in_options_and_envvars_only() -> None:
    """Outside ``options.py`` and ``envvars.py`` a ``DISTRANK_*`` name is spelled only in
    docstrings, comments and patterns (``DISTRANK_*``, the prefix ``DISTRANK_``)."""
    spelled: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in ("options.py", "envvars.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.fullmatch(r"DISTRANK_[A-Z][A-Z0-9_]*[A-Z0-9]", node.value):
                    spelled.setdefault(rel, set()).add(node.value)
    assert {rel: sorted(v) for rel, v in spelled.items() if rel not in NOT_YET} == {}
    assert sorted(NOT_YET - set(spelled)) == [], "they import them now: empty NOT_YET"
