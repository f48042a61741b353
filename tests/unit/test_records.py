"""Unit tests of the compact passing report (records.py ``compact_passed``, and its inverse
``rebuild_passed`` in pool/ownreports.py): a plain passing phase report travels compact and comes
back as pytest made it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import pytest
from pytest import CallInfo, TestReport

from pytest_distrank.outcome.records import compact_passed
from pytest_distrank.pool.ownreports import rebuild_passed

#: The phases of a test, as ``CallInfo.from_call`` types them.
Phase = Literal["setup", "call", "teardown"]


@pytest.fixture
def item(pytester: pytest.Pytester) -> pytest.Item:
    items = pytester.getitems(
        """
        import pytest

        @pytest.mark.world_size(2)
        @pytest.mark.parametrize("x", [1])
        def test_one(x):
            pass
        """
    )
    return items[0]


def _report(item: pytest.Item, when: Phase, func: Callable[[], None] = lambda: None) -> TestReport:
    call = CallInfo.from_call(func, when)
    return TestReport.from_item_and_call(item, call)


@pytest.mark.parametrize("when", ["setup", "call", "teardown"])
def test_a_passing_phase_round_trips(item: pytest.Item, when: Phase) -> None:
    report = _report(item, when)
    compact = compact_passed(report)
    assert compact is not None and compact[:2] == ("passed", when)
    rebuilt = rebuild_passed(item, compact)
    assert rebuilt._to_json() == report._to_json()


def test_anything_more_than_a_plain_pass_travels_in_full(item: pytest.Item) -> None:
    def fail() -> None:
        raise AssertionError("no")

    assert compact_passed(_report(item, "call", fail)) is None
    with_output = _report(item, "call")
    with_output.sections.append(("Captured stdout call", "hello"))
    assert compact_passed(with_output) is None
    with_property = _report(item, "call")
    with_property.user_properties.append(("k", "v"))
    assert compact_passed(with_property) is None
    with_plugin_attribute = _report(item, "call")
    with_plugin_attribute.extras = ["an image"]  # type: ignore[attr-defined]
    assert compact_passed(with_plugin_attribute) is None
    with_other_attribute = _report(item, "call")
    with_other_attribute.mine = []  # type: ignore[attr-defined]
    assert compact_passed(with_other_attribute) is None


def test_pytest_htmls_empty_extras_still_travel_compact(item: pytest.Item) -> None:
    """pytest-html sets ``extras = []`` on every call report: a plain pass all the same, rebuilt
    as pytest made it but for that empty list (pytest-html reads it with a default)."""
    report = _report(item, "call")
    report.extras = []  # type: ignore[attr-defined]
    compact = compact_passed(report)
    assert compact is not None
    rebuilt = rebuild_passed(item, compact)
    assert getattr(rebuilt, "extras", []) == []
    expected = report._to_json()
    expected.pop("extras")
    assert rebuilt._to_json() == expected


def test_rebuild_refuses_what_is_not_a_pass(item: pytest.Item) -> None:
    with pytest.raises(ValueError, match="not a passing phase"):
        rebuild_passed(item, ("failed", "call", 0.0, 0.0, 0.0))
