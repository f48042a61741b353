"""Unit: the import rules that keep the architecture visible (#12; folder rules since #25).

The folder a module lies in says where and when it runs (DESIGN.md, "Layout"), and the rules are
the folders', read from the sources with ``ast`` (every import, module level or inside a
function):

- the top level holds only what a user touches: ``plugin``, ``hookspecs``, ``options`` (the
  options' table; ``parsing``: their values' parsers), ``envvars`` (the other variables' names),
  ``settings`` (the options resolved), ``markers``, ``fixtures`` and ``_compat/``;
- ``outcome/`` imports the standard library, pytest, ``_compat``, the settings' modules and
  itself: no torch, no processes, no mode;
- no module imports torch at module level (``planning/`` included): every pytest process imports
  the plugin, torch only where a function needs it; pool mode's controller side imports none;
- ``rank/`` and ``pool/worker/`` import nothing of pool mode's controller side or of launcher
  mode; pool mode's modules of both sides import neither side;
- pool mode's controller side is three rooms, lowest first: ``pool/onetest/`` (one test on one
  pool) imports nothing of ``pool/pools/`` (the pools) or of the session's modules at the top of
  ``pool/``; ``pool/pools/`` imports nothing of the session's;
- the two modes never import each other, and the shared folders (the top level, ``planning/``,
  ``rank/``, ``outcome/``) import no mode, except the plugin's gate, lazily;
- ``api/`` (what a user's test calls) is imported only by the package's ``__init__`` and
  ``fixtures``, and imports only ``rank/``, ``outcome/``, ``_compat``, the settings' modules
  and itself (of the plugin's own);
- the shared modules import in one order (:data:`SHARED_ORDER`: parsing and envvars, options,
  settings, outcome, planning, rank, tree (a test's own process tree, wherever the test runs),
  api, then markers, fixtures and the package), never upwards and never inside a function
  across folders (no cycle held apart by a late import).

Every private pytest, CPython, torch, PyTorch-harness and plugin access goes through
``_compat/``: no other module and no test imports ``_pytest``, and no other module's code (its
docstrings and comments may name them) spells one of the private names it wraps.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import sys
import tokenize
from collections.abc import Set
from pathlib import Path

import pytest

from pytest_distrank import _compat, plugin
from pytest_distrank.envvars import RANK_ENV

#: The repository root (this file is tests/unit/test_imports.py).
ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pytest_distrank"
TESTS = ROOT / "tests"


def dotted(path: Path) -> str:
    """A file's dotted name below the package (a package's ``__init__``: the package)."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: Every module and package of the plugin, by dotted name below the package ("" is the package).
FILES = {dotted(p): p for p in PACKAGE.rglob("*.py")}
MODULES = {m for m, p in FILES.items() if p.stem != "__init__"}
PACKAGES = {m for m, p in FILES.items() if p.stem == "__init__"}


def folder_of(module: str) -> str:
    """The layout's folder of a module or package: "" (the top level), ``planning``, ``rank``,
    ``outcome``, ``_compat``, ``pool``, ``pool/onetest``, ``pool/pools``, ``pool/worker`` or
    ``launch``."""
    parts = module.split(".")
    if parts[:2] in (["pool", "worker"], ["pool", "onetest"], ["pool", "pools"]):
        return "/".join(parts[:2])
    if module in PACKAGES:
        return module.replace(".", "/")
    return "/".join(parts[:-1])


def in_folder(*folders: str) -> set[str]:
    return {m for m in MODULES if folder_of(m) in folders}


