"""End-to-end: a failure after earlier tests of its pool is replayed on fresh ranks (#26, item 3).

One inner session (``REPLAY``, replays on by default) runs eight tiny world-size-2 tests in one
pool, in order: ``test_c`` pollutes its ranks (a module global) and ``test_d`` fails only after it;
``test_own`` fails wherever it runs; ``test_flaky`` fails the first time each rank runs it (a
marker file per rank); in a second file, ``test_fresh_cache`` fails on a file
``test_writes_flag`` left (hostile-4 D13). Each outer test reads one verdict of the section
``distrank: order-dependent failures``; one checks that the replays changed no outcome, no exit
code and no junit entry. Eight replays in all (~2 s on 2 cores).

``BUDGET`` (D16) replays under a 2 s budget: a test that failed at its deadline is not replayed,
and a replay whose earlier test would sleep 30 s is cut at the budget. A session signalled
during its replays (D18) ends interrupted, blaming no test. The pure parts (the search and its
bound, the verdict's and the budget's rules as properties, the wording, when no replay runs,
pytest-xdist's hand-over) are unit-tested in tests/unit/test_replay*.py.
"""

from __future__ import annotations

import re
import signal

import pytest

from ..helpers import SharedSession
from .test_faults import Session, Shared
from .test_report_files import signal_when, start_session

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

#: hostile-4 D13: a failure caused by a file an earlier test left (it is still there when the
#: replays run, after the session).
FILE_CASES = """
import os, pytest

FLAG = os.path.join(os.path.dirname(__file__), "downloaded.flag")


@pytest.mark.world_size(2)
def test_writes_flag(rank):
    if rank == 0:
        open(FLAG, "w").write("x")


@pytest.mark.world_size(2)
def test_fresh_cache(rank):
    assert not os.path.exists(FLAG), "stale download flag"
"""

