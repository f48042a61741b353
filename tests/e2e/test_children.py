"""End-to-end: ``@pytest_distrank.in_child`` carries a child's outcome into the test's report
(issue 41 item 4): failure (asserts rewritten), skip, xfail, output, a hang's stack, a death's
signal; fork and spawn; ordinary tests and a rank's test (world_size).

One inner session (``CHILDREN``) holds every case; the leak check of ``run_pytest`` proves that
no child, and nothing a child started (a worker it leaked, a grandchild of a hung child),
outlives it. The verdict's rule is property-tested in tests/unit/test_children.py.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from ..helpers import RunPytest, SharedSession
from .test_faults import Session, Shared

ORDINARY = """
import os, signal, subprocess, sys, time
import pytest
from pytest_distrank import in_child


def value():
    return 1


def wait_forever():
    time.sleep(100)


@in_child()
def test_passes():
    print("hello from the child")


@in_child()
def test_fails_fork():
    print("child says hi")
    assert value() == 2


@in_child(start="spawn")
def test_fails_spawn(tmp_path):
    print("spawned child says hi")
    assert value() == 3


@in_child()
def test_skips():
    pytest.skip("no engine here")


@in_child(start="spawn")
def test_xfails():
    pytest.xfail("known engine bug")


@in_child(timeout=1)
def test_hangs_fork():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    wait_forever()


@in_child(start="spawn", timeout=1.5)
def test_hangs_spawn():
    wait_forever()


@in_child()
def test_segfaults():
    os.kill(os.getpid(), signal.SIGSEGV)


@in_child()
def test_exits_0():
    os._exit(0)


@in_child()
def test_leaks_a_worker():
    subprocess.Popen(["sleep", "60"])


@in_child(leftovers="fail")
def test_leak_fails_when_asked():
    subprocess.Popen(["sleep", "61"])


@pytest.mark.timeout(2)
@in_child()
def test_deadline_sets_the_timeout():
    wait_forever()


class TestInAClass:
    @in_child(start="spawn")
    def test_method_spawned(self, tmp_path):
        assert tmp_path.is_dir() and isinstance(self, TestInAClass)
"""

NEVER_RAN = """
from pytest_distrank import in_child
from pytest_distrank.api import childmain


def test_a_runner_that_never_runs_the_function_cannot_pass(monkeypatch):
    # vLLM #41415: its child runner exited 0 without calling the test, which "always passed".
    monkeypatch.setattr(childmain, "child_main", lambda *args: None)  # inherited by the fork

    @in_child()
    def body():
        pass

    body()
"""

RANKS = """
import time
import pytest
from pytest_distrank import in_child


@pytest.mark.world_size(2)
@in_child()
def test_rank_fork(rank, world_size):
    print(f"child of rank {rank}")
    assert rank == 0, f"rank {rank} of {world_size} fails"


@pytest.mark.world_size(2)
@in_child(start="spawn")
def test_rank_spawn(rank, world_size):
    assert world_size == 2 and rank in (0, 1)


@pytest.mark.timeout(4)
@pytest.mark.world_size(2)
@in_child()
def test_rank_hang(rank):
    if rank == 1:
        time.sleep(100)


@pytest.mark.world_size(2)
@in_child(start="spawn")
def test_rank_spawn_refuses_pg(pg):
    pass
"""

#: The hostile pass's defects (issue 41 item 4): each of these passed, or failed, wrongly.
FIXES = """
import subprocess, time, unittest, warnings
import pytest
from pytest_distrank import in_child


def wait_forever():
    time.sleep(100)


@in_child()
async def test_async_refused():
    raise AssertionError("never awaited")


@in_child()
def test_subtests_refused(subtests):
    with subtests.test(i=1):
        assert False


