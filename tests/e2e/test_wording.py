"""End-to-end: failure reports read right in the corner cases (#11 items 18-21).

Identical tracebacks shown once under the default --tb, huge messages cut in the table, a clear
error for world_size(2, 4) on a unittest class, and the wording of odd failures.
"""

from __future__ import annotations

import pytest

from ..helpers import RunPytest

HEADER = "import ctypes, faulthandler, unittest, pytest, torch, torch.distributed as dist\n"


def test_identical_tracebacks_are_shown_once_under_the_default_tb(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
def test_same(rank):
    raise RuntimeError("the same on every rank")
"""
    )
    result = run_pytest()
    result.assert_outcomes(failed=1)
    # Whichever rank failed first is the root cause; the other's traceback is not repeated.
    result.stdout.fnmatch_lines(["*- traceback of rank */2 -*", "the same as rank */2"])
    assert result.stdout.str().count('raise RuntimeError("the same on every rank")') == 1


def test_huge_exception_message_is_cut_in_the_table(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
def test_huge(rank):
    if rank == 1:
        raise ValueError("x" * 2_000_000)
"""
    )
    result = run_pytest("-ra")
    result.assert_outcomes(failed=1)
    rows = [line for line in result.stdout.lines if line.startswith("  rank 1/2  ")]
    assert len(rows) == 1 and len(rows[0]) < 400, rows[0][:500]
    assert rows[0].endswith("…  <- root cause")


def test_several_sizes_on_a_unittest_class_is_an_error(
    pytester: pytest.Pytester, run_pytest: RunPytest
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
    result = run_pytest("-ra")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*world_size(2, 4) on the unittest.TestCase method 'test_one': pytest never "
            "parametrizes unittest.TestCase methods*",
        ]
    )


def test_missing_fixture_row_names_the_fixture(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
def test_lookup(rank, no_such_fixture):
    pass
"""
    )
    result = run_pytest("-ra")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["  rank 0/2  failed in setup: fixture 'no_such_fixture' not found*"]
    )


def test_replaced_default_group_is_called_replaced(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
def test_reinit(rank, world_size, dist_store):
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist_store, rank=rank, world_size=world_size)

@pytest.mark.world_size(2)
def test_zz_after(rank, pg):
    dist.barrier(group=pg)
"""
    )
    result = run_pytest("-ra")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "pool killed after a fault: *test_reinit replaced the default process group "
            "(init_process_group was called again)",
        ]
    )


def test_segfault_after_the_test_disabled_faulthandler_still_shows_the_stack(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
def test_a_disables(rank):
    faulthandler.disable()

@pytest.mark.world_size(2)
def test_b_segfaults(rank):
    if rank == 1:
        ctypes.string_at(0)
"""
    )
    result = run_pytest("-ra", "--distrank-failure-grace=1")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        ["*rank 1/2 crashed in call with SIGSEGV(-11)*", "*Fatal Python error: Segmentation fault*"]
    )
    assert "It wrote nothing" not in result.stdout.str()


def test_stopped_rank_is_said_to_be_stopped(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        HEADER
        + """
import os, signal

@pytest.mark.world_size(2)
@pytest.mark.timeout(3)
def test_stops(rank):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
"""
    )
    result = run_pytest("-ra")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "  rank 1/2  timed out in call after 3 s; no stack: the rank was stopped (SIGSTOP, "
            "SIGTSTP or a debugger) and could not answer the dump signal*",
        ]
    )
