"""End-to-end: a rank's lean phases (pool/worker/leanphases.py) give the outcomes pytest's own
protocol gives.

Two inner sessions over one varied file, run side by side: ``LEAN`` as a user runs it, ``FULL``
with ``DISTRANK_LEAN_PHASES=0`` (every phase through pytest's reporting hooks). The file has
fixtures of every scope, parametrized and class tests, printed output, ``capsys``, logs and
``caplog``, a warning, ``record_property``, ``tmp_path``, skip, skipif and xfail marks (strict
and not), a skip inside the test, a failing assert on one rank, errors at setup and teardown, a
folder whose ``conftest.py`` implements ``pytest_runtest_logreport`` (its tests must take the full
path), a module whose fixture registers a plugin that fails the test it runs for, a folder whose
``conftest.py`` wraps ``pytest_runtest_teardown``, and a property whose value changes a logger
as it is pickled. The junit reports and the terminal's outcome lines must be the same, and the
lean path must have been taken where it applies: a rank's own terminal (its ``.pytest.log``,
under ``-v``) writes a lean test's node id but not its outcome word. What the conftest hooks and
the pickling change after a test is no leftover of the next one (its start is read, not taken
from the last end).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from ..helpers import SharedSession
from .test_faults import JUNIT, Session, Shared

VARIED = """
import logging, warnings
import pytest, torch, torch.distributed as dist


@pytest.fixture(scope="session")
def session_fx():
    yield "s"


@pytest.fixture(scope="module")
def module_fx(rank):
    yield rank


@pytest.fixture
def function_fx():
    yield 1


@pytest.fixture
def broken_setup():
    raise RuntimeError("setup broke")


@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown broke")


@pytest.mark.world_size(2)
def test_plain(rank, pg, session_fx, module_fx, function_fx):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2 and module_fx == rank


@pytest.mark.world_size(2)
@pytest.mark.parametrize("n", [1, 2])
def test_param(rank, n):
    assert n > 0


class TestGrouped:
    @pytest.fixture(scope="class")
    def class_fx(self):
        yield "c"

    @pytest.mark.world_size(2)
    def test_in_class(self, rank, class_fx):
        assert class_fx == "c"


@pytest.mark.world_size(2)
def test_prints(rank):
    print(f"printed on rank {rank}")


@pytest.mark.world_size(2)
def test_capsys(rank, capsys):
    print("read back")
    assert capsys.readouterr().out == "read back\\n"


@pytest.mark.world_size(2)
def test_logs(rank):
    logging.getLogger("lean").warning("logged on rank %d", rank)


@pytest.mark.world_size(2)
def test_caplog(rank, caplog):
    logging.getLogger("lean").warning("seen by caplog")
    assert "seen by caplog" in caplog.text


@pytest.mark.world_size(2)
def test_warns(rank):
    warnings.warn(UserWarning("a lean warning"))


@pytest.mark.world_size(2)
def test_property(rank, record_property):
    record_property("seen", "yes")


@pytest.mark.world_size(2)
def test_tmp_path(rank, tmp_path):
    (tmp_path / "f").write_text("x")


@pytest.mark.world_size(2)
@pytest.mark.skip(reason="skipped by mark")
def test_skipped(rank):
    pass


@pytest.mark.world_size(2)
@pytest.mark.skipif("True", reason="skipif true")
def test_skipif(rank):
    pass


@pytest.mark.world_size(2)
def test_skip_inside(rank):
    pytest.skip("skipped inside")


@pytest.mark.world_size(2)
@pytest.mark.xfail(reason="expected to fail")
def test_xfail(rank):
    assert False


@pytest.mark.world_size(2)
@pytest.mark.xfail(reason="passes anyway")
def test_xpass(rank):
    pass


@pytest.mark.world_size(2)
@pytest.mark.xfail(reason="strict", strict=True)
def test_xpass_strict(rank):
    pass


@pytest.mark.world_size(2)
def test_fails_on_rank_1(rank):
    assert rank == 0, "only rank 0 passes"


@pytest.mark.world_size(2)
def test_setup_error(rank, broken_setup):
    pass


@pytest.mark.world_size(2)
def test_teardown_error(rank, broken_teardown):
    pass


