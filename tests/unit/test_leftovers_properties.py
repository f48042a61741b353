"""Unit, properties: the pure rules of the leftover check (rank/snapshot.py ``diff``, the rank
lists of outcome/merge.py ``rank_ranges``), over generated snapshots and rank sets."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.outcome.merge import RUN, rank_ranges, ranks_words
from pytest_distrank.rank.snapshot import Snapshot, diff

#: Rank sets made of runs (of 1 to 8 consecutive ranks) and single ranks, as groups are.
RANKS = st.lists(st.tuples(st.integers(0, 300), st.integers(1, 8)), min_size=1, max_size=12).map(
    lambda runs: {start + i for start, length in runs for i in range(length)}
)


def _parse(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(", "):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out


def _runs(ranks: set[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return runs


@given(RANKS)
def test_rank_ranges_name_every_rank_once_in_order(ranks: set[int]) -> None:
    """Rule: the ranges read back are exactly the ranks given, ascending, each once."""
    assert _parse(rank_ranges(ranks)) == sorted(ranks)


@given(RANKS)
def test_rank_ranges_write_each_long_run_as_one_range_and_no_other(ranks: set[int]) -> None:
    """Rule: a run of RUN (4) or more consecutive ranks is one ``first-last`` part; a shorter
    run is listed rank by rank; so the text has exactly one part per long run plus one per rank
    of the short runs, and no two parts could be joined."""
    parts = rank_ranges(ranks).split(", ")
    expected = [
        [f"{run[0]}-{run[-1]}"] if len(run) >= RUN else [str(r) for r in run]
        for run in _runs(ranks)
    ]
    assert parts == [part for group in expected for part in group]
    for part in parts:
        if "-" in part:
            first, last = map(int, part.split("-"))
            assert last - first + 1 >= RUN


@given(RANKS)
def test_ranks_words_say_rank_for_one_and_ranks_for_more(ranks: set[int]) -> None:
    """Rule: one rank reads ``rank N``; several read ``ranks ...``; the order given and
    repeats do not matter."""
    words = ranks_words([*sorted(ranks, reverse=True), *ranks])
    assert words == ("rank " if len(ranks) == 1 else "ranks ") + rank_ranges(ranks)
    assert ranks_words(range(128)) == "ranks 0-127"


KEYS = st.sampled_from(["a", "b", "c", 1, 2, (3, "x")])
VALUES = st.one_of(st.integers(-3, 3), st.sampled_from(["x", "y", ""]), st.booleans())
CATEGORY = st.dictionaries(KEYS, VALUES, max_size=4)
FIELDS = [f.name for f in dataclasses.fields(Snapshot)]


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    """A snapshot with a few categories filled (the others empty): values absent read None."""
    filled = draw(st.sets(st.sampled_from(FIELDS), max_size=3))
    return Snapshot(**{name: draw(CATEGORY) if name in filled else {} for name in FIELDS})


class Raises:
    """A value whose comparison raises (a lazy module proxy, a tensor's ``==``)."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparison")

    __hash__ = object.__hash__


def _apply(after: Snapshot, changes: list[tuple[tuple[str, Any], Any]]) -> Snapshot:
    back = after.copy()
    for (category, key), value in changes:
        values = getattr(back, category)
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value
    return back


@given(snapshots(), snapshots())
def test_the_diff_lists_every_changed_key_once_with_its_value_before(
    before: Snapshot, after: Snapshot
) -> None:
    """Rule: (category, key) is in the diff iff its value differs (absent reads None), once,
    with the value before; putting those values back turns ``after`` into ``before``."""
    changes = list(diff(before, after))
    keys = [key for key, _ in changes]
    assert len(keys) == len(set(keys))
    for name in FIELDS:
        old, new = getattr(before, name), getattr(after, name)
        for key in {*old, *new}:
            differs = old.get(key) != new.get(key)
            assert ((name, key) in keys) == differs
    for (name, key), value in changes:
        assert value == getattr(before, name).get(key)
    assert _apply(after, changes) == before
    assert list(diff(before, before.copy())) == []


def test_a_value_that_cannot_be_compared_counts_as_changed_unless_it_is_the_same() -> None:
    """A value whose ``==`` raises is unchanged only if it is the same object; the diff never
    raises (a whole category holding one is compared key by key)."""
    before = Snapshot(**{name: {} for name in FIELDS})
    before.torch.update(odd=Raises(), plain=1)
    same = before.copy()
    assert list(diff(before, same)) == []
    same.torch["odd"] = Raises()
    assert [key for key, _ in diff(before, same)] == [("torch", "odd")]


def test_rank_ranges_examples() -> None:
    assert rank_ranges([5, 0, 1, 2, 3, 7]) == "0-3, 5, 7"
    assert rank_ranges([0, 1, 2]) == "0, 1, 2"
    assert re.fullmatch(r"ranks 0-127", ranks_words(list(range(128))))
