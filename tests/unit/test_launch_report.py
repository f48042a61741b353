"""Unit tests of launcher mode's report (launch/report.py): the collection comparison of ranks."""

from __future__ import annotations

from pytest_distrank.launch.report import collection_mismatch


def test_collection_mismatch_names_the_ranks_and_node_ids() -> None:
    same = ["t.py::a", "t.py::b"]
    assert collection_mismatch({0: same, 1: list(same)}, "2 ranks, torchrun") is None
    text = collection_mismatch({0: same, 1: same, 2: ["t.py::a"], 3: ["t.py::b", "t.py::a"]}, "w")
    assert text is not None
    assert "rank(s) 2, 3 collected others" in text
    assert "rank 2: 1 test; not 1 of rank 0's: t.py::b" in text
    assert "rank 3: the same tests in another order; at position 0 it has t.py::b" in text
