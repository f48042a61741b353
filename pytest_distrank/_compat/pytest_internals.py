"""Private pytest access: running a test and its fixtures, the session's temporary folders, the
terminal, junitxml, logging, assertion rewriting.

Imported in every process of both modes, through :mod:`pytest_distrank._compat` (the rule and
the other private access are described there).
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import pytest
from _pytest import outcomes
from _pytest._io import TerminalWriter
from _pytest.junitxml import xml_key
from _pytest.runner import runtestprotocol
from _pytest.tmpdir import TempPathFactory

#: pytest.fail's exception (``pytest.fail.Exception`` is no type to a checker).
Failed = outcomes.Failed

# -- running a test and its fixtures -------------------------------------------------------------


def run_test_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """pytest's runtest protocol without logging (launcher ranks run it; no public API; a changed
    signature breaks every launcher-mode test)."""
    runtestprotocol(item, log=False, nextitem=nextitem)


def teardown_exact(session: pytest.Session, nextitem: pytest.Item | None) -> None:
    """Tear down what ``nextitem`` does not need (None: everything), as pytest's teardown phase
    does; without SetupState the controller and ranks cannot keep fixtures in step."""
    session._setupstate.teardown_exact(nextitem)


def setup_stack(session: pytest.Session) -> list[object]:
    """The nodes pytest holds set up, outermost first; if ``stack`` changes shape, the check
    before a rank's next test fails."""
    return list(session._setupstate.stack)


def forget_setup_stack(session: pytest.Session) -> None:
    """Drop every set-up node without tearing it down (after a stuck rank its teardown could
    hang); if ``stack`` goes, launcher mode hangs in teardown after a stuck test."""
    session._setupstate.stack.clear()


def session_fixturedefs(session: pytest.Session, name: str) -> Sequence[Any]:
    """The fixture definitions ``name`` resolves to at session level (no public lookup); a change
    breaks the reset of ``pg``/``backend``/``device`` when a launcher rank replaces its group."""
    manager: Any = session._fixturemanager
    defs: Sequence[Any] = manager.getfixturedefs(name, session) or ()
    return defs


def finish_fixture(fixturedef: Any, session: pytest.Session) -> None:
    """Finish a session fixture (and its dependants) with a stand-in request holding only
    ``node``: high risk, breaks if ``FixtureDef.finish`` reads more of its request."""
    shim: Any = types.SimpleNamespace(node=session)
    fixturedef.finish(shim)


def fixture_info(item: pytest.Item) -> Any | None:
    """The item's resolved fixtures (``_fixtureinfo``; None for items without one): if renamed,
    no test is told that it uses a rank fixture without a world_size marker."""
    return getattr(item, "_fixtureinfo", None)


def request_item(request: pytest.FixtureRequest) -> Any:
    """The test function item a fixture request is for (``_pyfuncitem``, else ``request.node``):
    only names the test in the misuse message."""
    return getattr(request, "_pyfuncitem", request.node)


def skip_exception(reason: str) -> BaseException:
    """A skip reported at the item's location, as a marker's skip is (``_use_item_location`` is a
    private keyword); if removed, every skip decided before a test runs raises TypeError."""
    return pytest.skip.Exception(reason, _use_item_location=True)


# -- session, config, reporting ------------------------------------------------------------------


def getbasetemp(config: pytest.Config) -> Path | None:
    """pytest's basetemp, made on first use (``config._tmp_path_factory``; None when the tmpdir
    plugin is off): if renamed, the session folder moves to the system temp folder."""
    factory = getattr(config, "_tmp_path_factory", None)
    return factory.getbasetemp() if factory is not None else None


def set_basetemp(config: pytest.Config, basetemp: str) -> None:
    """A new basetemp for ``tmp_path`` from now on (``_given_basetemp``, the cached ``_basetemp``
    forgotten): a rank forked from a template must not share the template's; if renamed,
    AttributeError reaches the caller, which then starts the rank afresh."""
    factory: Any = getattr(config, "_tmp_path_factory")  # noqa: B009
    factory._given_basetemp = Path(basetemp)
    factory._basetemp = None


def rank_cache(config: pytest.Config) -> None:
    """``config.cache`` in a rank, where cacheprovider itself is blocked (its last-failed and
    stepwise writes are the controller's): the ``cache`` fixture reads and writes the project's
    cache as an xdist worker's does (``Cache.for_config`` is pytest's own constructor, private by
    its ``_ispytest`` flag; without it the fixture fails with AttributeError, as it did)."""
    config.cache = pytest.Cache.for_config(config, _ispytest=True)