#: What a user touches: the only modules at the top level (beside the package ``_compat/``).
TOP_LEVEL = {
    "plugin",
    "hookspecs",
    "options",
    "envvars",
    "settings",
    "parsing",
    "markers",
    "fixtures",
}
#: The settings' modules: the options' values parsed, the options, the other variables, resolved.
SETTINGS = {"parsing", "options", "envvars", "settings"}
#: The folders of the layout.
FOLDERS = {
    "",
    "_compat",
    "planning",
    "rank",
    "api",
    "outcome",
    "pool",
    "pool/onetest",
    "pool/pools",
    "pool/worker",
    "launch",
    "tree",
}
#: Pool mode's modules that both of its processes import: its messages, plugins' values for the
#: ranks, and the harness classes it takes over (collected alike in the controller and ranks).
BOTH_SIDES = {"pool.protocol", "pool.workerinput", "pool.suites"}
#: The controller side's rooms, lowest first: one test on one pool, the pools, the session.
ONE_TEST = in_folder("pool/onetest")
POOLS = in_folder("pool/pools")
SESSION = in_folder("pool") - BOTH_SIDES
POOL_CONTROLLER = ONE_TEST | POOLS | SESSION
RANK_SIDE = in_folder("pool/worker", "rank")
POOL = in_folder("pool", "pool/onetest", "pool/pools", "pool/worker") | {
    "pool",
    "pool.onetest",
    "pool.pools",
    "pool.worker",
}
LAUNCH = in_folder("launch") | {"launch"}
#: What both modes use; of the top level, the plugin's gate alone picks a mode (lazily).
SHARED = in_folder("", "_compat", "planning", "rank", "outcome", "tree") - {"plugin"}
OUTCOME = in_folder("outcome")


@functools.cache
def tree_of(path: Path) -> ast.Module:
    """``path`` parsed once a session: hundreds of checks read the same trees (none changes one)."""
    return ast.parse(path.read_text())


@functools.cache
def imports_of(module: str) -> frozenset[str]:
    """Every module ``module`` imports: absolute imports by their full name, the plugin's own
    (relative) imports resolved to dotted names below the package (``pool.worker.main``,
    ``outcome.merge``; ``from ..rank import reaper``: ``rank`` and ``rank.reaper``)."""
    return _imports(tree_of(FILES[module]), module)


def _imports(tree: ast.AST, module: str) -> frozenset[str]:
    path = FILES[module]
    package = module.split(".") if path.stem == "__init__" else module.split(".")[:-1]
    package = [p for p in package if p]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                if target:
                    found.add(target)
                for alias in node.names:  # "from .. import x": x may be a module
                    name = f"{target}.{alias.name}" if target else alias.name
                    if name in FILES:
                        found.add(name)
            elif node.module:
                found.add(node.module)
    return frozenset(found)


def own(names: Set[str]) -> Set[str]:
    """The package's own modules and packages among ``names``."""
    return names & set(FILES)


def test_every_module_lies_in_a_folder_of_the_layout() -> None:
    assert {folder_of(m) for m in MODULES} <= FOLDERS
    assert in_folder("") == TOP_LEVEL, "a new top-level module needs a folder of the layout"
    assert BOTH_SIDES <= in_folder("pool")
    assert "pool.worker.main" in RANK_SIDE and "rank.context" in SHARED
    assert "pool.controller" in POOL_CONTROLLER and "launch.plugin" in LAUNCH


def test_the_package_names_shadow_no_library() -> None:
    """Own names are told from library ones by name (``outcome.warnings`` is not ``warnings``)."""
    tops = {m.split(".")[0] for m in FILES if m}
    assert tops & (set(sys.stdlib_module_names) | {"pytest", "torch", "_pytest"}) == set()


def test_the_import_reader_resolves_relative_imports() -> None:
    assert {"pool.protocol", "outcome.records", "pool.worker.rankgroup", "_compat"} <= imports_of(
        "pool.worker.main"
    )
    assert {"rank", "rank.reaper"} <= imports_of("pool.pools.pool")
    assert "launch.channel" in imports_of("launch.plugin")
    assert "pool.worker.main" in imports_of("plugin")


API = in_folder("api") | {"api"}


@pytest.mark.parametrize("module", sorted(MODULES | PACKAGES))
def test_only_the_package_and_fixtures_import_api_which_imports_only_rank_side_leaves(
    module: str,
) -> None:
    """``api/`` is what users rely on; the plumbing below it (``rank/``, ``outcome/``) never
    reaches up into it, and no mode calls it: the fixtures hand it to tests."""
    found = own(imports_of(module))
    if module in API:
        allowed = API | in_folder("rank", "outcome", "_compat") | {"rank", "outcome", "_compat"}
        assert found - allowed - SETTINGS == set()
    elif module not in {"", "fixtures"}:
        assert found & API == set()


@pytest.mark.parametrize("module", sorted(in_folder("launch")))
def test_launcher_mode_imports_nothing_of_pool_mode(module: str) -> None:
    assert own(imports_of(module)) & POOL == set()


