"""A test's phases without pytest's per-phase reporting where it would only say "passed".

Runs in each rank process of a pool: :class:`LeanProtocol` is a plugin that :mod:`main`
registers. pytest's protocol (``_pytest.runner``) runs each phase through its hook (setup, call,
teardown: every plugin's wrappers, capture, log capture, skipping, seeding, the leftover checks)
and then makes a ``TestReport`` through ``pytest_runtest_makereport`` and logs it through
``pytest_runtest_logreport``, about a third of a warm rank's CPU per trivial test. Here the
phases run exactly as there; only a phase that passed plainly (nothing raised, no output or log
captured in any phase so far, no ``xfail`` mark, no ``user_properties``, no failed subtest:
pytest's subtests plugin fails such a call report as the rank's terminal logs it) skips the two
reporting hooks, and its compact passed record (``outcome.records.PassedPhase``, what the rank
sends for such a report anyway) is made at once. Anything else goes through pytest's own hooks.

That is sound only where every implementation of those two hooks is known to do nothing for such
a phase beyond making and logging the report (:data:`MAKEREPORT`, :data:`LOGREPORT`; a condition
says where one does something for some tests), and where nothing but pytest's runner would run
the protocol: otherwise (a ``conftest.py`` or an unknown plugin implements one of them, a
unittest item, ``--setup-only``/``--setup-show``) the test runs pytest's own protocol; a plugin
registered while a test runs (a fixture may register one) is read before the next phase's
reporting. What a lean phase leaves out on purpose: the rank's own terminal line for it (its
``.pytest.log`` progress letters; the controller's terminal is unchanged).
``DISTRANK_LEAN_PHASES=0`` turns it off (envvars.py; the equivalence test runs a varied file
both ways).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import pytest

from ... import _compat
from ...outcome.records import PassedPhase

When = Literal["setup", "call", "teardown"]
#: Whether one known implementation would do nothing beyond the report for a passing phase of
#: ``item``: (its plugin, the item) -> True where it is quiet.
Quiet = Callable[[Any, pytest.Item], bool]


def _always(plugin: Any, item: pytest.Item) -> bool:
    return True


#: The known ``pytest_runtest_makereport`` implementations, by (module, qualified name): when
#: each is quiet for a passing phase of a plain test function.
MAKEREPORT: dict[tuple[str, str], Quiet] = {
    # Makes the report: the compact record stands for it.
    ("_pytest.runner", "pytest_runtest_makereport"): _always,
    # Only for unittest items, which never take the lean path.
    ("_pytest.unittest", "pytest_runtest_makereport"): _always,
    # Decides xfail outcomes: only with an xfail mark that applies.
    ("_pytest.skipping", "pytest_runtest_makereport"): lambda p, i: not _compat.xfail_evaluated(i),
    # Records the phase's outcome for tmp_path's retention: recorded here too (LeanProtocol).
    ("_pytest.tmpdir", "pytest_runtest_makereport"): _always,
    # Moves the extras fixture's extras onto the call report; ``extras = []`` otherwise.
    ("pytest_html.plugin", "pytest_runtest_makereport"): (
        lambda p, i: not _compat.html_extras_pending(i.config)
    ),
    # Sections and statistics of hypothesis tests, read from attributes on the item.
    ("_hypothesis_pytestplugin", "pytest_runtest_makereport"): (
        lambda p, i: not _compat.hypothesis_reports(i)
    ),
    # The plugin's own: a failure's crash line, its verdicts, skips of gloo fallbacks, and the
    # process tree's sections (only for a test it watches).
    ("pytest_distrank.pool.worker.suiterank", "SuiteRunner.pytest_runtest_makereport"): _always,
    ("pytest_distrank.pool.worker.rankreruns", "RankVerdicts.pytest_runtest_makereport"): _always,
    ("pytest_distrank.pool.worker.rankgpu", "GlooFallback.pytest_runtest_makereport"): _always,
    ("pytest_distrank.tree.plugin", "TreePlugin.pytest_runtest_makereport"): (
        lambda p, i: i.nodeid not in p.active
    ),
}
#: The known ``pytest_runtest_logreport`` implementations: none acts on a plain pass in a rank.
LOGREPORT: dict[tuple[str, str], Quiet] = {
    # The rank's own: it keeps the record (LeanProtocol hands it over).
    ("pytest_distrank.pool.worker.main", "WorkerPlugin.pytest_runtest_logreport"): _always,
    # The rank's progress letters in its .pytest.log (left out on purpose).
    ("_pytest.terminal", "TerminalReporter.pytest_runtest_logreport"): _always,
    # Live logging's section name (the next phase sets its own).
    ("_pytest.logging", "LoggingPlugin.pytest_runtest_logreport"): _always,
    # Counts failures (maxfail).
    ("_pytest.main", "Session.pytest_runtest_logreport"): _always,
    # The last-failed cache: a rank never saves it (it runs as an xdist worker would).
    ("_pytest.cacheprovider", "LFPlugin.pytest_runtest_logreport"): _always,
    # Stepwise: failures only.
    ("_pytest.stepwise", "StepwisePlugin.pytest_runtest_logreport"): _always,
    # pytest-rerunfailures under xdist: reruns only.
    ("pytest_rerunfailures", "XDistHooks.pytest_runtest_logreport"): _always,
}
#: The known ``pytest_report_teststatus`` implementations (the rank's terminal calls them from
#: its ``logreport``, which a lean phase skips): each pure for a plain pass, but the subtests
#: plugin's, which turns a passing call with a failed subtest into a failure.
TESTSTATUS: dict[tuple[str, str], Quiet] = {
    ("_pytest.terminal", "pytest_report_teststatus"): _always,
    ("_pytest.runner", "pytest_report_teststatus"): _always,
    ("_pytest.skipping", "pytest_report_teststatus"): _always,
    ("pytest_rerunfailures", "pytest_report_teststatus"): _always,
    ("_pytest.subtests", "pytest_report_teststatus"): lambda p, i: not _compat.failed_subtests(i),
}
#: The plain implementations of ``pytest_runtest_protocol`` that may stand beside this one
#: (wrappers around it run as ever).
PROTOCOL = frozenset(
    {
        ("_pytest.runner", "pytest_runtest_protocol"),
        ("pytest_distrank.pool.worker.leanphases", "LeanProtocol.pytest_runtest_protocol"),
    }
)


#: The hooks whose implementations decide (their lists, compared by identity, key the reading).
READ_HOOKS = (
    "pytest_runtest_protocol",
    "pytest_runtest_makereport",
    "pytest_runtest_logreport",
    "pytest_report_teststatus",
)


@dataclasses.dataclass(frozen=True)
class Known:
    """What an item's hook implementations allow: read once per set of implementations."""

    #: The implementations of :data:`READ_HOOKS` it was read from.
    impls: tuple[list[Any], ...]
    #: The conditions of the reporting hooks' implementations that are not always quiet, or
    #: None: one is unknown (or another plugin runs the protocol): pytest's own protocol.
    conditions: tuple[tuple[Quiet, Any], ...] | None


