"""End-to-end: a failure after earlier tests of its pool is replayed on fresh ranks (#26, item 3).

One inner session (``REPLAY``, replays on by default) runs six tiny world-size-2 tests in one
pool, in order: ``test_c`` pollutes its ranks (a module global) and ``test_d`` fails only after it;
``test_own`` fails wherever it runs; ``test_flaky`` fails the first time each rank runs it (a
marker file per rank). Each outer test reads one verdict of the section ``distrank:
order-dependent failures``; the last checks that the replays changed no outcome, no exit code and
no junit entry. Seven replays in all (~2 s on 2 cores). The pure parts (the search and its
bound, "no single polluter", a spent budget, Ctrl-C, the wording, when no replay runs,
pytest-xdist's hand-over) are unit-tested in tests/unit/test_replay.py.
"""

from __future__ import annotations

import re

import pytest

from ..helpers import SharedSession
from .test_faults import Session, Shared

ORDER_CASES = """
import pathlib, pytest

STATE = set()


@pytest.mark.world_size(2)
def test_a(rank):
    pass


@pytest.mark.world_size(2)
def test_c(rank):
    STATE.add("c")


@pytest.mark.world_size(2)
def test_b(rank):
    pass


@pytest.mark.world_size(2)
def test_d(rank):
    assert "c" not in STATE, "polluted by test_c"


@pytest.mark.world_size(2)
def test_own(rank):
    assert rank == 0, "fails on rank 1 wherever it runs"


@pytest.mark.world_size(2)
def test_flaky(rank):
    marker = pathlib.Path(__file__).with_name(f"flaky-rank{rank}.marker")
    first = not marker.exists()
    marker.touch()
    assert not first, "fails the first time only"
"""

REPLAY = Session(
    "test_replay.REPLAY",
    {"test_order.py": ORDER_CASES},
    ("-ra",),
    # run_pytest turns replays off for every other session; empty: the default (on).
    {"DISTRANK_REPLAY": ""},
)

FILE = "test_order.py"


@pytest.fixture
def replay(shared_session: SharedSession) -> Shared:
    return REPLAY.run(shared_session)


def section(shared: Shared) -> list[str]:
    """The lines of the section ``distrank: order-dependent failures``."""
    lines = shared.result.outlines
    starts = [i for i, line in enumerate(lines) if "distrank: order-dependent failures" in line]
    assert len(starts) == 1, shared.text
    end = next(
        (i for i in range(starts[0] + 1, len(lines)) if re.match(r"^[=-]{3,} ", lines[i])),
        len(lines),
    )
    return lines[starts[0] + 1 : end]


def verdict(shared: Shared, test: str) -> pytest.LineMatcher:
    """The two lines of ``test``'s verdict: what it did and found, and what it cost."""
    lines = section(shared)
    found = [i for i, line in enumerate(lines) if line.startswith(f"{FILE}::{test} fails after")]
    assert len(found) == 1, "\n".join(lines)
    return pytest.LineMatcher(lines[found[0] : found[0] + 2])


VERDICTS = {
    # 3 earlier tests: alone, all three then test_d, [a] (passes), [c] (fails): found.
    "test_d": (
        f"{FILE}::test_d fails after 3 earlier tests of its pool; passes alone on fresh ranks; "
        f"polluter: {FILE}::test_c (test_c then test_d fails; test_d alone passes)",
        "4 replays to find a polluter, * s",
    ),
    "test_own": (
        f"{FILE}::test_own fails after 4 earlier tests of its pool; fails alone on fresh ranks "
        "too: the failure is the test's own",
        "1 replay, * s",
    ),
    "test_flaky": (
        f"{FILE}::test_flaky fails after 5 earlier tests of its pool; passes alone on fresh "
        "ranks; passes after the 5 earlier tests too: did not reproduce (flaky?)",
        "2 replays, * s",
    ),
}


@pytest.mark.parametrize(
    "test",
    [
        pytest.param("test_d", id="the polluter is found"),
        pytest.param("test_own", id="a failure of its own is named so"),
        pytest.param("test_flaky", id="a failure that does not come back is called flaky"),
    ],
)
def test_each_failure_after_earlier_tests_gets_a_verdict(replay: Shared, test: str) -> None:
    assert replay.outcome(test) == "failed"
    verdict(replay, test).fnmatch_lines(list(VERDICTS[test]), consecutive=True)


def test_replays_change_no_outcome_exit_code_or_report(replay: Shared) -> None:
    # Every test once in the junit report (Shared.outcome asserts it): no replay reached it.
    assert replay.outcomes("test_a", "test_c", "test_b") == ["passed"] * 3
    assert replay.outcomes("test_d", "test_own", "test_flaky") == ["failed"] * 3
    assert replay.result.ret == 1
    replay.result.stdout.fnmatch_lines(
        [
            # The replays' pools are not the session's.
            "6 distributed tests; pools started: 1 at world size 2",
            f"FAILED {FILE}::test_d - *polluted by test_c*",
            "*= 3 failed, 3 passed in *",
        ]
    )
    # One verdict per failure, in the order they failed.
    heads = [line.split(" fails after")[0] for line in section(replay) if " fails after " in line]
    assert heads == [f"{FILE}::{t}" for t in ("test_d", "test_own", "test_flaky")]
