"""End-to-end: a distributed test reaches its ranks only when pytest runs it, after the
controller has finished with the test before (its reports, its hooks, its fixture teardown).

Ranks used to run a pool's next test while the controller still reported the last
(``--distrank-dispatch=ahead``); that started a module's test before the previous module's
controller-side fixtures were torn down, and charged slow controller hooks to the next test's
deadline (hostile review 3, D6 and D7). A paired run of 2,000 ws4 tests (bench/bench_dispatch.py)
found no gain, so it went; these checks keep the order it broke. One inner session.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..helpers import SharedSession

#: Controller side only (ranks load conftest.py too): a slow report hook, for one test.
CONFTEST = """
import os, time

def pytest_runtest_logreport(report):
    if os.environ.get("DISTRANK_RANK") is None and report.when == "call" \\
            and report.nodeid.endswith("test_a_slow_to_report"):
        time.sleep(4)  # e.g. uploading the result to a dashboard
"""

MODULE_A = """
import os, time, pytest, torch, torch.distributed as dist
from pathlib import Path

@pytest.fixture(scope="module")
def scratch_db():
    lock = Path(os.environ["ORDER_STATE"]) / "db.lock"
    lock.write_text("held by test_a.py")
    yield lock
    time.sleep(1)  # flush and close
    lock.unlink()

def test_a_ordinary(scratch_db):
    assert scratch_db.exists()

@pytest.mark.world_size(2)
def test_a_slow_to_report(rank, pg):
    dist.barrier()

@pytest.mark.world_size(2)
@pytest.mark.timeout(3)
def test_a_quick_after_a_slow_hook(rank, pg):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2

@pytest.mark.world_size(2)
def test_a_dist(rank):
    pass
"""

MODULE_B = """
import os, pytest
from pathlib import Path

@pytest.mark.world_size(2)
def test_b_dist(rank):
    lock = Path(os.environ["ORDER_STATE"]) / "db.lock"
    assert not lock.exists(), "test_a.py's module fixture is not torn down yet"
"""

MIXED = """
import pytest

@pytest.mark.world_size(2)
def test_d1(rank):
    pass

def test_plain1():
    pass

@pytest.mark.world_size(2)
def test_d2(rank):
    pass

@pytest.mark.world_size(3)
def test_w3(rank):
    pass

@pytest.mark.world_size(2)
def test_d3(rank):
    pass

def test_plain2():
    pass
"""


def _write(folder: Path) -> None:
    (folder / "state").mkdir()
    (folder / "conftest.py").write_text(CONFTEST)
    (folder / "test_a.py").write_text(MODULE_A)
    (folder / "test_b.py").write_text(MODULE_B)
    (folder / "test_mixed.py").write_text(MIXED)


@pytest.fixture
def order_session(shared_session: SharedSession) -> pytest.RunResult:
    return shared_session("order", _write, "-v", env={"ORDER_STATE": "{folder}/state"})


def test_the_previous_modules_fixtures_are_torn_down_before_the_next_test(
    order_session: pytest.RunResult,
) -> None:
    order_session.stdout.fnmatch_lines(["*test_b.py::test_b_dist PASSED*"])


def test_a_slow_controller_hook_is_not_charged_to_the_next_test(
    order_session: pytest.RunResult,
) -> None:
    order_session.stdout.fnmatch_lines(
        ["*::test_a_slow_to_report PASSED*", "*::test_a_quick_after_a_slow_hook PASSED*"]
    )
    order_session.stdout.no_fnmatch_line("*pool killed after a fault*")


def test_ordinary_tests_and_other_pools_between_keep_their_order(
    order_session: pytest.RunResult,
) -> None:
    order_session.assert_outcomes(passed=11)
    names = ["d1", "plain1", "d2", "w3", "d3", "plain2"]
    order_session.stdout.fnmatch_lines(
        [f"*::test_{name} PASSED*" for name in names], consecutive=True
    )
