"""Unit tests of the teardown of what an earlier test left set up in a rank (rank/hygiene.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pytest_distrank.rank.hygiene import Leftovers, kept_by, leftover_message


def test_the_nodes_a_next_test_keeps_set_up() -> None:
    chain = ["", "", "sub", "sub/test_a.py", "sub/test_a.py::TestX", "sub/test_a.py::TestX::t[1]"]
    assert kept_by(chain, "sub/test_a.py::TestX::t[10]") == 5
    assert kept_by(chain, "sub/test_a.py::test_plain") == 4
    assert kept_by(chain, "sub/test_b.py::t") == 3
    assert kept_by(chain, "other/test_c.py::t") == 2
    assert kept_by(["", "test_ab.py"], "test_a.py::t") == 1


def test_a_leftover_teardown_error_says_whose_fixtures_and_why_here() -> None:
    text = leftover_message(["test_a.py::TestX", "test_a.py"], "test_a.py::TestX::t[1]", "x::y")
    assert text.splitlines() == [
        "tearing down test_a.py::TestX, test_a.py failed: left set up after "
        "test_a.py::TestX::t[1], this rank's previous test, kept for x::y, which this rank was "
        "told came next.",
        "pytest reports this error at the teardown of test_a.py::TestX::t[1]; that test had "
        "already been reported, so the error is reported at the teardown of this one.",
    ]
    assert leftover_message(["test_a.py"], "", None) == "tearing down test_a.py failed"


class _SetupState:
    """pytest's SetupState as teardown_left uses it: the set-up nodes, torn down for an item."""

    def __init__(self, nodes: list[str], fail: bool = False) -> None:
        self.stack = dict.fromkeys(nodes)
        self.fail = fail

    def teardown_exact(self, nextitem: Any) -> None:
        if self.fail:
            raise RuntimeError("a finalizer failed")
        for node in [n for n in self.stack if n not in nextitem.listchain()]:
            del self.stack[node]


def _item(chain: list[str], state: _SetupState) -> Any:
    return SimpleNamespace(
        nodeid=chain[-1], listchain=lambda: chain, session=SimpleNamespace(_setupstate=state)
    )


def test_before_says_whether_user_code_ran_between_two_tests() -> None:
    """Rule (the leftover check's start reuses the last teardown's snapshot only when False):
    True when something left set up was torn down before the test, or its teardown failed;
    False when the rank tore down for the right next test."""
    chain = ["", "test_a.py", "test_a.py::t2"]
    kept = _SetupState(["", "test_a.py"])
    assert Leftovers().before(_item(chain, kept), None) is False
    left = _SetupState(["", "test_b.py"])
    assert Leftovers().before(_item(chain, left), None) is True
    assert list(left.stack) == [""]
    failing = Leftovers()
    assert failing.before(_item(chain, _SetupState(["", "test_b.py"], fail=True)), None) is True
    assert failing.error is not None
