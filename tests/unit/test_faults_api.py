"""Unit tests of injected faults' pure part (rank/faultplan.py): arguments, counting, words."""

from __future__ import annotations

import signal

import pytest

from pytest_distrank.rank.faultplan import (
    OPS,
    USER_NAME,
    Counts,
    FaultError,
    call_words,
    fired_line,
    make_fault,
    never_fired,
    ordinal,
)


def test_user_names_map_to_the_dispatcher_ops() -> None:
    assert USER_NAME["c10d::allreduce_"] == "all_reduce"
    assert USER_NAME["_c10d_functional::all_reduce"] == "all_reduce"
    assert USER_NAME["c10d::_allgather_base_"] == "all_gather_into_tensor"
    assert USER_NAME["c10d::barrier"] == "barrier"
    prefixes = ("c10d::", "_c10d_functional::")
    assert all(op.startswith(prefixes) for ops in OPS.values() for op in ops)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"rank": 4, "at": "all_reduce"}, r"rank 4 is not a rank of this test's world of 4"),
        ({"rank": True, "at": "all_reduce"}, "rank True is not a rank"),
        ({"rank": 1, "at": "allreduce"}, "unknown op 'allreduce'; at= takes one of all_gather"),
        ({"rank": 1, "at": "all_reduce", "nth": 0}, r"nth=0 must be an integer >= 1"),
        ({"rank": 1, "at": "all_reduce", "optional": "yes"}, "optional='yes' must be True"),
        ({"rank": 1, "at": "all_reduce", "signal_": "SIGNOPE"}, "signal 'SIGNOPE' is not"),
        ({"rank": 1, "at": "all_reduce", "signal_": "SIGSTOP"}, "use faults.hang"),
    ],
)
def test_bad_calls_name_the_call_and_the_value(kwargs: dict[str, object], error: str) -> None:
    with pytest.raises(FaultError, match=error) as info:
        make_fault("kill", 4, call="faults.kill(...)", **kwargs)
    assert str(info.value).startswith("faults.kill(...): ")


def test_bad_delay_and_exception() -> None:
    with pytest.raises(FaultError, match="seconds=-1 must be a number of seconds"):
        make_fault("delay", 2, rank=0, at="barrier", seconds=-1)
    with pytest.raises(FaultError, match="exc='boom' is not an exception"):
        make_fault("raise_in", 2, rank=0, at="barrier", exc="boom")


def test_defaults() -> None:
    kill = make_fault("kill", 4, rank=2, at="all_reduce", nth=3)
    assert kill.signal == signal.SIGKILL and kill.action(2) == "SIGKILL to rank 2"
    boom = make_fault("raise_in", 2, rank=1, at="broadcast", call="C")
    assert isinstance(boom.exc, RuntimeError) and str(boom.exc) == "injected by C"
    typed = make_fault("raise_in", 2, rank=1, at="broadcast", exc=ValueError, call="C")
    assert isinstance(typed.exc, ValueError)
    assert call_words("kill", {"rank": 2, "at": "all_reduce", "exc": None}) == (
        "faults.kill(rank=2, at='all_reduce')"
    )


def test_counting_per_group_and_per_op() -> None:
    counts = Counts()
    assert counts.note("0", "all_reduce", "the default group") == (1, 1)
    assert counts.note("0", "broadcast", "the default group") == (1, 2)
    assert counts.note("0", "send", "the default group") == (1, 2)  # p2p: not numbered
    assert counts.note("1", "all_reduce", "group '1' (ranks 0, 1)") == (1, 1)
    assert counts.note("0", "all_reduce", "the default group") == (2, 3)
    assert counts.issued("all_reduce") == (
        "2 all_reduce (on the default group); 1 all_reduce (on group '1' (ranks 0, 1))"
    )
    assert counts.issued("barrier") == "0 barrier"


def test_the_words() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st",
    ]  # fmt: skip
    kill = make_fault("kill", 4, rank=2, at="all_reduce", nth=3, call="faults.kill(C)")
    line = fired_line(kill, 2, 3, 5, "the default group", 0.414, "call")
    assert line == (
        "injected: SIGKILL to rank 2 at all_reduce #3 (the 3rd all_reduce, #5 on the default "
        "group), 0.41 s into call (faults.kill(C))"
    )
    counts = Counts()
    counts.note("0", "all_reduce", "the default group")
    text = never_fired(kill, 2, counts)
    assert text.startswith(
        "faults.kill(C) never fired: rank 2 issued 1 all_reduce (on the default group)"
    )
    assert "optional=True" in text
