"""Unit: which of the ranks' warnings are the same warning, and how each is shown
(outcome/warnings.py ``merge_warnings``; properties over generated records, Hypothesis)."""

from __future__ import annotations

import re
import warnings

from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.outcome.records import WarningRecord
from pytest_distrank.outcome.warnings import _warning, merge_warnings, warning_record

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
    out: list[int] = []
    for part in many.group(1).split(", "):
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