REPLAY = Session(
    "test_replay.REPLAY",
    {"test_order.py": ORDER_CASES, "test_zfiles.py": FILE_CASES},
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
    """The two lines of ``test``'s verdict (``file::name``, or a name in :data:`FILE`): what it
    did and found, and what it cost."""
    lines = section(shared)
    nodeid = test if "::" in test else f"{FILE}::{test}"
    found = [i for i, line in enumerate(lines) if line.startswith(f"{nodeid} fails after")]
    assert len(found) == 1, "\n".join(lines)
    return pytest.LineMatcher(lines[found[0] : found[0] + 2])


VERDICTS = {
    # 3 earlier tests: alone, all three then test_d, [a] (passes), [c] (fails): found; alone and
    # [c] once more (the blame's evidence repeats).
    "test_d": (
        f"{FILE}::test_d fails after 3 earlier tests of its pool; passes alone on fresh ranks; "
        f"polluter: {FILE}::test_c (test_c then test_d fails; test_d alone passes)",
        "6 replays to find a polluter, * s",
    ),
    "test_own": (
        f"{FILE}::test_own fails after 4 earlier tests of its pool; fails alone on fresh ranks "
        "after the session too: not state in the ranks; earlier tests may have left files or "
        "other state outside the processes",
        "1 replay, * s",
    ),
    # hostile-4 D13: never "the test's own" (the replay alone ran with the file still there).
    "test_zfiles.py::test_fresh_cache": (
        "test_zfiles.py::test_fresh_cache fails after 7 earlier tests of its pool; fails alone on "
        "fresh ranks after the session too: not state in the ranks; earlier tests may have left "
        "files or other state outside the processes",
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
        pytest.param(
            "test_zfiles.py::test_fresh_cache", id="a file left behind is not the test's own"
        ),
    ],
)
def test_each_failure_after_earlier_tests_gets_a_verdict(replay: Shared, test: str) -> None:
    if "::" not in test:
        assert replay.outcome(test) == "failed"
    verdict(replay, test).fnmatch_lines(list(VERDICTS[test]), consecutive=True)
    assert "the test's own" not in replay.text


def test_replays_change_no_outcome_exit_code_or_report(replay: Shared) -> None:
    # Every test once in the junit report (Shared.outcome asserts it): no replay reached it.
    assert replay.outcomes("test_a", "test_c", "test_b") == ["passed"] * 3
    assert replay.outcomes("test_d", "test_own", "test_flaky") == ["failed"] * 3
    assert replay.result.ret == 1
    replay.result.stdout.fnmatch_lines(
        [
            # The replays' pools are not the session's.
            "8 distributed tests; pools started: 1 at world size 2",
            f"FAILED {FILE}::test_d - *polluted by test_c*",
            "*= 4 failed, 4 passed in *",
        ]
    )
    # One verdict per failure, in the order they failed.
    heads = [line.split(" fails after")[0] for line in section(replay) if " fails after " in line]
    assert heads == [
        *(f"{FILE}::{t}" for t in ("test_d", "test_own", "test_flaky")),
        "test_zfiles.py::test_fresh_cache",
    ]


# -- the budget, and a signal during the replays ----------------------------------------------

#: After the session's last test (an ordinary one, last in the file) ``SESSION_ENDED`` exists:
#: ``test_polluter`` then sleeps 30 s, so that a replay that runs it is long unless the budget
#: cuts it. ``test_b_hangs`` fails at its 5 s deadline after an earlier test of its pool (one
#: rank: its own pool, which its hang ends, not ``test_polluted``'s).
BUDGET_CASES = """
import os, pathlib, time

import pytest

STATE = set()
ENDED = pathlib.Path(os.environ["SESSION_ENDED"])


@pytest.mark.world_size(1)
def test_a_first(rank):
    pass


@pytest.mark.world_size(1)
@pytest.mark.timeout(5)
def test_b_hangs(rank):
    time.sleep(60)


@pytest.mark.world_size(2)
def test_polluter(rank):
    STATE.add("polluted")
    if ENDED.exists():  # a replay, after the session
        pathlib.Path(os.environ["REPLAYING"]).touch()
        time.sleep(30)


@pytest.mark.world_size(2)
def test_polluted(rank):
    assert "polluted" not in STATE


def test_zz_session_end():
    ENDED.touch()
"""
BUDGET_ENV = {
    "DISTRANK_REPLAY": "",
    "SESSION_ENDED": "{folder}/session-ended",
    "REPLAYING": "{folder}/replaying",
}

BUDGET = Session(
    "test_replay.BUDGET",
    {"test_budget.py": BUDGET_CASES},
    ("-ra", "--distrank-replay-budget=4"),
    BUDGET_ENV,
)


def test_the_replay_budget_is_a_bound(shared_session: SharedSession) -> None:
    """hostile-4 D16: a test that failed at its deadline (5 s, more than the 4 s budget) is not
    replayed; the next suspect's replay after its earlier test, which would sleep 30 s, is cut
    when the budget is spent (its deadline cut to the budget left), and the section says how far
    the search got. The replays take the budget and the few seconds that end and stop a replay,
    far from the 30 s (and the 5 s deadline again) they took before."""
    budget = BUDGET.run(shared_session)
    assert budget.outcomes("test_b_hangs", "test_polluter", "test_polluted") == [
        "failed",
        "passed",
        "failed",
    ]
    lines = section(budget)
    pytest.LineMatcher(lines).fnmatch_lines(
        [
            "test_budget.py::test_b_hangs fails after 1 earlier test of its pool; not replayed: "
            "its run in the session took * s, more than the 4.0 s left of the budget of 4 s "
            "(--distrank-replay-budget=4 (command line))",
            "0 replays, 0.0 s",
            "test_budget.py::test_polluted fails after 1 earlier test of its pool; passes alone "
            "on fresh ranks; budget of 4 s (--distrank-replay-budget=4 (command line)) spent "
            "during replay 2: no outcome; candidates left: test_polluter",
            "2 replays, * s",
        ],
        consecutive=True,
    )
    seconds = float(lines[-1].split(", ")[1].removesuffix(" s"))
    assert seconds < 4 + 5, budget.text  # the budget, and ending and stopping the cut replay
    assert budget.result.ret == 1


def test_a_signal_during_the_replays_ends_them_and_blames_no_test(
    pytester: pytest.Pytester,
) -> None:
    """hostile-4 D18: SIGTERM while a replay runs: the session ends as interrupted (exit code
    2, pytest's), the section says the replays were interrupted and by what, and no test is said
    to have broken its pool; no process is left."""
    pytester.makepyfile(test_budget=BUDGET_CASES)
    env = {**BUDGET_ENV, "DISTRANK_TEST_WAITS": "1"}
    args = ("-ra", "--distrank-replay-budget=0", "-k", "not hangs")
    proc, tag = start_session(pytester, env, *args)
    output = signal_when(pytester, proc, tag, pytester.path / "replaying", signal.SIGTERM)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output
    assert "broke its fresh pool" not in output and "could not run" not in output, output
    pytest.LineMatcher(output.splitlines()).fnmatch_lines(
        [
            "*= distrank: order-dependent failures =*",
            "test_budget.py::test_polluted fails after 1 earlier test of its pool; passes alone "
            "on fresh ranks; replays interrupted by SIGTERM during replay 2; candidates left: "
            "test_polluter",
        ],
        consecutive=True,
    )
