"""Unit: which of the ranks' warnings are the same warning, and how each is shown
(outcome/warnings.py ``merge_warnings``; properties over generated records, Hypothesis)."""

from __future__ import annotations

import re
import warnings

from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.outcome.records import WarningRecord
from pytest_distrank.outcome.warnings import _warning, merge_warnings, ranks_named, warning_record

#: Records from few values per field, so that ranks often raise the same one and records often
#: differ in one field only (the same words from another line, another category).
RECORDS = st.tuples(
    st.sampled_from(["builtins", "mod"]),
    st.sampled_from(["UserWarning", "DeprecationWarning"]),
    st.sampled_from(["a", "b"]),
    st.sampled_from(["t.py", "u.py"]),
    st.integers(1, 2),
)


@st.composite
def worlds(draw: st.DrawFn) -> tuple[dict[int, list[WarningRecord]], int]:
    """A world size and what its ranks sent (a rank may send nothing, or be absent)."""
    world_size = draw(st.integers(1, 6))
    ranks = draw(st.sets(st.integers(0, world_size - 1)))
    return {rank: draw(st.lists(RECORDS, max_size=5)) for rank in sorted(ranks)}, world_size


def _ranks(words: str, world_size: int) -> list[int]:
    one = re.fullmatch(rf"rank (\d+)/{world_size}", words)
    if one:
        return [int(one.group(1))]
    many = re.fullmatch(rf"ranks (.+) of {world_size}", words)
    assert many, words
    return _expand(many.group(1))


def _expand(words: str) -> list[int]:
    """``0-3, 5`` -> ``[0, 1, 2, 3, 5]``."""
    out: list[int] = []
    for part in words.split(", "):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out


@given(worlds())
def test_each_distinct_record_once_in_first_seen_order(
    world: tuple[dict[int, list[WarningRecord]], int],
) -> None:
    per_rank, world_size = world
    seen = list(dict.fromkeys(r for rank in sorted(per_rank) for r in per_rank[rank]))
    assert [record for record, _ in merge_warnings(per_rank, world_size)] == seen


@given(worlds())
def test_unnamed_exactly_when_every_rank_raised_it(
    world: tuple[dict[int, list[WarningRecord]], int],
) -> None:
    per_rank, world_size = world
    for record, words in merge_warnings(per_rank, world_size):
        raised = [rank for rank in sorted(per_rank) if record in per_rank[rank]]
        if words is None:
            assert raised == list(range(world_size))
        else:
            assert raised != list(range(world_size))
            assert _ranks(words, world_size) == raised


def test_the_same_words_from_another_line_or_category_are_another_warning() -> None:
    a = ("builtins", "UserWarning", "a", "t.py", 3)
    other_line = ("builtins", "UserWarning", "a", "t.py", 4)
    other_category = ("builtins", "DeprecationWarning", "a", "t.py", 3)
    merged = merge_warnings({0: (a, other_line), 1: (a, a, other_category)}, 2)
    assert merged == [(a, None), (other_line, "rank 0/2"), (other_category, "rank 1/2")]
    assert merge_warnings({0: (a,), 2: (a,)}, 3) == [(a, "ranks 0, 2 of 3")]
    assert merge_warnings({r: (a,) for r in (0, 1, 2, 3, 5)}, 6) == [(a, "ranks 0-3, 5 of 6")]


def test_a_sub_worlds_ranks_are_named_in_both_numberings() -> None:
    """Brief A46 item 6: a launched world's sub-world named its ranks only as ``rank 1/2``."""
    a = ("builtins", "UserWarning", "a", "t.py", 3)
    pair = [(2, 1), (3, 1)]  # launched ranks 2 and 3, on node 1
    assert merge_warnings({1: (a,)}, 2, pair) == [(a, "rank 1/2 (launched rank 3, node 1)")]
    assert merge_warnings({0: (a,), 1: (a,)}, 2, pair) == [(a, None)]  # every rank: unnamed
    spread = [(0, 0), (1, 0), (2, 1), (3, 1), (5, 2)]
    assert (
        ranks_named([0, 2, 4], 5, spread)
        == "ranks 0, 2, 4 of 5 (launched ranks 0, 2, 5, nodes 0, 1, 2)"
    )
    assert ranks_named([2, 3], 5, spread) == "ranks 2, 3 of 5 (launched ranks 2, 3, node 1)"
    assert ranks_named([1], 2, ()) == "rank 1/2"  # the launched world's own tests, and pools


@given(worlds(), st.data())
def test_a_sub_worlds_words_are_the_pools_with_the_launched_ranks_added(
    world: tuple[dict[int, list[WarningRecord]], int], data: st.DataObject
) -> None:
    per_rank, world_size = world
    launched = [
        (data.draw(st.integers(0, 64)), data.draw(st.integers(0, 3))) for _ in range(world_size)
    ]
    plain = merge_warnings(per_rank, world_size)
    named = merge_warnings(per_rank, world_size, launched)
    assert [record for record, _ in plain] == [record for record, _ in named]
    for (_, words), (_, both) in zip(plain, named, strict=True):
        if words is None:
            assert both is None
            continue
        assert both is not None and both.startswith(f"{words} (launched rank")
        ranks = _ranks(words, world_size)
        shown = re.search(r"\(launched ranks? ([\d, -]+), nodes? ([\d, -]+)\)$", both)
        assert shown, both
        expect = {launched[r][0] for r in ranks}
        assert _expand(shown.group(1)) == sorted(expect)
        assert _expand(shown.group(2)) == sorted({launched[r][1] for r in ranks})


def test_a_rank_that_sent_nothing_did_not_raise_it() -> None:
    a = ("builtins", "UserWarning", "a", "t.py", 3)
    assert merge_warnings({0: (a,), 1: ()}, 2) == merge_warnings({0: (a,)}, 2) == [(a, "rank 0/2")]


def test_a_warning_rebuilt_reads_as_the_ranks_raised_it() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("old", DeprecationWarning, stacklevel=1)
    record = warning_record(caught[0])
    category, message = _warning(record, None)
    assert (category, str(message)) == (DeprecationWarning, "old")
    category, message = _warning(record, "rank 1/2")
    assert (category, str(message)) == (DeprecationWarning, "[rank 1/2] old")
    # A category this process cannot import keeps its name: never shown as another category.
    gone = ("no_such_module", "GoneWarning", "old", "t.py", 1)
    category, message = _warning(gone, None)
    assert (category, str(message)) == (UserWarning, "GoneWarning: old")