@pytest.mark.parametrize(
    "module", sorted(POOL - {"pool", "pool.onetest", "pool.pools", "pool.worker"})
)
def test_pool_mode_imports_nothing_of_launcher_mode(module: str) -> None:
    assert own(imports_of(module)) & LAUNCH == set()


@pytest.mark.parametrize("module", sorted(ONE_TEST))
def test_one_test_reaches_its_pool_only_through_the_ranks_protocol(module: str) -> None:
    """``pool/onetest/`` imports neither the pools' room nor the session's modules."""
    assert own(imports_of(module)) & (POOLS | SESSION) == set()


@pytest.mark.parametrize("module", sorted(POOLS))
def test_the_pools_import_nothing_of_the_session(module: str) -> None:
    assert own(imports_of(module)) & SESSION == set()


@pytest.mark.parametrize("module", sorted(SHARED))
def test_shared_folders_import_no_mode(module: str) -> None:
    assert own(imports_of(module)) & (POOL | LAUNCH) == set()


def test_the_plugin_imports_a_mode_only_inside_a_function() -> None:
    assert own(imports_on_import("plugin")) & (POOL | LAUNCH) == set()
    assert {"pool.controller", "launch.plugin"} <= imports_of("plugin")


@pytest.mark.parametrize("module", sorted(RANK_SIDE))
def test_the_rank_side_imports_nothing_of_the_controller_side(module: str) -> None:
    assert own(imports_of(module)) & (POOL_CONTROLLER | LAUNCH | {"plugin"}) == set()


@pytest.mark.parametrize("module", sorted(BOTH_SIDES))
def test_pool_modules_of_both_sides_import_neither_side(module: str) -> None:
    sides = POOL_CONTROLLER | in_folder("pool/worker") | LAUNCH | {"plugin"}
    assert own(imports_of(module)) & sides == set()


def _library(name: str) -> bool:
    root = name.split(".")[0]
    return root in sys.stdlib_module_names or root == "pytest"


@pytest.mark.parametrize("module", sorted(OUTCOME))
def test_outcome_imports_the_standard_library_pytest_compat_settings_and_itself(
    module: str,
) -> None:
    """``_compat`` and the settings' modules are leaves (next test): importing them brings
    nothing else."""
    allowed = OUTCOME | {"outcome", "_compat"} | SETTINGS
    found = imports_of(module)
    assert {n for n in found - set(FILES) if not _library(n)} == set()
    assert own(found) - allowed == set()


#: What each of the settings' modules imports of the plugin (``_compat`` aside): the options their
#: parsers, the settings the options and the variables' names; ``parsing`` and ``envvars`` nothing.
SETTINGS_IMPORTS = {"options": {"parsing"}, "settings": {"parsing", "options", "envvars"}}


@pytest.mark.parametrize("module", sorted(in_folder("_compat") | SETTINGS))
def test_compat_and_settings_are_leaves(module: str) -> None:
    leaves = SETTINGS_IMPORTS.get(module, set())
    assert {m for m in own(imports_of(module)) if folder_of(m) != "_compat"} == leaves


#: The shared modules and folders, lowest first: each imports only from its own entry or a lower
#: one. Planning reads markers and decides before any rank starts; ``rank/`` runs in rank
#: processes; ``api/`` is what tests call there; the fixtures hand them to tests. The plugin's
#: gate and the modes sit above them all.
SHARED_ORDER = (
    {"_compat", "parsing", "envvars"},
    {"options"},
    {"settings"},
    {"outcome"},
    {"planning"},
    {"rank"},
    {"tree"},
    {"api"},
    {"markers", "hookspecs", "fixtures", ""},
)


def shared_level(module: str) -> int | None:
    """The index of a module's entry in :data:`SHARED_ORDER` (its folder's, or its own name's at
    the top level); None for the plugin and the modes."""
    folder = folder_of(module)
    key = module if folder == "" else folder
    return next((i for i, names in enumerate(SHARED_ORDER) if key in names), None)


@functools.cache
def imports_in_functions(module: str) -> frozenset[str]:
    """What ``module`` imports inside its functions (:func:`imports_of`, those statements only)."""
    tree = tree_of(FILES[module])
    body: list[ast.stmt] = [
        node
        for function in ast.walk(tree)
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(function)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    ]
    return _imports(ast.Module(body=body, type_ignores=[]), module)