def user_temp_root(config: pytest.Config) -> Path:
    """pytest's ``pytest-of-<user>`` folder, made and checked by pytest's own ``getbasetemp``:
    refused (OSError, pytest's message) when another user owns it or it is a link, made 0700 and
    narrowed to that when wider. It is the parent of this process's numbered basetemp, which this
    makes (``tmp_path`` makes it anyway); without the tmpdir plugin a factory with pytest's
    defaults makes one. Call it only without ``--basetemp``. Private: ``config._tmp_path_factory``
    and ``TempPathFactory(..., _ispytest=True)``; if the numbered folder moves, launcher mode's run
    folder moves with it (still checked by pytest)."""
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None:
        factory = TempPathFactory(None, 3, "all", lambda *args: None, _ispytest=True)
    base: Path = factory.getbasetemp()
    return base.parent


def set_given_basetemp(config: pytest.Config, path: Path) -> None:
    """Give this launcher rank its own ``--basetemp`` (a write to ``_given_basetemp``; nothing
    without the tmpdir plugin): high risk, if ignored the ranks of a node empty each other's."""
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is not None:
        factory._given_basetemp = path


def ensure_unconfigure(config: pytest.Config) -> None:
    """Run pytest's unconfigure (from the launcher watchdog thread, which ends a stuck run): high
    risk, a change leaves plugins unconfigured (or raises, which the caller suppresses)."""
    config._ensure_unconfigure()


def config_parser(config: pytest.Config) -> pytest.Parser:
    """The parser pytest parsed the command line with (``_parser``): a rank forked from a
    template parses it again once its conftests added their options; if renamed, the fork
    fails to start with AttributeError, said for its pool."""
    parser: pytest.Parser = config._parser
    return parser


def load_conftests_late(config: pytest.Config, between: Callable[[], None]) -> set[object]:
    """Load the initial conftests in a session already configured, as a rank started afresh
    loads them before its configure (pool/worker/template.py); return the plugins they added.

    pytest's own ``Config.pytest_load_initial_conftests`` loads them. Their historic
    ``pytest_configure`` (pluggy's ``_call_history``) is held back until ``between()`` (which
    parses their options) ran, so that they read their options as in a fresh start; the plugin
    manager's ``_configured`` is off meanwhile (else a conftest's ``pytest_plugins`` is refused
    as if it were a nested one). High risk if renamed: the fork fails with AttributeError."""
    manager = config.pluginmanager
    hook: Any = config.hook.pytest_configure
    before = set(manager.get_plugins())
    history, hook._call_history = hook._call_history, []
    configured, manager._configured = manager._configured, False
    try:
        config.pytest_load_initial_conftests(early_config=config)
    finally:
        hook._call_history = history
        manager._configured = configured
    between()
    new = set(manager.get_plugins()) - before
    for impl in reversed(hook.get_hookimpls()):  # in pluggy's calling order
        if impl.plugin in new:
            hook._maybe_apply_history(impl)
    return new


def point_faulthandler_plugin(config: pytest.Config, fd: int) -> None:
    """Point the descriptor pytest's faulthandler plugin dumps to (``faulthandler_timeout``; a
    ``dup`` of stderr made at configure, in ``fault_handler_stderr_fd_key``) at ``fd``: a rank
    forked from a template must not dump into the template's log. Without the key: nothing."""
    from _pytest.faulthandler import fault_handler_stderr_fd_key

    dumps_to = config.stash.get(fault_handler_stderr_fd_key, None)
    if dumps_to is not None:
        os.dup2(fd, dumps_to)


def can_redirect_terminal(reporter: object) -> bool:
    """Whether the terminal reporter has the writer :func:`redirect_terminal` replaces (``_tw``);
    when it has not, rank reports go to the terminal as usual."""
    return reporter is not None and hasattr(reporter, "_tw")


def redirect_terminal(reporter: Any, stream: TextIO) -> None:
    """Send a rank's terminal report to ``stream`` (no public way); call only when
    :func:`can_redirect_terminal` said yes."""
    reporter._tw = TerminalWriter(stream)


def terminal_writer(stream: TextIO) -> TerminalWriter:
    """pytest's TerminalWriter over ``stream``, for ``report.toterminal`` (it takes no other):
    if moved, a launcher rank's log loses its failure tracebacks."""
    return TerminalWriter(stream)


def drop_junit_xml(config: pytest.Config) -> None:
    """Unregister junitxml in a launcher rank other than 0 (``xml_key``): if moved, the import of
    this module fails, and every rank would write the same junit file."""
    xml = config.stash.get(xml_key, None)
    if xml is not None:
        config.pluginmanager.unregister(xml)
        del config.stash[xml_key]


def default_plugin_modules() -> list[str]:
    """pytest's built-in plugin modules, preloaded by the fork server; ``[]`` when pytest no
    longer has ``_pytest.config.default_plugins`` (they are then imported by each rank)."""
    try:
        from _pytest.config import default_plugins
    except ImportError:
        return []
    return [f"_pytest.{name}" for name in default_plugins]


