"""Bounds on starting pools: a fork server whose preload hangs, a world size far beyond the cores.

Runs in the outer pytest process; every case is an end-to-end ``pytest -p distrank`` run in a
subprocess (``run_pytest``).
"""

from __future__ import annotations

import time

import pytest

from ..helpers import RunPytest


def test_hanging_preload_fails_the_start_within_the_limit(
    pytester: pytest.Pytester, run_pytest: RunPytest, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(sleepy="import time\ntime.sleep(3600)\n")
    monkeypatch.setenv("PYTHONPATH", str(pytester.path))  # the fork server imports it
    monkeypatch.setenv("DISTRANK_START_TIMEOUT", "3")
    pytester.makepyfile(
        test_hang="""
        import pytest

        @pytest.mark.world_size(1)
        def test_one(rank):
            pass

        @pytest.mark.world_size(2)
        def test_two(rank):
            pass

        def test_plain():
            pass
        """
    )
    started = time.monotonic()
    result = run_pytest("-ra", "--distrank-preload=sleepy", timeout=90)
    assert time.monotonic() - started < 60
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*the fork server did not finish importing its preload modules within 3 s (the pool "
            "start limit, from DISTRANK_START_TIMEOUT=3 (environment)), so no rank could start*",
            "*--distrank-preload: sleepy, from --distrank-preload=sleepy (command line).",
            "One of them hangs at import*",
            "ERROR test_hang.py::test_one - *the fork server did not finish importing*",
            "ERROR test_hang.py::test_two - *the fork server did not finish importing*",
        ]
    )


#: Makes the pytest process believe the machine has 2 cores, whatever it has.
TWO_CORES = """
import os

if "DISTRANK_RANK" not in os.environ:
    os.cpu_count = lambda: 2
"""


def test_world_size_far_beyond_the_cores_is_noted(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makeconftest(TWO_CORES)
    pytester.makepyfile(
        test_crowd="""
        import pytest

        @pytest.mark.world_size(16)
        def test_sixteen(rank):
            pass

        @pytest.mark.world_size(17)
        def test_seventeen(rank):
            pass
        """
    )
    result = run_pytest()
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*- distrank -*",
            "world size 17 (test_crowd.py::test_seventeen) runs more than 8 ranks per CPU core "
            "(2 cores): *",
        ]
    )
    assert "world size 16 (" not in result.stdout.str()
