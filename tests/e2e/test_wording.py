"""End-to-end: failure reports read right in the corner cases (#11 items 18-21).

Identical tracebacks shown once under the default --tb, huge messages cut in the table, a clear
error for world_size(2, 4) on a unittest class, and the wording of odd failures. The text itself
is unit-tested where a pure function makes it (tests/unit/test_merge_wording.py); here real ranks
fail, crash, stop and replace their group, in one inner session (``wording``), each scenario in a
file of its own, checked from its own failure section. The unittest error starts no rank: it runs
in-process.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ..helpers import RunPytest, SharedSession

HEADER = "import ctypes, faulthandler, unittest, pytest, torch, torch.distributed as dist\n"

SCENARIOS = {
    "test_same.py": """
@pytest.mark.world_size(2)
def test_same(rank):
    raise RuntimeError("the same on every rank")
""",
    "test_huge.py": """
@pytest.mark.world_size(2)
def test_huge(rank):
    if rank == 1:
        raise ValueError("x" * 2_000_000)
""",
    "test_lookup.py": """
@pytest.mark.world_size(2)
def test_lookup(rank, no_such_fixture):
    pass
""",
    "test_reinit.py": """
@pytest.mark.world_size(2)
def test_reinit(rank, world_size, dist_store):
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist_store, rank=rank, world_size=world_size)

@pytest.mark.world_size(2)
def test_zz_after(rank, pg):
    dist.barrier(group=pg)
""",
    "test_segv.py": """
@pytest.mark.world_size(2)
def test_a_disables(rank):
    faulthandler.disable()

@pytest.mark.world_size(2)
def test_b_segfaults(rank):
    if rank == 1:
        ctypes.string_at(0)
""",
    "test_stops.py": """
import os, signal

@pytest.mark.world_size(2)
@pytest.mark.timeout(3)
def test_stops(rank):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
""",
}


def _write(folder: Path) -> None:
    for name, source in SCENARIOS.items():
        (folder / name).write_text(HEADER + source)


@pytest.fixture
def wording(shared_session: SharedSession) -> pytest.RunResult:
    return shared_session("wording", _write, "-v", "-ra", "--distrank-failure-grace=1")


def _failure(result: pytest.RunResult, test: str) -> list[str]:
    """The lines of ``test``'s failure or error section."""
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if re.fullmatch(rf"_+ {test} _+", line))
    rest = lines[start + 1 :]
    ends = [i for i, line in enumerate(rest) if re.fullmatch(r"([_=])\1+ .+ \1+", line)]
    return rest[: ends[0] if ends else len(rest)]


def test_wording_session_totals(wording: pytest.RunResult) -> None:
    wording.assert_outcomes(passed=3, failed=4, errors=1)


def test_identical_tracebacks_are_shown_once_under_the_default_tb(
    wording: pytest.RunResult,
) -> None:
    lines = _failure(wording, "test_same")
    # Whichever rank failed first is the root cause; the other's traceback is not repeated.
    pytest.LineMatcher(lines).fnmatch_lines(["*- traceback of rank */2 -*", "the same as rank */2"])
    assert "\n".join(lines).count('raise RuntimeError("the same on every rank")') == 1


def test_huge_exception_message_is_cut_in_the_table(wording: pytest.RunResult) -> None:
    rows = [line for line in _failure(wording, "test_huge") if line.startswith("  rank 1/2  ")]
    assert len(rows) == 1 and len(rows[0]) < 400, rows[0][:500]
    assert rows[0].endswith("…  <- root cause")
    wording.stdout.fnmatch_lines(["test_huge.py::test_huge FAILED*"])


def test_missing_fixture_row_names_the_fixture(wording: pytest.RunResult) -> None:
    wording.stdout.fnmatch_lines(["test_lookup.py::test_lookup ERROR*"])
    pytest.LineMatcher(_failure(wording, "ERROR at setup of test_lookup")).fnmatch_lines(
        ["  rank 0/2  failed in setup: fixture 'no_such_fixture' not found*"]
    )


def test_replaced_default_group_is_called_replaced(wording: pytest.RunResult) -> None:
    wording.stdout.fnmatch_lines(
        ["test_reinit.py::test_reinit PASSED*", "test_reinit.py::test_zz_after PASSED*"]
    )
    wording.stdout.fnmatch_lines(
        [
            "pool killed after a fault: *test_reinit replaced the default process group "
            "(init_process_group was called again)",
        ]
    )


def test_segfault_after_the_test_disabled_faulthandler_still_shows_the_stack(
    wording: pytest.RunResult,
) -> None:
    wording.stdout.fnmatch_lines(
        ["test_segv.py::test_a_disables PASSED*", "test_segv.py::test_b_segfaults FAILED*"]
    )
    lines = _failure(wording, "test_b_segfaults")
    pytest.LineMatcher(lines).fnmatch_lines(
        ["*rank 1/2 crashed in call with SIGSEGV(-11)*", "*Fatal Python error: Segmentation fault*"]
    )
    assert "It wrote nothing" not in "\n".join(lines)


def test_stopped_rank_is_said_to_be_stopped(wording: pytest.RunResult) -> None:
    pytest.LineMatcher(_failure(wording, "test_stops")).fnmatch_lines(
        [
            "  rank 1/2  timed out in call after 3 s; no stack: the rank was stopped (SIGSTOP, "
            "SIGTSTP or a debugger) and could not answer the dump signal*",
        ]
    )


def test_several_sizes_on_a_unittest_class_is_an_error(
    pytester: pytest.Pytester, run_inprocess: RunPytest
) -> None:
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2, 4)
class TestOld(unittest.TestCase):
    def test_one(self):
        pass
"""
    )
    result = run_inprocess("-ra")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*world_size(2, 4) on the unittest.TestCase method 'test_one': pytest never "
            "parametrizes unittest.TestCase methods*",
        ]
    )