def replace_catching_logs(replacement: type) -> bool:
    """Make pytest's logging plugin use ``replacement`` for ``_pytest.logging.catching_logs``;
    False (nothing changed) when this pytest has none, and ranks keep pytest's own."""
    import _pytest.logging

    if not isinstance(getattr(_pytest.logging, "catching_logs", None), type):
        return False
    _pytest.logging.catching_logs = replacement  # type: ignore[misc,assignment]
    return True


def share_rewritten_modules(folder: str) -> Callable[[], None] | None:
    """Keep pytest's assertion-rewritten test modules in ``folder`` when bytecode is not written.

    pytest caches a rewritten module in ``__pycache__`` unless ``sys.dont_write_bytecode``
    (``PYTHONDONTWRITEBYTECODE=1``, ``-B``): then the controller and every rank rewrite each
    test module again (about 1 ms per test per process). With this, the first process to rewrite
    a module writes it to ``folder`` (a session's private folder) and the others read it back,
    as pytest reads its own cache (``_read_pyc`` checks the source's hash, or mtime and size). A
    module pytest's own cache holds already (a run that wrote bytecode left it: an installed
    plugin's, hypothesis's) is read from there, as pytest alone would.
    Wraps ``_pytest.assertion.rewrite.get_cache_dir`` and ``_rewrite_test``; they do nothing new
    when bytecode is written. Returns what undoes it, or None (nothing changed) when this pytest
    lacks them or they are wrapped already.
    """

    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return None
    get_cache_dir = getattr(rewrite, "get_cache_dir", None)
    rewrite_test = getattr(rewrite, "_rewrite_test", None)
    write_pyc = getattr(rewrite, "_write_pyc", None)
    tail = getattr(rewrite, "PYC_TAIL", None)
    key = getattr(rewrite, "assertstate_key", None)
    if not (callable(get_cache_dir) and callable(rewrite_test) and callable(write_pyc)):
        return None
    if tail is None or key is None or getattr(rewrite_test, "_distrank_shared", False):
        return None
    shared = Path(folder)

    def kept(file_path: Path) -> Path:
        return shared.joinpath(*file_path.parts[1:-1])

    def cache_dir(file_path: Path) -> Path:
        own = Path(get_cache_dir(file_path))
        if not sys.dont_write_bytecode or (own / (file_path.name[:-3] + tail)).exists():
            # pytest's own cache, untouched; read where a run that wrote bytecode left one (an
            # installed plugin's modules): pytest reads it even when it writes none
            return own
        return kept(file_path)

    def rewrite_and_keep(fn: Path, config: pytest.Config) -> Any:
        result = rewrite_test(fn, config)
        if sys.dont_write_bytecode:  # pytest will not write it: keep it for the others
            with contextlib.suppress(Exception):
                pyc = kept(fn) / (fn.name[:-3] + tail)
                pyc.parent.mkdir(parents=True, exist_ok=True)
                write_pyc(config.stash[key], result[1], result[0], pyc)
        return result

    def undo() -> None:
        rewrite.get_cache_dir = get_cache_dir
        rewrite._rewrite_test = rewrite_test

    rewrite_and_keep._distrank_shared = True  # type: ignore[attr-defined]
    rewrite.get_cache_dir = cache_dir
    rewrite._rewrite_test = rewrite_and_keep
    return undo


def skip_mark_reason(item: pytest.Item) -> str | None:
    """The reason a ``skip``/``skipif`` marker skips ``item``, evaluated as pytest's skipping
    plugin does at setup (``_pytest.skipping.evaluate_skip_marks``, private); None when none
    applies or a condition fails to evaluate (pytest then reports that error at setup). If it
    moves, skipped distributed tests start their pools again, as before."""
    try:
        from _pytest.skipping import evaluate_skip_marks
    except ImportError:
        return None
    try:
        skipped = evaluate_skip_marks(item)
    except Exception:
        return None
    return None if skipped is None else str(skipped.reason)


@contextlib.contextmanager
def unittest_names(keep: Callable[[type, str], bool]) -> Iterator[None]:
    """While it is entered, pytest's unittest plugin makes the items of a ``TestCase`` class's
    methods that ``keep(cls, name)`` keeps only. Its ``UnitTestCase.collect`` makes an item, and
    an instance of the class, for every name ``unittest.TestLoader().getTestCaseNames`` lists
    (215 for one of PyTorch's RPC classes: 0.1 s of a forked rank's CPU) before pytest keeps the
    one a node id names; the method is wrapped for the while. If pytest stops asking the loader,
    every method is collected again (pytest drops the others by name, as before)."""
    import unittest

    listed = unittest.TestLoader.getTestCaseNames

    def kept(loader: unittest.TestLoader, case: type[unittest.TestCase]) -> Sequence[str]:
        return [name for name in listed(loader, case) if keep(case, name)]

    unittest.TestLoader.getTestCaseNames = kept  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        unittest.TestLoader.getTestCaseNames = listed  # type: ignore[method-assign]