def identity(function: Any) -> tuple[str, str]:
    """(module, qualified name) of a hook implementation's function."""
    return (str(getattr(function, "__module__", "")), str(getattr(function, "__qualname__", "")))


def quiet_checks(
    impls: list[tuple[tuple[str, str], Any]], known: dict[tuple[str, str], Quiet]
) -> list[tuple[Quiet, Any]] | None:
    """Each implementation's condition with its plugin, or None when one is unknown."""
    found = []
    for key, plugin in impls:
        quiet = known.get(key)
        if quiet is None:
            return None
        found.append((quiet, plugin))
    return found


def read_known(impls: tuple[list[Any], ...]) -> Known:
    """What the implementations of :data:`READ_HOOKS` allow (see :class:`Known`)."""
    protocol, made, logged, status = (
        [(identity(impl.function), impl) for impl in hook] for hook in impls
    )
    plain = [key for key, impl in protocol if not (impl.wrapper or impl.hookwrapper)]
    checks = [
        quiet_checks([(key, impl.plugin) for key, impl in found], known)
        for found, known in ((made, MAKEREPORT), (logged, LOGREPORT), (status, TESTSTATUS))
    ]
    conditions = None
    if all(key in PROTOCOL for key in plain) and all(c is not None for c in checks):
        conditions = tuple(c for found in checks for c in found or () if c[0] is not _always)
    return Known(impls, conditions)