@pytest.mark.world_size(2)
def test_last(rank, pg):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2
"""

#: A conftest hook: the tests beside it must take pytest's own protocol, and a change it makes
#: after a test's teardown (its report) is no leftover of the next test.
HOOKED_CONFTEST = """
import logging


def pytest_runtest_logreport(report):
    if report.when == "teardown" and report.nodeid.endswith("test_hooked"):
        logging.getLogger("hooked").setLevel(logging.ERROR)
"""
HOOKED = """
import pytest


@pytest.mark.world_size(2)
def test_warm_up(rank):
    pass  # the first test of a pool imports what later ones find imported


@pytest.mark.world_size(2)
def test_hooked(rank):
    pass


@pytest.mark.world_size(2)
def test_hooked_next(rank):
    pass
"""

#: A plugin that a fixture registers during the test it judges: read before the test's reports
#: (its eligibility was read before the fixture ran).
REGISTERED = """
import pytest


class FailsTheFirst:
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        first = item.name == "test_registered_first"
        if call.when == "call" and first and item.funcargs["rank"] == 1:
            report.outcome = "failed"
            report.longrepr = "failed by a plugin its fixture registered"
        return report


@pytest.fixture(scope="module", autouse=True)
def registers(request):
    plugin = FailsTheFirst()
    request.config.pluginmanager.register(plugin, "fails-the-first")
    yield
    request.config.pluginmanager.unregister(plugin)


@pytest.mark.world_size(2)
def test_registered_first(rank):
    pass
"""

#: A conftest.py loaded during collection registers after the leftover check: its teardown
#: wrapper wraps the check's, and what it changes after the teardown is no leftover of the next.
WRAPPED_CONFTEST = """
import logging
import pytest


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item):
    try:
        return (yield)
    finally:
        if item.name == "test_wrapped_first":
            logging.getLogger("wrapped").setLevel(logging.ERROR)
"""
WRAPPED = """
import pytest


@pytest.mark.world_size(2)
def test_wrapped_first(rank):
    pass


@pytest.mark.world_size(2)
def test_wrapped_next(rank):
    pass
"""

#: A property whose value changes a logger as the rank pickles it, after the test's end: no
#: leftover of the next test.
PICKLED = """
import logging
import pytest


class Value:
    def __reduce__(self):
        logging.getLogger("pickled").setLevel(logging.ERROR)
        return (str, ("value",))


@pytest.mark.world_size(2)
def test_pickled_first(rank, record_property):
    record_property("pickled", Value())


@pytest.mark.world_size(2)
def test_pickled_next(rank):
    pass
