"""Unit: ``in_child``'s verdict (outcome/childverdict.py) over generated child ends, and the
decorator's arguments and signature (api/children.py).

The verdict judges, so its rule is held by properties: a test passes only when its child
wrote a readable "passed", exited 0 and ended in time; no result, an unreadable one, a signal or a
non-zero exit after a result, a timeout: each fails, naming what happened.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank import in_child
from pytest_distrank.api.children import _with_request, default_timeout
from pytest_distrank.outcome.childverdict import (
    OUTCOMES,
    ChildEnd,
    ChildResult,
    judge,
    parse_result,
    trim_below_test,
)


def _fields(**changed: object) -> dict[str, object]:
    """A result file's fields, "passed", with ``changed`` ones."""
    base = {"outcome": "passed", "text": "", "crash": "", "left": [], "raised": "", "warned": []}
    return {**base, **changed}


lines = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
results = st.builds(
    ChildResult,
    outcome=st.sampled_from(OUTCOMES),
    text=lines,
    crash=lines,
    left=st.tuples() | st.tuples(lines) | st.tuples(lines, lines),
    raised=st.sampled_from(["", "builtins:ValueError", "m:Outer.Error"]),
    warned=st.tuples() | st.tuples(st.tuples(lines, lines, lines, st.integers(0, 10**6))),
)
#: What a result file may hold: a result, nothing, bytes that are no JSON, JSON of a wrong shape.
garbled = st.binary(max_size=40).filter(lambda b: not _is_result(b)) | st.sampled_from(
    [
        b"",
        b"{",
        b"null",
        b"[]",
        b'{"outcome": "passed"}',
        json.dumps({"outcome": "won", "text": "", "crash": "", "left": []}).encode(),
        json.dumps({"outcome": "passed", "text": 1, "crash": "", "left": []}).encode(),
        json.dumps({"outcome": "passed", "text": "", "crash": "", "left": [3]}).encode(),
        json.dumps(_fields(warned=[["UserWarning", "m", "f.py", "7"]])).encode(),
        json.dumps(_fields(warned=[["UserWarning", "m", "f.py"]])).encode(),
        json.dumps(_fields(raised=None)).encode(),
    ]
)
raws = st.none() | results.map(ChildResult.to_json) | garbled
statuses = st.none() | st.integers(-64, -1) | st.just(0) | st.integers(1, 255)
ends = st.builds(
    ChildEnd,
    who=st.just("test_x's child (fork, pid 4711)"),
    status=statuses,
    raw=raws,
    timed_out=st.booleans(),
    timeout=st.none() | st.floats(0.1, 1000),
    stack=st.sampled_from(["", 'Current thread 0x1 (most recent call first):\n  File "t.py"']),
    test_file=st.just("t.py"),
    killed=st.tuples() | st.tuples(st.just("pid 12: sleep 60")),
    stopped_by=st.sampled_from([0, signal.SIGTTIN, signal.SIGSTOP]),
)


def _is_result(raw: bytes) -> bool:
    return isinstance(parse_result(raw), ChildResult)


@given(results)
def test_a_result_reads_back_as_written(result: ChildResult) -> None:
    assert parse_result(result.to_json()) == result


@given(garbled)
def test_a_garbled_result_is_a_reason_never_a_result(raw: bytes) -> None:
    assert isinstance(parse_result(raw), str)


@given(ends, st.sampled_from(["warn", "fail"]))
def test_passed_only_for_a_readable_pass_a_clean_exit_and_in_time(
    end: ChildEnd, leftovers: str
) -> None:
    verdict = judge(end, leftovers)
    result = parse_result(end.raw)
    clean = not end.timed_out and end.status in (0, None) and isinstance(result, ChildResult)
    assert verdict.outcome in OUTCOMES
    if verdict.outcome != "failed":
        assert clean and isinstance(result, ChildResult)
        assert verdict.outcome == result.outcome
        assert verdict.message == result.text
    if clean and isinstance(result, ChildResult):
        left_fails = leftovers == "fail" and result.outcome == "passed" and verdict.left != ""
        assert (verdict.outcome == "failed") == (result.outcome == "failed" or left_fails)


@given(ends)
def test_no_result_fails_whatever_the_exit(end: ChildEnd) -> None:
    """A child runner that never called the function (vLLM #41415) cannot pass: exit 0 and no
    result is a failure."""
    end = ChildEnd(end.who, end.status, None, end.timed_out, end.timeout, end.stack, "t.py")
    verdict = judge(end)
    assert verdict.outcome == "failed"
    assert end.who in verdict.message
    assert "did not finish" in verdict.message if end.timed_out else "no result" in verdict.message


@given(ends)
def test_every_failure_says_why(end: ChildEnd) -> None:
    verdict = judge(end)
    if verdict.outcome != "failed":
        return
    result = parse_result(end.raw)
    if end.timed_out:
        assert verdict.message.startswith(f"{end.who} did not finish within")
    elif end.status is not None and end.status < 0:
        assert signal.Signals(-end.status).name in verdict.message if _named(end.status) else True
        assert f"({end.status})" in verdict.message
    elif end.status is None and not isinstance(result, ChildResult):
        assert "unknown exit status" in verdict.message
    elif end.status not in (0, None):
        assert f"exit code {end.status}" in verdict.message
    elif isinstance(result, ChildResult) and result.outcome == "failed":
        assert verdict.message.splitlines()[0].endswith(f"(in {end.who})")
        assert result.text in verdict.message
    for line in end.killed:
        assert line in verdict.message and line in verdict.left