SHARED_LEVELS = {m: shared_level(m) for m in MODULES | PACKAGES}
ORDERED = sorted(m for m, level in SHARED_LEVELS.items() if level is not None)


def test_the_shared_order_names_every_module_but_the_gate_and_the_modes() -> None:
    unordered = {m for m, level in SHARED_LEVELS.items() if level is None}
    assert unordered == {"plugin"} | POOL | LAUNCH
    assert SHARED_LEVELS["planning.spec"] == 4 and SHARED_LEVELS["fixtures"] == 8


@pytest.mark.parametrize("module", ORDERED)
def test_shared_modules_import_nothing_above_them(module: str) -> None:
    level = SHARED_LEVELS[module]
    assert level is not None
    above = {n for n in own(imports_of(module)) if (SHARED_LEVELS.get(n) or 0) > level}
    assert above == set()


@pytest.mark.parametrize("module", ORDERED)
def test_shared_modules_import_other_folders_at_module_level(module: str) -> None:
    """A function-level import between shared folders hid a cycle; the plugin's gate is no shared
    module (its lazy imports pick a mode)."""
    late = own(imports_in_functions(module))
    assert {n for n in late if folder_of(n) != folder_of(module)} == set()


def test_the_late_import_reader_sees_the_gates() -> None:
    assert {"pool.controller", "launch.plugin"} <= imports_in_functions("plugin")
    assert "planning.tierselect" in imports_in_functions("plugin")
    assert imports_in_functions("pool.plan") == set()


def _executed_on_import(tree: ast.Module) -> list[ast.stmt]:
    """The statements that run when the module is imported: the module's and its classes'
    bodies, into ``if``/``try``/``with`` blocks, but not ``if TYPE_CHECKING:`` nor functions."""
    out: list[ast.stmt] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        out.append(node)
        for field in ("body", "orelse", "finalbody", "handlers"):
            for child in getattr(node, field, []):
                if isinstance(child, ast.ExceptHandler):
                    todo.extend(child.body)
                elif isinstance(child, ast.stmt):
                    todo.append(child)
    return [n for n in out if isinstance(n, (ast.Import, ast.ImportFrom))]


@functools.cache
def imports_on_import(module: str) -> frozenset[str]:
    """What importing ``module`` imports (:func:`imports_of`, functions' bodies left out)."""
    tree = tree_of(FILES[module])
    return _imports(ast.Module(body=_executed_on_import(tree), type_ignores=[]), module)


def _torch(names: Set[str]) -> set[str]:
    return {n for n in names if n == "torch" or n.startswith("torch.")}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_torch_at_module_level(module: str) -> None:
    assert _torch(imports_on_import(module)) == set()


@pytest.mark.parametrize("module", sorted(POOL_CONTROLLER | BOTH_SIDES))
def test_pool_modes_controller_side_imports_no_torch(module: str) -> None:
    """The controller never imports torch for gloo: only planning/ and _compat import it, when
    a probe needs it."""
    assert _torch(imports_of(module)) == set()


@pytest.mark.parametrize("module", ["outcome.records", "pool.protocol"])
def test_the_records_and_the_pool_protocol_import_only_the_standard_library(module: str) -> None:
    allowed = {"__future__", "dataclasses", "enum", "mmap", "os", "typing", "outcome.records"}
    assert imports_of(module) <= allowed


