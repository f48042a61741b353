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

#: The repository root (this file is tests/unit/test_imports.py).
ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pytest_distrank"


def modules_in(folder: Path, prefix: str = "") -> set[str]:
    """Dotted names (below the package) of the modules in ``folder`` and its subfolders,
    ``__init__`` left out."""
    return {
        prefix + ".".join(p.relative_to(folder).with_suffix("").parts)
        for p in folder.rglob("*.py")
        if p.stem != "__init__"
    }


#: Pool mode, controller side.
POOL_CONTROLLER = {
    f"pool.{m}"
    for m in (
        "controller",
        "pool",
        "poolset",
        "preloads",
        "attempt",
        "cmdline",
        "gpus",
        "lockfolder",
        "gpumemory",
        "poolkey",
        "terminal",
        "debugrelay",
        "forkserver",
        "ownreports",
        "probes",
        "reruns",
        "simreport",
    )
}
#: Pool mode, rank side (the fork server and the rank processes it forks).
POOL_RANK = {
    "pool.worker.main",
    "pool.worker.rankgroup",
    "pool.worker.ranklogs",
    "pool.worker.rankfr",
    "pool.worker.preload",
    "pool.worker.suiterank",
    "pool.worker.suiteclass",
    "pool.worker.rankpdb",
    "pool.worker.rankproc",
    "pool.worker.rankgpu",
    "pool.worker.simulate",
    "pool.worker.rankreruns",
}
#: Pool mode, both sides (imported by each, importing neither).
POOL_BOTH = {"pool.protocol", "pool.workerinput", "pool.suites"}
POOL = modules_in(PACKAGE / "pool", "pool.")
#: Launcher mode.
LAUNCH = modules_in(PACKAGE / "launch", "launch.")
#: The top level: what both modes use, and the plugin's entry (whose gate alone may import a
#: mode, lazily, inside the hook that picks it).
SHARED = {m for m in modules_in(PACKAGE) - {"plugin"} if not m.startswith(("pool.", "launch."))}
#: Modules that import no torch (they run in the controller, which never imports it for gloo).
NO_TORCH = {
    "outcome.records",
    "outcome.collectives",
    "pool.protocol",
    "outcome.merge",
    "pool.simreport",
    "outcome.endgame",
    "outcome.checks",
    "outcome.stacks",
    "rank.reaper",
    "outcome.warnings",
    "pool.debugrelay",
}


def path_of(module: str) -> Path:
    return PACKAGE.joinpath(*module.split(".")).with_suffix(".py")


def imports_of(module: str) -> set[str]:
    """Every module ``module`` imports: absolute imports by their full name, the plugin's own
    (relative) imports resolved to dotted names below the package (``pool.worker``, ``merge``)."""
    package = module.split(".")[:-1]
    tree = ast.parse(path_of(module).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                if node.module:
                    found.add(".".join([*base, *node.module.split(".")]))
                else:  # "from .. import x": x is a module of that package (or a name in it)
                    found.update(".".join([*base, alias.name]) for alias in node.names)
            elif node.module:
                found.add(node.module)
    return found


def own(names: set[str]) -> set[str]:
    """The package's own modules among ``names``."""
    return names & (SHARED | POOL | LAUNCH | {"plugin"})


def test_every_module_has_a_place() -> None:
    assert POOL == POOL_CONTROLLER | POOL_RANK | POOL_BOTH, "new pool modules need a side"
    assert "outcome.records" in SHARED and "rank.context" in SHARED and "pool.worker.main" in POOL
    assert "launch.plugin" in LAUNCH


def test_the_import_reader_resolves_relative_imports() -> None:
    assert {"pool.protocol", "outcome.records", "pool.worker.rankgroup", "_compat"} <= imports_of(
        "pool.worker.main"
    )
    assert "launch.channel" in imports_of("launch.plugin")


@pytest.mark.parametrize("module", sorted(POOL_RANK | POOL_BOTH))
def test_pool_rank_side_imports_nothing_of_the_controller_side(module: str) -> None:
    assert own(imports_of(module)) & (POOL_CONTROLLER | LAUNCH | {"plugin"}) == set()


@pytest.mark.parametrize("module", sorted(LAUNCH))
def test_launcher_mode_imports_nothing_of_pool_mode(module: str) -> None:
    assert own(imports_of(module)) & POOL == set()


@pytest.mark.parametrize("module", sorted(POOL))
def test_pool_mode_imports_nothing_of_launcher_mode(module: str) -> None:
    assert own(imports_of(module)) & LAUNCH == set()


@pytest.mark.parametrize("module", sorted(SHARED))
def test_top_level_modules_import_neither_mode(module: str) -> None:
    assert own(imports_of(module)) & (POOL | LAUNCH) == set()


def test_the_plugin_imports_a_mode_only_inside_a_function() -> None:
    tree = ast.parse(path_of("plugin").read_text())
    at_module_level = {
        "." * node.level + (node.module or "")
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
    }
    assert not {m for m in at_module_level if m.startswith((".pool", ".launch"))}
    assert {"pool.controller", "launch.plugin"} <= imports_of("plugin")


@pytest.mark.parametrize("module", sorted(NO_TORCH))
def test_modules_that_run_anywhere_import_no_torch(module: str) -> None:
    assert not {n for n in imports_of(module) if n == "torch" or n.startswith("torch.")}


@pytest.mark.parametrize("module", ["outcome.records", "pool.protocol"])
def test_the_records_and_the_pool_protocol_import_only_the_standard_library(module: str) -> None:
    allowed = {"__future__", "dataclasses", "enum", "typing", "outcome.records"}
    assert imports_of(module) <= allowed


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
    "._world",
    "_get_sequence_number_for_group",
    "_local_tensor",
    "_enable_record_function",
    "_rng_tracker",
    "_prepare_collective_groups",
    "_warn_not_in_group",
    "_get_msg_dict",
    "_dim_group_names",
    "_pg_registry",
)
TESTS = ROOT / "tests"


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
    files = [p for p in PACKAGE.rglob("*.py") if p.stem != "_compat"] + sorted(TESTS.rglob("*.py"))
    assert [p.name for p in files if imports_pytest_internals(p)] == []
    assert imports_pytest_internals(PACKAGE / "_compat.py")  # the check sees an import


@pytest.mark.parametrize("module", sorted((SHARED | POOL | LAUNCH | {"plugin"}) - {"_compat"}))
def test_only_compat_touches_private_attributes(module: str) -> None:
    source = path_of(module).read_text()
    patterns = {s: (r"(?<!\w)" if s[0] == "_" else "") + re.escape(s) for s in PRIVATE_SPELLINGS}
    assert [s for s, pattern in patterns.items() if re.search(pattern, source)] == []


def test_the_private_spellings_are_found_in_compat() -> None:
    source = (PACKAGE / "_compat.py").read_text()
    assert [s for s in PRIVATE_SPELLINGS if s not in source] == []
