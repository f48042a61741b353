"""Unit: launcher mode's ranks that left on a silent rank 0 (launch/gaveup.py): the note a
leaving rank writes, the test rank 0 was in when it went silent, and what rank 0 says (a fake
control channel)."""

from __future__ import annotations

from typing import cast

from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.launch import keys
from pytest_distrank.launch.channel import Channel, ChannelError, Rank0Silent
from pytest_distrank.launch.gaveup import note, reason, silent_during

from .test_launch_gather import FakeChannel


def _overlap(alone: list[tuple[str, float]], i: int, since: float, until: float) -> float:
    end = alone[i + 1][1] if i + 1 < len(alone) else until
    return min(end, until) - max(alone[i][1], since)


_STARTS = st.lists(st.floats(0, 1000), max_size=6).map(sorted)


@given(_STARTS, st.floats(0, 1000), st.floats(0, 200))
def test_the_silent_test_is_the_one_that_overlaps_the_silence_most(
    starts: list[float], since: float, length: float
) -> None:
    alone = [(f"t.py::test_{i}", start) for i, start in enumerate(starts)]
    until = since + length
    found = silent_during(alone, since, until)
    overlaps = [_overlap(alone, i, since, until) for i in range(len(alone))]
    if not any(o > 0 for o in overlaps):
        assert found is None
        return
    assert found is not None
    chosen = overlaps[[name for name, _ in alone].index(found)]
    assert chosen > 0 and chosen == max(overlaps)


def test_the_slow_test_is_named_not_the_one_before_it() -> None:
    """Rank 0's last heartbeat moved a little before the slow test began (the peers look at it
    once a second): the slow test is still the one named."""
    alone = [("t.py::test_quick", 100.0), ("t.py::test_slow", 100.5)]
    assert silent_during(alone, 99.8, 159.8) == "t.py::test_slow"
    assert silent_during([], 99.8, 159.8) is None


def test_a_rank_that_gave_up_tells_rank_0_which_reads_why() -> None:
    channel = FakeChannel()
    ch = cast(Channel, channel)
    assert reason(ch, 4, [], 0.0) is None
    note(ch, 1, ChannelError("rank 0's agent is gone"), 60.0)  # another loss: no note
    assert channel.values == {} and channel.counters == {keys.GAVE_UP: 0}
    for rank in (3, 1):
        note(ch, rank, Rank0Silent("no sign of life", 1000.0 + rank), 60.0, absent=rank == 3)
    assert channel.counters == {keys.GAVE_UP: 2, keys.BYE: 1}  # rank 1 comes to say bye
    alone = [("t.py::test_quick", 990.0), ("t.py::test_slow", 999.0)]
    said = reason(ch, 4, alone, 1070.0)
    assert said is not None
    assert said.startswith("rank(s) 1, 3 left the run: rank 0 gave no sign of life for 60 s ")
    assert "during t.py::test_slow (which rank 0 ran alone)" in said
    assert "held the GIL" in said
    assert "between tests" in (reason(ch, 4, [], 1070.0) or "")


def test_a_note_that_does_not_read_is_left_out() -> None:
    channel = FakeChannel()
    channel.counters[keys.GAVE_UP] = 1
    channel.values[keys.gave_up(2)] = {"since_ns": "soon", "silent_s": 60}
    assert reason(cast(Channel, channel), 3, [], 0.0) is None
