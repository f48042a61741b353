"""Unit tests of the teardown of what an earlier test left set up in a rank (rank/hygiene.py)."""

from __future__ import annotations

from pytest_distrank.rank.hygiene import kept_by, leftover_message


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
