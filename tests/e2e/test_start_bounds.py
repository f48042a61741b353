"""Bounds on starting pools: a fork server whose preload hangs, a world size far beyond the cores.

Runs in the outer pytest process; the hanging preload is a session of its own (``run_pytest``),
the crowded world size a case of the ``ERRORS`` session (tests/e2e/test_errors.py).
"""

from __future__ import annotations

import time

import pytest

from ..helpers import RunPytest, SharedSession
from .test_errors import ERRORS


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


def test_world_size_far_beyond_the_cores_is_noted(shared_session: SharedSession) -> None:
    """In the ERRORS session of tests/e2e/test_errors.py, whose controller believes the machine
    has 1 core (8 ranks per core at most before the note; was 2 cores, world sizes 16 and 17)."""
    errors = ERRORS.run(shared_session)
    assert errors.outcomes("test_eight", "test_nine") == ["passed", "passed"]
    errors.result.stdout.fnmatch_lines(
        [
            "*- distrank -*",
            "world size 9 (test_crowd.py::test_nine) runs more than 8 ranks per CPU core "
            "(1 core): *",
        ]
    )
    assert "world size 8 (" not in errors.text
