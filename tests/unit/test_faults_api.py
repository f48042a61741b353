"""Unit tests of injected faults' pure part (api/faultplan.py): arguments, counting, words."""

from __future__ import annotations

import signal

import pytest

from pytest_distrank.api.faultplan import (
    NOT_ENDING,
    OPS,
    USER_NAME,
    Counts,
    FaultError,
    Group,
    Slot,
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
        ({"rank": 1, "at": "all_reduce", "signal_": "SIGSTOP"}, "SIGSTOP stops a process"),
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


DEFAULT = Group("0", (0, 1, 2, 3), default=True)
SUB = Group("1", (2, 3))


def test_counting_per_group_and_per_op() -> None:
    counts = Counts()
    assert counts.note(DEFAULT, "all_reduce") == Slot("all_reduce", "the default group", 1, 1, 1)
    assert counts.note(DEFAULT, "broadcast") == Slot("broadcast", "the default group", 1, 2, 1)
    assert counts.note(DEFAULT, "send") == Slot("send", "the default group", 1, 0, 1)  # p2p
    assert counts.note(SUB, "all_reduce") == Slot("all_reduce", "the group of ranks 2, 3", 1, 1, 2)
    assert counts.note(Group("h", (0, 1), plugin=True), "all_reduce") is None  # the plugin's
    assert counts.note(DEFAULT, "all_reduce") == Slot("all_reduce", "the default group", 2, 3, 3)
    assert counts.issued("all_reduce") == (
        "2 all_reduce (on the default group); 1 all_reduce (on the group of ranks 2, 3)"
    )
    assert counts.issued("barrier") == "0 barrier"


def test_groups_are_named_as_the_verdicts_name_them() -> None:
    counts = Counts()
    counts.note(Group("5", (0, 1)), "all_reduce")
    assert counts.words("5") == "the group of ranks 0, 1"
    counts.note(Group("6", (0, 1)), "all_reduce")  # the same members: the names tell them apart
    assert counts.words("5") == "the group of ranks 0, 1 named '5'"
    assert counts.words("6") == "the group of ranks 0, 1 named '6'"
    assert Group("9a2f").words() == "group '9a2f'"  # members not known


def test_the_words() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st",
    ]  # fmt: skip
    kill = make_fault("kill", 4, rank=2, at="all_reduce", nth=3, call="faults.kill(C)")
    line = fired_line(kill, 2, Slot("all_reduce", "the default group", 3, 5, 3), 0.414, "call")
    assert line == (
        "injected: SIGKILL to rank 2 at all_reduce #5 on the default group (its 3rd all_reduce), "
        "0.41 s into call (faults.kill(C))"
    )
    sub = Slot("all_reduce", "the group of ranks 2, 3", 2, 2, 3)
    words = "at all_reduce #2 on the group of ranks 2, 3 (its 2nd all_reduce there, its 3rd in all)"
    assert words in fired_line(kill, 2, sub, 0.0, "call")
    send = make_fault("raise_in", 4, rank=2, at="send", call="faults.raise_in(C)")
    slot = Slot("send", "the default group", 1, 0, 1)
    assert " at send on the default group (its 1st send), " in fired_line(send, 2, slot, 0, "call")
    counts = Counts()
    counts.note(DEFAULT, "all_reduce")
    text = never_fired(kill, 2, counts)
    assert text.startswith(
        "faults.kill(C) never fired: rank 2 issued 1 all_reduce (on the default group)"
    )
    assert "optional=True" in text


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("SIGTSTP", "SIGTSTP stops a process without ending it; use faults.hang"),
        ("SIGTTIN", "SIGTTIN stops a process"),
        ("SIGTTOU", "SIGTTOU stops a process"),
        ("SIGCHLD", "SIGCHLD is ignored by default: it does not end a process"),
        ("SIGCONT", "SIGCONT is ignored by default"),
        ("SIGURG", "SIGURG is ignored by default"),
        ("SIGWINCH", "SIGWINCH is ignored by default"),
    ],
)
def test_a_kill_refuses_a_signal_that_does_not_end_a_process(name: str, why: str) -> None:
    """hostile-4 D10: these were armed, and the kit then rejected the exit it produced."""
    with pytest.raises(FaultError, match=why) as info:
        make_fault("kill", 2, rank=1, at="barrier", signal_=name, call="faults.kill(C)")
    assert str(info.value).startswith("faults.kill(C): ")
    assert "such as SIGKILL (the default), SIGTERM" in str(info.value)


def test_every_other_signal_ends_a_process_by_default() -> None:
    """The refused ones are exactly those whose default action is to ignore or to stop
    (signal(7)); a pool rank's own signals (SIGUSR1: its stack dump, SIGUSR2: its flight
    recorder) are taken back by the kill (api/faults.py's _die) and are accepted."""
    ignore_or_stop = {"SIGCHLD", "SIGCONT", "SIGURG", "SIGWINCH"}
    ignore_or_stop |= {"SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU"}
    assert {signal.Signals(s).name for s in NOT_ENDING} == ignore_or_stop
    from pytest_distrank.pool.worker.main import DUMP_SIGNAL
    from pytest_distrank.pool.worker.rankfr import FR_SIGNAL

    for accepted in ("SIGKILL", "SIGTERM", "SIGINT", "SIGPIPE", DUMP_SIGNAL, FR_SIGNAL):
        fault = make_fault("kill", 2, rank=1, at="barrier", signal_=accepted)
        assert fault.signal not in NOT_ENDING
