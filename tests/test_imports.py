"""Unit: the import rules that keep the architecture visible (structure issue #12).

Read from the sources with ``ast`` (every import, module level or inside a function): the rank
side imports nothing of the controller side, the two modes never import each other, and the
modules that must run anywhere import neither torch nor pytest's internals beyond what they say.
Every private pytest, CPython and torch access goes through ``_compat.py``: no other module and no
test imports ``_pytest``, and no other module spells one of the private attributes it wraps.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_distrank"

#: Pool mode, controller side.
POOL_CONTROLLER = {"controller", "pool", "poolset", "attempt", "rankargs", "gpus", "terminal"}
#: Pool mode, rank side (rank processes started by the controller).
POOL_RANK = {"worker", "rankgroup", "ranklogs"}
#: Launcher mode.
LAUNCH = {p.stem for p in PACKAGE.glob("launch*.py")}
#: Used by both modes; import neither mode.
SHARED = {
    "_compat",
    "context",
    "endgame",
    "fitness",
    "fixtures",
    "hookspecs",
    "markers",
    "merge",
    "preload",
    "protocol",
    "rankside",
    "reaper",
    "requirements",
    "settings",
    "stacks",
    "warnings_relay",
}
#: Modules that import no torch (they run in the controller, which never imports it for gloo).
NO_TORCH = {"protocol", "merge", "endgame", "fitness", "stacks", "reaper", "warnings_relay"}


def imports_of(module: str) -> set[str]:
    """Every module ``module`` imports, as top-level names for absolute imports and as the
    package module name for the plugin's own (relative) imports."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(alias.name for alias in node.names)
            elif node.module:
                found.add(node.module)
    return found


def own(names: set[str]) -> set[str]:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    return {n for n in names if n in modules}


def test_every_module_has_a_place() -> None:
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "plugin"}
    placed = POOL_CONTROLLER | POOL_RANK | LAUNCH | SHARED
    assert modules - placed == set(), "new modules need a place in the import rules"


@pytest.mark.parametrize("module", sorted(POOL_RANK))
def test_rank_side_imports_nothing_of_the_controller_side(module: str) -> None:
    assert own(imports_of(module)) & (POOL_CONTROLLER | LAUNCH) == set()


@pytest.mark.parametrize("module", sorted(LAUNCH))
def test_launcher_mode_imports_nothing_of_pool_mode(module: str) -> None:
    assert own(imports_of(module)) & (POOL_CONTROLLER | POOL_RANK) == set()


@pytest.mark.parametrize("module", sorted(POOL_CONTROLLER | POOL_RANK))
def test_pool_mode_imports_nothing_of_launcher_mode(module: str) -> None:
    assert own(imports_of(module)) & LAUNCH == set()


@pytest.mark.parametrize("module", sorted(SHARED))
def test_shared_modules_import_neither_mode(module: str) -> None:
    assert own(imports_of(module)) & (POOL_CONTROLLER | POOL_RANK | LAUNCH) == set()


@pytest.mark.parametrize("module", sorted(NO_TORCH))
def test_modules_that_run_anywhere_import_no_torch(module: str) -> None:
    assert not {n for n in imports_of(module) if n == "torch" or n.startswith("torch.")}


def test_the_protocol_imports_only_the_standard_library() -> None:
    allowed = {"__future__", "dataclasses", "enum", "typing"}
    assert imports_of("protocol") <= allowed


#: The private attributes ``_compat.py`` wraps; no other module of the package may spell them. A
#: spelling that starts with ``_`` counts only where no identifier character precedes it, so the
#: public ``set_forkserver_preload`` of multiprocessing is not taken for ``_forkserver``.
PRIVATE_SPELLINGS = (
    "._setupstate",
    "._fixturemanager",
    "._given_basetemp",
    "._ensure_unconfigure",
    "._tw",
    "._tmp_path_factory",
    "_forkserver",
    "_rendezvous_handlers",
    "_dump_fr_trace",
    "._parser",
    "_pyfuncitem",
    "_fixtureinfo",
    "_use_item_location",
)
TESTS = Path(__file__).resolve().parent


def imports_pytest_internals(path: Path) -> bool:
    """Whether the file imports ``_pytest`` or one of its modules (``ast``: any import statement;
    a module name passed as a string, as to ``pytest.importorskip``, is not an import)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            continue
        if any(n == "_pytest" or n.startswith("_pytest.") for n in names):
            return True
    return False


def test_only_compat_imports_pytest_internals() -> None:
    files = [p for p in PACKAGE.glob("*.py") if p.stem != "_compat"] + sorted(TESTS.glob("*.py"))
    assert [p.name for p in files if imports_pytest_internals(p)] == []
    assert imports_pytest_internals(PACKAGE / "_compat.py")  # the check sees an import


@pytest.mark.parametrize("module", sorted({p.stem for p in PACKAGE.glob("*.py")} - {"_compat"}))
def test_only_compat_touches_private_attributes(module: str) -> None:
    source = (PACKAGE / f"{module}.py").read_text()
    patterns = {s: (r"(?<!\w)" if s[0] == "_" else "") + re.escape(s) for s in PRIVATE_SPELLINGS}
    assert [s for s, pattern in patterns.items() if re.search(pattern, source)] == []


def test_the_private_spellings_are_found_in_compat() -> None:
    source = (PACKAGE / "_compat.py").read_text()
    assert [s for s in PRIVATE_SPELLINGS if s not in source] == []