"""

FILES = {
    "test_varied.py": VARIED,
    "hooked/conftest.py": HOOKED_CONFTEST,
    "hooked/test_hooked.py": HOOKED,
    "test_registered.py": REGISTERED,
    "wrapped/conftest.py": WRAPPED_CONFTEST,
    "wrapped/test_wrapped.py": WRAPPED,
    "test_pickled.py": PICKLED,
}
ARGS = ("-v", "-rA", "-p", "no:randomly", "-o", "junit_logging=all")
FULL = Session("lean-full", FILES, ARGS, env={"DISTRANK_LEAN_PHASES": "0"})
LEAN = Session("lean", FILES, ARGS, beside=(FULL,))
#: The terminal's outcome lines: ``-v`` progress, the ``-rA`` short summary, the warning.
WORDS = "PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS"
OUTCOME = re.compile(rf"^({WORDS}) |::\S+ ({WORDS})\b|a lean warning")
#: What differs between two runs of the same tests: durations, addresses, temporary folders,
#: pids, and the root cause among ranks that all failed the same way at once (the first report
#: to arrive: a strict xfail that passed on both ranks names either).
NOISE = re.compile(
    r"\d+\.\d+ ?s\b|0x[0-9a-f]+|\[ *\d+%\]|/\S*pytest-\S*|pid \d+|rank \d/2\] (?=\[XPASS)"
)


@pytest.fixture
def lean(shared_session: SharedSession) -> Shared:
    return LEAN.run(shared_session)


@pytest.fixture
def full(shared_session: SharedSession) -> Shared:
    return LEAN.run_beside(shared_session, FULL)


def junit_cases(session: Shared) -> dict[str, Any]:
    """Per test case: its outcome elements (tag, message), properties and captured output."""
    root = ET.parse(session.folder / JUNIT).getroot()
    cases: dict[str, Any] = {}
    for case in root.iter("testcase"):
        key = f"{case.get('classname')}::{case.get('name')}"
        cases[key] = [
            (
                child.tag,
                NOISE.sub("~", child.get("message", "")),
                sorted(
                    (p.get("name"), NOISE.sub("~", p.get("value", "")))
                    for p in child.iter("property")
                ),
                NOISE.sub("~", child.text or "") if child.tag.startswith("system") else "",
            )
            for child in case
        ]
    return cases


def outcome_lines(session: Shared) -> list[str]:
    lines = [NOISE.sub("~", line) for line in session.result.outlines if OUTCOME.search(line)]
    final = session.result.outlines[-1]
    return [*lines, NOISE.sub("~", final)]


def test_the_junit_reports_are_the_same(lean: Shared, full: Shared) -> None:
    lean_cases, full_cases = junit_cases(lean), junit_cases(full)
    # 21 of the varied file (one parametrized twice), 3 hooked, 1 registered, 2 wrapped, 2 pickled
    assert len(lean_cases) == 29
    assert lean_cases == full_cases


def test_the_outcome_lines_are_the_same(lean: Shared, full: Shared) -> None:
    lines = outcome_lines(lean)
    assert lines == outcome_lines(full)
    final = lines[-1]
    for count in ("3 failed", "20 passed", "3 skipped", "1 xfailed", "1 xpassed", "2 errors"):
        assert count in final, final
    assert any("a lean warning" in line for line in lines)


def _rank_terminal(session: Shared) -> str:
    logs = sorted(session.folder.rglob("pool*-rank*.pytest.log"))
    assert logs, f"no rank terminal log under {session.folder}"
    return "\n".join(log.read_text() for log in logs)


def test_the_lean_path_is_taken_where_every_reporting_hook_is_known(
    lean: Shared, full: Shared
) -> None:
    passed = re.compile(r"::test_plain\S* PASSED")
    hooked = re.compile(r"::test_hooked\S* PASSED")
    lean_log, full_log = _rank_terminal(lean), _rank_terminal(full)
    assert "test_plain" in lean_log and not passed.search(lean_log)
    assert hooked.search(lean_log)  # a conftest.py hook: pytest's own protocol
    assert passed.search(full_log) and hooked.search(full_log)


#: Who the summary says changed what changed between two tests.
BETWEEN_WHO = "code outside both tests (a fixture torn down there, a hook, a __del__)"


def test_what_a_conftest_hook_changes_after_a_test_is_named_between_the_tests(
    lean: Shared, full: Shared
) -> None:
    """The hook sets a logger's level after ``test_hooked``'s teardown: no leftover of the next
    test (its start is read after it), named on a line of its own between the two
    (rank/between.py); so are a teardown wrapper's outside the leftover check's, and a
    property's value's as it is pickled."""
    pairs = {
        "hooked": ("hooked/test_hooked.py::test_hooked", "test_hooked_next"),
        "wrapped": ("wrapped/test_wrapped.py::test_wrapped_first", "test_wrapped_next"),
        "pickled": ("test_pickled.py::test_pickled_first", "test_pickled_next"),
    }
    for session in (lean, full):
        for logger, (first, name) in pairs.items():
            then = first.rpartition("::")[0] + "::" + name
            assert session.outcome(name) == "passed"
            line = f"leftovers: between {first} and {then}, {BETWEEN_WHO} left logger '{logger}': "
            assert line + "level ERROR (not restored) on ranks 0, 1" in session.result.outlines
        outlines = session.result.outlines
        credited = [line for line in outlines if re.match(r"leftovers: \S+ left", line)]
        assert not credited, credited


def test_a_plugin_registered_during_a_test_reports_on_it(lean: Shared, full: Shared) -> None:
    """Its ``makereport`` fails the test: the lean path must read it before the call's report."""
    for session in (lean, full):
        assert session.outcome("test_registered_first") == "failed"
        assert "failed by a plugin its fixture registered" in session.text
