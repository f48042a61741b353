"""Unit and property tests of a rank's lean phases (pool/worker/leanphases.py): which hook
implementations allow them, and that a phase skips pytest's reporting exactly when pytest's own
report would have travelled as the compact passed record."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pytest import CallInfo, TestReport

from pytest_distrank.outcome.records import compact_passed
from pytest_distrank.pool.worker.leanphases import (
    LOGREPORT,
    MAKEREPORT,
    PROTOCOL,
    TESTSTATUS,
    Known,
    LeanProtocol,
    quiet_checks,
    read_known,
    record,
)

Phase = Literal["setup", "call", "teardown"]
FIXTURE = settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60)
names = st.text("abcdefgh._<>", min_size=1, max_size=12)
unknown = st.tuples(names, names).filter(
    lambda key: key not in {*MAKEREPORT, *LOGREPORT, *TESTSTATUS}
)


@pytest.fixture
def item(pytester: pytest.Pytester) -> pytest.Item:
    return pytester.getitems("def test_one():\n    pass\n")[0]


@given(st.lists(st.one_of(st.sampled_from(sorted(MAKEREPORT)), unknown), max_size=8))
def test_an_unknown_implementation_takes_pytests_protocol(keys: list[tuple[str, str]]) -> None:
    found = quiet_checks([(key, object()) for key in keys], MAKEREPORT)
    if all(key in MAKEREPORT for key in keys):
        assert found is not None and len(found) == len(keys)
    else:
        assert found is None


def _impl(key: tuple[str, str], wrapper: bool = False) -> Any:
    function = types.SimpleNamespace(__module__=key[0], __qualname__=key[1])
    return types.SimpleNamespace(function=function, plugin=None, wrapper=wrapper, hookwrapper=False)


@given(unknown, st.booleans())
def test_another_protocol_runner_takes_pytests_protocol(
    other: tuple[str, str], wrapper: bool
) -> None:
    """A plugin running the protocol itself (not a wrapper) would be pre-empted: full path."""
    made = [_impl(key) for key in MAKEREPORT]
    logged = [_impl(key) for key in LOGREPORT]
    protocol = [*(_impl(key) for key in PROTOCOL), _impl(other, wrapper)]
    status = [_impl(key) for key in TESTSTATUS]
    known = read_known((protocol, made, logged, status))
    assert (known.conditions is None) == (not wrapper)


@given(st.lists(st.one_of(st.sampled_from(sorted(TESTSTATUS)), unknown), max_size=6))
def test_an_unknown_teststatus_takes_pytests_protocol(keys: list[tuple[str, str]]) -> None:
    """The rank's terminal calls ``pytest_report_teststatus`` from its logreport, which a lean
    phase skips: an unknown implementation may change the report (as the subtests plugin's does
    for a test with a failed subtest)."""
    made = [_impl(key) for key in MAKEREPORT]
    logged = [_impl(key) for key in LOGREPORT]
    protocol = [_impl(key) for key in PROTOCOL]
    known = read_known((protocol, made, logged, [_impl(key) for key in keys]))
    assert (known.conditions is None) == any(key not in TESTSTATUS for key in keys)


class Unknown:
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Any:
        return (yield)


def test_a_plugin_registered_later_is_seen_by_the_next_item(pytester: pytest.Pytester) -> None:
    """The reading is kept while the implementations are the same objects: a plugin registered
    between two items (an unknown makereport) is read for the second, and for the first too
    if asked again (the implementations are read at each question)."""
    first, second = pytester.getitems("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    lean = LeanProtocol(lambda _: None, True)
    before = lean.known(first)
    first.config.pluginmanager.register(Unknown(), "unknown-makereport")
    after = lean.known(second)
    assert after is not before and after.conditions is None
    assert lean.known(first) is after and lean.known(second) is after  # not read again


@FIXTURE
@given(
    when=st.sampled_from(["setup", "call", "teardown"]),
    raises=st.booleans(),
    sections=st.lists(st.tuples(st.sampled_from(["setup", "call"]), names, names), max_size=2),
    properties=st.lists(st.tuples(names, st.integers()), max_size=2),
    quiet=st.lists(st.booleans(), max_size=4),
)
def test_a_phase_is_lean_exactly_when_its_report_would_travel_compact(
    item: pytest.Item,
    when: Phase,
    raises: bool,
    sections: list[tuple[str, str, str]],
    properties: list[tuple[str, int]],
    quiet: list[bool],
) -> None:
    item._report_sections = list(sections)
    item.user_properties = list(properties)

    def condition(answer: bool) -> Callable[[Any, pytest.Item], bool]:
        return lambda plugin, item: answer

    checks = tuple((condition(q), None) for q in quiet)
    protocol = LeanProtocol(lambda _: None, True)
    setattr(protocol, "known", lambda _: Known((), checks))  # noqa: B010 (a method replaced)

    def body() -> None:
        if raises:
            raise ValueError("failed")

    call = CallInfo.from_call(body, when)
    compact = compact_passed(TestReport.from_item_and_call(item, call))
    lean = protocol.plain_pass(item, call)
    assert lean == (compact is not None and all(quiet))
    if lean:
        assert record(call) == compact


def test_a_plugin_registered_during_a_test_is_read_before_its_next_report(
    pytester: pytest.Pytester,
) -> None:
    """A fixture may register a plugin after the item's hooks were read (at its protocol's
    start): once a plugin is registered the item's reading is read again."""
    (first,) = pytester.getitems("def test_one():\n    pass\n")
    lean = LeanProtocol(lambda _: None, True)
    first.config.pluginmanager.register(lean, "lean")
    before = lean.known(first)
    first.config.pluginmanager.register(Unknown(), "unknown-makereport")
    after = lean.known(first)
    assert after is not before and after.conditions is None
    assert not lean.plain_pass(first, CallInfo.from_call(lambda: None, "call"))