def record(call: pytest.CallInfo[None]) -> PassedPhase:
    """A lean phase's compact record: what ``compact_passed`` makes of pytest's report."""
    return ("passed", call.when, call.duration, call.start, call.stop)


class LeanProtocol:
    """The rank's ``pytest_runtest_protocol`` for eligible items (pytest's runner for the rest)."""

    def __init__(self, keep: Callable[[PassedPhase], None], enabled: bool) -> None:
        #: Hands a lean phase's record to the rank (``WorkerPlugin.passed``).
        self.keep = keep
        self.enabled = enabled and _compat.lean_run_available()
        #: The last reading of hook implementations (most items share one).
        self.last: Known | None = None
        #: What a phase's call lets through (``Exit``; ``KeyboardInterrupt`` unless ``--pdb``).
        self.reraise: tuple[type[BaseException], ...] | None = None

    def known(self, item: pytest.Item) -> Known:
        """What ``item``'s hooks allow now (pytest's, every plugin's, those of the
        ``conftest.py`` files above it, and a plugin registered during the test: a fixture may
        register one): read again only where the implementations differ from the last read."""
        ihook = item.ihook
        impls = tuple(getattr(ihook, name).get_hookimpls() for name in READ_HOOKS)
        last = self.last
        if last is None or last.impls != impls:
            last = self.last = read_known(impls)
        return last

    def eligible(self, item: pytest.Item) -> bool:
        """Whether ``item`` runs here: a plain test function, every reporting hook known."""
        option = item.config.option
        return (
            self.enabled
            and type(item) is pytest.Function
            and not getattr(option, "setuponly", False)
            and not getattr(option, "setupshow", False)
            and self.known(item).conditions is not None
        )

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        if not self.eligible(item):
            return None  # pytest's runner
        ihook = item.ihook
        ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        has_request = _compat.start_request(item)
        try:
            if self._phase(item, "setup"):
                self._phase(item, "call")
            if item.session.shouldfail or item.session.shouldstop:
                nextitem = None
            self._phase(item, "teardown", nextitem=nextitem)
        finally:
            if has_request:
                _compat.drop_request(item)
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def _phase(self, item: pytest.Item, when: When, **kwds: Any) -> bool:
        """One phase as pytest's ``call_and_report``; whether it passed."""
        ihook = item.ihook
        hook = getattr(ihook, f"pytest_runtest_{when}")
        call = pytest.CallInfo.from_call(
            lambda: hook(item=item, **kwds),
            when=when,
            reraise=self._reraise(item.config),
        )
        if self.plain_pass(item, call):
            _compat.note_tmp_path_passed(item, when)
            self.keep(record(call))
            return True
        report: pytest.TestReport = ihook.pytest_runtest_makereport(item=item, call=call)
        ihook.pytest_runtest_logreport(report=report)
        if _compat.interactive_exception(call, report):
            ihook.pytest_exception_interact(node=item, call=call, report=report)
        return report.passed

    def _reraise(self, config: pytest.Config) -> tuple[type[BaseException], ...]:
        if self.reraise is None:
            self.reraise = _compat.reraise_exceptions(config)
        return self.reraise

    def plain_pass(self, item: pytest.Item, call: pytest.CallInfo[None]) -> bool:
        """Whether the phase's report would be a plain pass that every reporting hook passes
        over: what :func:`outcome.records.compact_passed` would send for it."""
        if call.excinfo is not None or item.user_properties:
            return False
        if _compat.has_report_sections(item):
            return False
        conditions = self.known(item).conditions
        if conditions is None:  # a plugin registered during the test implements one
            return False
        return all(quiet(plugin, item) for quiet, plugin in conditions)