def _named(status: int) -> bool:
    try:
        signal.Signals(-status)
    except ValueError:
        return False
    return True


@given(results, st.integers(-64, 255).filter(lambda s: s != 0))
def test_a_result_then_a_bad_exit_fails_naming_both(result: ChildResult, status: int) -> None:
    end = ChildEnd("c", status, result.to_json())
    verdict = judge(end)
    assert verdict.outcome == "failed"
    assert f"after its function {result.outcome}" in verdict.message
    if result.outcome == "failed":
        assert result.text in verdict.message


def test_a_segfault_without_a_result_is_named() -> None:
    verdict = judge(ChildEnd("test_x's child (fork, pid 9)", -11, None))
    assert verdict.message.startswith(
        "test_x's child (fork, pid 9) ended with signal SIGSEGV(-11) and wrote no result"
    )


def test_a_hang_shows_where_it_was_blocked() -> None:
    stack = 'Current thread 0x1 (most recent call first):\n  File "t.py", line 7 in wait\n'
    verdict = judge(ChildEnd("c", None, None, True, 3.0, stack, "t.py"))
    assert verdict.message.splitlines()[:2] == [
        "c did not finish within 3 s: stopped and killed.",
        "It was blocked in wait at t.py:7.",
    ]


def test_leftovers_warn_by_default_and_fail_when_asked() -> None:
    end = ChildEnd("c", 0, ChildResult("passed", left=("pid 5: sleep 60",)).to_json())
    assert judge(end).outcome == "passed"
    assert judge(end).left == "c left 1 process running, killed:\n  pid 5: sleep 60"
    assert judge(end, "fail").outcome == "failed"


SECONDS = "seconds >= 0, or None for the default."


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start": "forkserver"}, "in_child(start='forkserver'): start is one of fork, spawn."),
        ({"timeout": -1}, "in_child(timeout=-1): seconds >= 0, or None for the default."),
        ({"timeout": True}, "in_child(timeout=True): seconds >= 0, or None for the default."),
        *(({"timeout": float(v)}, f"in_child(timeout={v}): {SECONDS}") for v in ("inf", "nan")),
        ({"leftovers": "ignore"}, "in_child(leftovers='ignore'): one of warn, fail."),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        in_child(**kwargs)  # type: ignore[arg-type]
    assert str(raised.value) == message


def test_the_wrapper_asks_pytest_for_request_where_the_function_does_not() -> None:
    def test_a(rank: int, *args: int, **kwargs: int) -> None:
        pass

    def test_b(request: object) -> None:
        pass

    assert list(_with_request(inspect.signature(test_a)).parameters) == [
        "rank",
        "args",
        "request",
        "kwargs",
    ]
    assert list(inspect.signature(in_child(test_a)).parameters) == [
        "rank",
        "args",
        "request",
        "kwargs",
    ]
    assert list(inspect.signature(in_child(start="spawn")(test_b)).parameters) == ["request"]


def test_the_default_timeout_ends_before_the_deadline() -> None:
    assert default_timeout(None) == pytest.approx(269.0)  # no test: the plugin's 300 s


def test_a_hangs_stack_keeps_each_thread_down_to_the_test_function() -> None:
    dump = "\n".join(
        [
            "Current thread 0x1 (most recent call first):",
            '  File "t.py", line 3 in wait',
            '  File "t.py", line 9 in test_x',
            '  File "childmain.py", line 98 in run',
            "Thread 0x2 (most recent call first):",
            '  File "threading.py", line 1 in wait',
            "",
            "Extension modules: numpy (total: 1)",
        ]
    )
    assert trim_below_test(dump, "t.py").splitlines() == [
        "Current thread 0x1 (most recent call first):",
        '  File "t.py", line 3 in wait',
        '  File "t.py", line 9 in test_x',
        "Thread 0x2 (most recent call first):",
        '  File "threading.py", line 1 in wait',
    ]


@pytest.mark.parametrize(
    ("signum", "words"),
    [
        (signal.SIGTTIN, "It had been stopped by SIGTTIN: it used the terminal from outside"),
        (signal.SIGSTOP, "It had been stopped by SIGSTOP (a stopped child does not go on"),
    ],
)
def test_a_hang_of_a_stopped_child_says_what_stopped_it(signum: int, words: str) -> None:
    end = ChildEnd("c", -9, None, timed_out=True, timeout=3.0, stopped_by=signum)
    assert judge(end).message.splitlines()[1].startswith(words)
    assert "stopped by" not in judge(dataclasses.replace(end, stopped_by=0)).message


def test_a_result_stands_when_another_handler_reaped_the_child() -> None:
    """A SIGCHLD handler of the test reaped the child first: its exit status is unknown, its
    result file says what came of the function."""
    assert judge(ChildEnd("c", None, ChildResult("passed").to_json())).outcome == "passed"
    failed = judge(ChildEnd("c", None, ChildResult("failed", "tb", "E: x").to_json()))
    assert (failed.outcome, failed.message) == ("failed", "E: x (in c)\ntb")
    assert "unknown exit status" in judge(ChildEnd("c", None, None)).message


def test_a_nested_childs_failure_names_the_innermost_child_once() -> None:
    crash = "Failed: AssertionError: x (in test_x's child (fork, pid 5))"
    verdict = judge(
        ChildEnd("test_x's child (spawn, pid 4)", 0, ChildResult("failed", "", crash).to_json())
    )
    assert verdict.message.splitlines()[0] == crash