def test_the_gate_reads_the_rank_variable_before_it_imports_the_rank_side(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outside pool ranks (the controller, launched ranks) the gate decides from the
    environment alone; a config it would have to read is not even looked at."""
    monkeypatch.delenv(RANK_ENV, raising=False)
    assert plugin._in_rank(object()) is False  # type: ignore[arg-type]


def test_the_rank_variable_is_spelled_once() -> None:
    spelled = [m for m in sorted(MODULES) if "DISTRANK_RANK" in _code(FILES[m].read_text())]
    assert spelled == ["envvars"]


#: The private names ``_compat/`` wraps; no other module's code may spell them. A spelling that
#: starts with ``_`` counts only where no identifier character precedes it, so the public
#: ``set_forkserver_preload`` of multiprocessing is not taken for ``_forkserver``.
PRIVATE_SPELLINGS = (
    # pytest
    "._setupstate",
    "._fixturemanager",
    "._given_basetemp",
    "._ensure_unconfigure",
    "._tw",
    "_tmp_path_factory",
    "_pyfuncitem",
    "_fixtureinfo",
    "_use_item_location",
    "_rewrite_test",
    # other plugins
    "_json_report_extra",
    # CPython
    "_forkserver",
    "_resource_tracker",
    "_start_method",
    "_target",
    "_data",
    # torch
    "_rendezvous_handlers",
    "_dump_fr_trace",
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
    "_register_process_group",
    "_set_global_rank",
    "_pg_map",
    "_resolve_process_group",
    # PyTorch's test harness (torch.testing._internal.common_distributed)
    "common_distributed",
    "_ensure_processes_spawned",
    "_get_world_size",
    "_spawn_processes",
    "_start_processes",
    "_fork_processes",
    "._init_pg",
    "_run_test_given_id",
    "TEST_SKIPS",
    "TEST_ERROR_EXIT_CODE",
    "skip_return_code_checks",
    "special_return_code_checks",
    # pytest-rerunfailures
    "get_reruns_count",
    "get_reruns_delay",
    "_is_rerun_path_excluded",
    "_should_hard_fail_on_error",
    "evaluate_condition",
    "failures_db",
    '"execution_count"',
    # pytest-cov
    '"_cov"',
    "cov_controller",
    "cov_source",
    "cov_branch",
    "cov_config",
)


@functools.cache
def _code(source: str) -> str:
    """``source`` with its comments and docstrings blanked out: what runs."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.add((body[0].lineno, body[0].col_offset))
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    text = list(source)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT or (
            token.type == tokenize.STRING and token.start in docstrings
        ):
            begin = starts[token.start[0] - 1] + token.start[1]
            end = starts[token.end[0] - 1] + token.end[1]
            text[begin:end] = [c if c == "\n" else " " for c in text[begin:end]]
    return "".join(text)


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


COMPAT_FILES = sorted((PACKAGE / "_compat").glob("*.py"))


def test_only_compat_imports_pytest_internals() -> None:
    files = [p for p in PACKAGE.rglob("*.py") if p not in COMPAT_FILES]
    files += sorted(TESTS.rglob("*.py"))
    assert [p.name for p in files if imports_pytest_internals(p)] == []
    assert imports_pytest_internals(PACKAGE / "_compat" / "__init__.py")  # the check sees one


@pytest.mark.parametrize("module", sorted(MODULES - in_folder("_compat")))
def test_only_compat_touches_private_attributes(module: str) -> None:
    code = _code(FILES[module].read_text())
    patterns = {s: (r"(?<!\w)" if s[0] == "_" else "") + re.escape(s) for s in PRIVATE_SPELLINGS}
    assert [s for s, pattern in patterns.items() if re.search(pattern, code)] == []


def test_the_private_spellings_are_found_in_compat() -> None:
    code = "\n".join(_code(p.read_text()) for p in COMPAT_FILES)
    assert [s for s in PRIVATE_SPELLINGS if s not in code] == []


def test_the_code_reader_leaves_out_docstrings_and_comments() -> None:
    source = '"""_init_pg"""\nx = "_cov"  # _get_world_size\ndef f():\n    """TEST_SKIPS"""\n'
    code = _code(source)
    assert '"_cov"' in code and "_init_pg" not in code
    assert "_get_world_size" not in code and "TEST_SKIPS" not in code


def test_compat_exports_every_public_name_of_its_modules() -> None:
    """``_compat.__all__`` is the whole surface callers use (``from .. import _compat``)."""
    public: set[str] = set()
    for path in COMPAT_FILES:
        if path.stem == "__init__":
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                public.add(node.name)
            elif isinstance(node, ast.Assign):
                public.update(t.id for t in node.targets if isinstance(t, ast.Name))
    public = {n for n in public if not n.startswith("_")}
    reprs = {n for n in _compat.__all__ if n.startswith(("Exception", "Repr"))}
    assert set(_compat.__all__) == public | reprs
    assert [n for n in _compat.__all__ if not hasattr(_compat, n)] == []