class TestUnittest(unittest.TestCase):
    @in_child()
    def test_subtest_fails(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertNotEqual(i, 1)

    @in_child()
    def test_skiptest(self):
        self.skipTest("no engine in this case")


@in_child()
def test_unittest_skip():
    raise unittest.SkipTest("no engine here either")


@pytest.mark.xfail(raises=ValueError, reason="known ValueError")
@in_child()
def test_xfail_raises_matches():
    raise ValueError("the known one")


@pytest.mark.xfail(raises=KeyError, reason="known KeyError")
@in_child()
def test_xfail_raises_other():
    raise ValueError("not the known one")


@pytest.fixture
def frozen(monkeypatch):  # what freezegun does
    monkeypatch.setattr(time, "monotonic", lambda: 1000.0)


@in_child(timeout=1)
def test_frozen_clock(frozen):
    wait_forever()


@pytest.fixture
def slow_setup():
    time.sleep(1.5)


@pytest.mark.timeout(3)
@in_child()
def test_setup_counts(slow_setup):
    wait_forever()


@in_child(leftovers="fail")
def test_a_finished_job_is_not_left():
    subprocess.run("sleep 0.1 & exit 0", shell=True)
    time.sleep(0.5)


def plain_decorator(f):
    def inner(*args, **kwargs):
        return f(*args, **kwargs)
    return inner


@plain_decorator
@in_child(start="spawn", timeout=30)
def test_spawn_under_a_plain_decorator():
    pass


@pytest.mark.filterwarnings("error")
@in_child(start="spawn")
def test_spawn_keeps_warning_filters():
    warnings.warn("a warning as an error", UserWarning)


@in_child()
def test_child_warns():
    warnings.warn("warned in the child", UserWarning)


def boom():
    raise RuntimeError("thread boom")


@in_child()
def test_a_thread_raises():
    import threading
    thread = threading.Thread(target=boom, name="booming")
    thread.start()
    thread.join()


@pytest.fixture
def torn():
    yield
    raise RuntimeError("the fixture's teardown ran in the child")


@in_child()
def test_finalizer_runs(request):
    def fin():
        raise RuntimeError("the finalizer ran in the child")

    request.addfinalizer(fin)


@in_child()
def test_fixture_teardown_runs(request):
    request.getfixturevalue("torn")


@in_child()
def test_a_forked_helper_falls_out():
    import os
    pid = os.fork()
    if pid == 0:
        return  # the helper: its "passed" is not the child's
    os.waitpid(pid, 0)
    os._exit(0)
"""

RANK_DEADLINE = """
import pytest
from pytest_distrank.api.children import default_timeout


@pytest.mark.world_size(2)
def test_rank_default_timeout(rank, request):
    assert default_timeout(request.node) == 89.0  # --distrank-timeout=100, less 10% and 1 s
"""

CHILDREN = Session(
    "children",
    {
        "test_kids.py": ORDINARY,
        "test_never_ran.py": NEVER_RAN,
        "test_kids_ranks.py": RANKS,
        "test_kids_fixes.py": FIXES,
        "test_kids_deadline.py": RANK_DEADLINE,
    },
    ("-ra", "-p", "no:randomly", "--distrank-timeout=100"),
)


@pytest.fixture
def kids(shared_session: SharedSession) -> Shared:
    return CHILDREN.run(shared_session)


def test_each_outcome_of_a_child_is_the_tests(kids: Shared) -> None:
    assert kids.outcomes(
        "test_passes",
        "test_fails_fork",
        "test_fails_spawn",
        "test_skips",
        "test_xfails",
        "test_method_spawned",
    ) == ["passed", "failed", "failed", "skipped", "skipped", "passed"]
    kids.result.stdout.fnmatch_lines(
        [
            "SKIPPED [1] test_kids.py:32: no engine here",
            "XFAIL test_kids.py::test_xfails - known engine bug",
        ],
        consecutive=False,
    )


@pytest.mark.parametrize(("test", "start", "right"), [("fork", "fork", 2), ("spawn", "spawn", 3)])
def test_a_childs_failure_is_reported_as_pytest_prints_it(
    kids: Shared, test: str, start: str, right: int
) -> None:
    kids.section(f"test_fails_{test}").fnmatch_lines(
        [
            f"AssertionError: assert 1 == {right} (in test_fails_{test}'s child ({start}, pid *))",
            f">       assert value() == {right}",
            f"E       assert 1 == {right}",
            "E        +  where 1 = value()",
            "test_kids.py:*: AssertionError",
            "*- Captured stdout call -*",
            "*child says hi",
        ]
    )


@pytest.mark.parametrize(
    ("test", "start", "limit"), [("fork", "fork", "1"), ("spawn", "spawn", "1.5")]
)
def test_a_hung_child_shows_its_stack_and_is_killed_with_its_tree(
    kids: Shared, test: str, start: str, limit: str
) -> None:
    assert kids.outcome(f"test_hangs_{test}") == "failed"
    lines = [
        f"test_hangs_{test}'s child ({start}, pid *) did not finish within {limit} s: "
        "stopped and killed.",
        "It was blocked in wait_forever at test_kids.py:12.",
        "Its stack when stopped (every thread, most recent call first):",
        '*File "*test_kids.py", line 12 in wait_forever',
        f'*File "*test_kids.py", line * in test_hangs_{test}',
    ]
    if test == "fork":  # the grandchild it started, named and killed (the leak check: gone)
        lines += [
            "test_hangs_fork's child (fork, pid *) left 1 process running, killed:",
            "  pid *: *python* -c import time; time.sleep(60)",
        ]
    kids.section(f"test_hangs_{test}").fnmatch_lines(lines)


def test_a_child_that_died_without_a_result_fails_naming_how(kids: Shared) -> None:
    assert kids.outcomes("test_segfaults", "test_exits_0") == ["failed", "failed"]
    kids.section("test_segfaults").fnmatch_lines(
        [
            "test_segfaults's child (fork, pid *) ended with signal SIGSEGV(-11) and wrote no "
            "result: its function never returned *",
            "*- Captured stderr call -*",
            "Fatal Python error: Segmentation fault",
        ]
    )
    kids.section("test_exits_0").fnmatch_lines(
        ["test_exits_0's child (fork, pid *) ended with exit code 0 and wrote no result: *"]
    )


def test_a_runner_that_never_ran_the_function_cannot_pass(kids: Shared) -> None:
    test = "test_a_runner_that_never_runs_the_function_cannot_pass"
    assert kids.outcome(test) == "failed"
    kids.section(test).fnmatch_lines(
        [f"{test}.<locals>.body's child (fork, pid *) ended with exit code 0 and wrote no result*"]
    )


def test_what_a_child_left_running_is_killed_and_named(kids: Shared) -> None:
    assert kids.outcomes("test_leaks_a_worker", "test_leak_fails_when_asked") == [
        "passed",
        "failed",
    ]
    kids.result.stdout.fnmatch_lines(
        [
            "test_kids.py::test_leaks_a_worker",
            "  *test_kids.py:*: PytestWarning: in_child: test_leaks_a_worker's child (fork, pid *) "
            "left 1 process running, killed:",
            "    pid *: sleep 60",
        ]
    )
    kids.section("test_leak_fails_when_asked").fnmatch_lines(
        [
            "test_leak_fails_when_asked's child (fork, pid *) passed, but left processes running "
            "(in_child(leftovers='fail'))",
            "*  pid *: sleep 61",
        ]
    )


def test_the_tests_deadline_sets_the_childs_timeout(kids: Shared) -> None:
    """``@pytest.mark.timeout(2)``: the child is stopped at what is left of that timer (2 s less
    the setup) * 0.9 - 1, at least half of it: about 1 s, before pytest-timeout's own timer would
    end the test without the child's stack."""
    section = kids.section("test_deadline_sets_the_timeout")
    section.fnmatch_lines(
        [
            "test_deadline_sets_the_timeout's child (fork, pid *) did not finish within * s: *",
            "It was blocked in wait_forever at test_kids.py:12.",
        ]
    )
    found = re.search(r"did not finish within ([0-9.]+) s", "\n".join(section.lines))
    assert found is not None and 0.5 <= float(found.group(1)) <= 1.0, section.lines


def test_a_ranks_test_forks_or_spawns_its_own_child(kids: Shared) -> None:
    assert kids.outcomes("test_rank_fork", "test_rank_spawn", "test_rank_hang") == [
        "failed",
        "passed",
        "failed",
    ]
    kids.section("test_rank_fork").fnmatch_lines(
        [
            "distrank: 1 of 2 ranks failed; root cause: rank 1/2",
            "  rank 1/2  failed in call: Failed: AssertionError: rank 1 of 2 fails (in "
            "test_rank_fork's child (fork, pid *))  <- root cause",
            "E       AssertionError: rank 1 of 2 fails",
            "*- Captured stdout call (rank 1/2) -*",
            "child of rank 1",
        ]
    )
    kids.section("test_rank_hang").fnmatch_lines(
        [
            "  rank 1/2  failed in call: Failed: test_rank_hang's child (fork, pid *) did not "
            "finish within 2.6 s: stopped and killed.  <- root cause",
            "It was blocked in test_rank_hang at test_kids_ranks.py:25.",
        ]
    )


def test_spawn_refuses_an_argument_that_does_not_pickle(kids: Shared) -> None:
    assert kids.outcome("test_rank_spawn_refuses_pg") == "failed"
    kids.section("test_rank_spawn_refuses_pg").fnmatch_lines(
        [
            "in_child(start='spawn') on test_rank_spawn_refuses_pg: its argument pg (*) cannot be "
            "sent to a spawned child: *. Use start='fork', or leave that fixture out of the "
            "test's arguments.",
        ]
    )


def test_a_test_whose_call_is_not_its_run_is_refused(kids: Shared) -> None:
    assert kids.outcomes("test_async_refused", "test_subtests_refused") == ["failed", "failed"]
    kids.section("test_async_refused").fnmatch_lines(["*async def functions are not natively*"])
    kids.section("test_subtests_refused").fnmatch_lines(
        ["in_child on test_subtests_refused: the subtests fixture reports through the child's *"]
    )


def test_a_failed_unittest_subtest_fails_the_test(kids: Shared) -> None:
    assert kids.outcome("test_subtest_fails") == "failed"
    kids.section("TestUnittest.test_subtest_fails").fnmatch_lines(
        [
            "1 subtest failed, first test_subtest_fails (*) (i=1): AssertionError: 1 == 1 (in "
            "TestUnittest.test_subtest_fails's child (fork, pid *))",
            "test_kids_fixes.py:*: in test_subtest_fails",
            "E   AssertionError: 1 == 1",
        ]
    )


def test_unittest_skips_are_skips_and_xfail_raises_matches(kids: Shared) -> None:
    assert kids.outcomes(
        "test_skiptest",
        "test_unittest_skip",
        "test_xfail_raises_matches",
        "test_xfail_raises_other",
    ) == ["skipped", "skipped", "skipped", "failed"]
    kids.result.stdout.fnmatch_lines(
        [
            "SKIPPED ?1? test_kids_fixes.py:*: no engine in this case",
            "SKIPPED ?1? test_kids_fixes.py:*: no engine here either",
            "XFAIL test_kids_fixes.py::test_xfail_raises_matches - known ValueError",
        ],
        consecutive=False,
    )
    kids.section("test_xfail_raises_other").fnmatch_lines(
        ["ValueError: not the known one (in test_xfail_raises_other's child (fork, pid *))"]
    )


def test_the_childs_timeout_holds_whatever_the_test_does_to_the_clock(kids: Shared) -> None:
    """A patched ``time.monotonic``; a setup that used most of pytest-timeout's timer (3 s,
    1.5 s of it left: the child is stopped at 1.5 * 0.9 - 1 -> 0.8 s, at least half); a
    rank's default from ``--distrank-timeout`` (100 -> 89 s)."""
    kids.section("test_frozen_clock").fnmatch_lines(
        ["test_frozen_clock's child (fork, pid *) did not finish within 1 s: stopped and killed."]
    )
    kids.section("test_setup_counts").fnmatch_lines(
        ["test_setup_counts's child (fork, pid *) did not finish within 0.? s: stopped and killed."]
    )
    assert kids.outcome("test_rank_default_timeout") == "passed"


def test_a_finished_background_job_is_not_left_running(kids: Shared) -> None:
    assert kids.outcome("test_a_finished_job_is_not_left") == "passed"


def test_spawn_finds_the_function_below_a_plain_decorator_and_keeps_the_warning_filters(
    kids: Shared,
) -> None:
    """A decorator without functools.wraps: the child finds the function through its closure
    (it used to call the decorator, which started in_child again, and again)."""
    assert kids.outcomes(
        "test_spawn_under_a_plain_decorator", "test_spawn_keeps_warning_filters"
    ) == ["passed", "failed"]
    kids.section("test_spawn_keeps_warning_filters").fnmatch_lines(
        ["UserWarning: a warning as an error (in test_spawn_keeps_warning_filters's child *"]
    )


def test_the_childs_warnings_reach_the_summary(kids: Shared) -> None:
    assert kids.outcomes("test_child_warns", "test_a_thread_raises") == ["passed", "passed"]
    kids.result.stdout.fnmatch_lines(
        [
            "test_kids_fixes.py::test_child_warns",
            "  *test_kids_fixes.py:*: UserWarning: warned in the child",
            "test_kids_fixes.py::test_a_thread_raises",
            "  *: PytestUnhandledThreadExceptionWarning: Exception in thread booming",
            "*RuntimeError: thread boom",
        ],
        consecutive=False,
    )


def test_finalizers_added_in_the_child_run_there(kids: Shared) -> None:
    assert kids.outcomes("test_finalizer_runs", "test_fixture_teardown_runs") == [
        "failed",
        "failed",
    ]
    kids.section("test_finalizer_runs").fnmatch_lines(
        ["RuntimeError: the finalizer ran in the child (in test_finalizer_runs's child *"]
    )
    kids.section("test_fixture_teardown_runs").fnmatch_lines(
        ["RuntimeError: the fixture's teardown ran in the child (in test_fixture_teardown_runs*"]
    )


def test_a_process_the_function_forked_writes_no_result(kids: Shared) -> None:
    assert kids.outcome("test_a_forked_helper_falls_out") == "failed"
    kids.section("test_a_forked_helper_falls_out").fnmatch_lines(
        [
            "test_a_forked_helper_falls_out's child (fork, pid *) ended with exit code 0 and wrote "
            "no result: *",
            "*- Captured stderr call -*",
            "in_child: pid *, forked by the test's function, passed out of it; it exits here *",
        ]
    )


PARENT_DIES = """
import os, subprocess, time
import pytest
from pytest_distrank import in_child


@pytest.fixture
def slow_setup():
    time.sleep(1.5)


@pytest.mark.timeout(2, method="thread")  # counts the setup; ends the process with os._exit
@in_child()
def test_parent_dies(slow_setup):
    worker = subprocess.Popen(["sleep", "1000"])
    with open("worker.pid", "w") as f:
        f.write(str(worker.pid))
    time.sleep(100)
"""


def test_a_child_whose_parent_dies_ends_its_tree(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    """pytest-timeout's thread method ends the test's process with ``os._exit``: the child is
    told (its parent-death signal) and kills what it started. Its own session: the pytest
    process dies in it."""
    pytester.makepyfile(test_parent_dies=PARENT_DIES)
    result = run_pytest("-p", "no:randomly")
    result.stdout.fnmatch_lines(["*+ Timeout +*"])
    pid = int(Path(pytester.path, "worker.pid").read_text())
    end = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    assert not _alive(pid), f"the child's worker (pid {pid}) outlived the test's process"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
