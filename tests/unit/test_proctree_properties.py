"""Unit, properties: the judgements of the process tree (tree/words.py's verdict on deaths) and
the reading of faulthandler's dumps that the fallback depends on (tree/dump.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.tree import dump, procs, words

PROC = procs.Proc(4711, 1, "python -m worker", 0, True)
statuses = st.one_of(st.integers(1, 64), st.integers(1, 255).map(lambda code: code << 8))
deaths = st.lists(st.builds(procs.Death, st.just(PROC), statuses, st.floats(0, 100)), max_size=5)
outcomes = st.sampled_from(["passed", "failed", "skipped"])
policies = st.sampled_from(["report", "fail"])


@given(deaths, policies, outcomes)
def test_only_fail_turns_only_a_pass_into_a_failure(
    died: list[procs.Death], policy: str, outcome: str
) -> None:
    verdict = words.fails_test(died, policy, outcome)
    if policy == "report" or outcome != "passed":
        assert not verdict  # a report never fails a test; a failure or a skip stays what it was
    else:
        assert verdict == bool(died)


@given(deaths, deaths, policies, outcomes)
def test_more_deaths_never_undo_a_failure_and_order_does_not_matter(
    first: list[procs.Death], more: list[procs.Death], policy: str, outcome: str
) -> None:
    if words.fails_test(first, policy, outcome):
        assert words.fails_test(first + more, policy, outcome)
    both = first + more
    assert words.fails_test(both, policy, outcome) == words.fails_test(both[::-1], policy, outcome)


@given(statuses, st.floats(0, 1000))
def test_a_death_line_says_how_and_when(status: int, at: float) -> None:
    line = words.death_line(procs.Death(PROC, status, at))
    assert line.startswith("process (pid 4711, python -m worker) ")
    assert ("died of " in line) == (status < 128)
    assert ("exited with code " in line) == (status >= 256)
    assert line.endswith(f" at {at:.1f} s")


names = st.text("abcdefghij_", min_size=1, max_size=8)
frames = st.lists(st.tuples(names, st.integers(1, 9999), names), max_size=4)


@given(st.lists(frames, min_size=1, max_size=4), st.data())
def test_faulthandler_dumps_read_back_current_thread_first(
    threads: list[list[tuple[str, int, str]]], data: st.DataObject
) -> None:
    current = data.draw(st.integers(0, len(threads) - 1))
    text = ""
    for index, stack in enumerate(threads):
        head = "Current thread" if index == current else "Thread"
        text += f"{head} 0x{index:04x} (most recent call first):\n"
        text += "".join(f'  File "{f}.py", line {n} in {fn}\n' for f, n, fn in stack)
        text += "\n"
    parsed = dump.parse_faulthandler(text)
    assert len(parsed) == len(threads)
    assert parsed[0][0] == f"Current thread 0x{current:04x}"
    assert parsed[0][1] == [f'File "{f}.py", line {n} in {fn}' for f, n, fn in threads[current]]
