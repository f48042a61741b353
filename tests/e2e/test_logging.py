"""End-to-end: log capture inside ranks (caplog, "Captured log" sections) works as in pytest.

Ranks replace pytest's per-phase handler attachment with relays
(pytest_distrank/pool/worker/ranklogs.py); these tests pin down that records from propagating and
non-propagating loggers, torch's included, still reach caplog and the report sections in every
phase. One inner session (``logging``) runs both scenarios, each in a file of its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..helpers import RunPytest, SharedSession

LOGS = """
import logging, pytest

quiet = logging.getLogger("mylib.quiet")
quiet.propagate = False
loud = logging.getLogger("mylib.loud")

@pytest.fixture
def noisy():
    quiet.warning("setup from quiet")
    yield
    quiet.warning("teardown from quiet")

@pytest.mark.world_size(2)
def test_caplog_sees_every_logger(rank, caplog, noisy):
    caplog.set_level(logging.INFO)
    quiet.info("quiet on rank %d", rank)
    loud.info("loud on rank %d", rank)
    logging.getLogger("torch.distributed").warning("torch.distributed on rank %d", rank)
    assert not logging.getLogger("torch.distributed").propagate
    assert [r.getMessage() for r in caplog.records] == [
        f"quiet on rank {rank}", f"loud on rank {rank}", f"torch.distributed on rank {rank}"
    ]
    assert [r.getMessage() for r in caplog.get_records("setup")] == ["setup from quiet"]

@pytest.mark.world_size(2)
def test_later_logger_and_levels(rank, caplog):
    late = logging.getLogger("mylib.late")
    late.propagate = False
    late.warning("late in call")  # created during the phase: pytest misses it too
    caplog.set_level(logging.ERROR, logger="mylib.quiet")
    quiet.warning("below the level")
    quiet.error("at the level")
    assert [r.getMessage() for r in caplog.records] == ["at the level"]

@pytest.mark.world_size(2)
def test_next_phase_covers_the_later_logger(rank, caplog):
    logging.getLogger("mylib.late").warning("late, one test later")
    assert [r.getMessage() for r in caplog.records] == ["late, one test later"]

@pytest.mark.world_size(2)
def test_fails_with_log_section(rank):
    quiet.warning("quiet says hi from rank %d", rank)
    assert rank == 0
"""


CLEARS = """
import logging, pytest

quiet = logging.getLogger("mylib.quiet")
quiet.propagate = False

@pytest.mark.world_size(2)
def test_a_clears(rank, caplog):
    quiet.warning("before")
    quiet.handlers.clear()

@pytest.mark.world_size(2)
def test_b_still_captured(rank, caplog):
    quiet.warning("after on rank %d", rank)
    assert [r.getMessage() for r in caplog.records] == [f"after on rank {rank}"]
"""


def _write(folder: Path) -> None:
    (folder / "test_logs.py").write_text(LOGS)
    (folder / "test_clears.py").write_text(CLEARS)


@pytest.fixture
def logging_session(shared_session: SharedSession) -> pytest.RunResult:
    # The cache turned off, as many CI setups do: ranks must start without it (the cache fixture
    # of ranks, test_rank_cmdline.py, must not assume it).
    return shared_session("logging", _write, "-v", "-p", "no:cacheprovider")


def test_log_capture_in_ranks(logging_session: pytest.RunResult) -> None:
    logging_session.assert_outcomes(passed=5, failed=1)
    logging_session.stdout.fnmatch_lines(
        [
            "*test_logs.py::test_caplog_sees_every_logger*PASSED*",
            "*test_logs.py::test_later_logger_and_levels*PASSED*",
            "*test_logs.py::test_next_phase_covers_the_later_logger*PASSED*",
            "*test_logs.py::test_fails_with_log_section*FAILED*",
        ]
    )
    logging_session.stdout.fnmatch_lines(
        ["*Captured log call*", "WARNING  mylib.quiet:test_logs.py:* quiet says hi from rank 1"]
    )


def test_caplog_recovers_after_a_test_clears_a_loggers_handlers(
    logging_session: pytest.RunResult,
) -> None:
    logging_session.stdout.fnmatch_lines(
        ["*test_clears.py::test_a_clears*PASSED*", "*test_clears.py::test_b_still_captured*PASSED*"]
    )


def test_pools_start_with_the_cache_turned_off(logging_session: pytest.RunResult) -> None:
    """``-p no:cacheprovider``: no ``cache_dir`` ini in ranks, and no cache to make for them."""
    assert "could not start the ranks" not in logging_session.stdout.str()
    logging_session.stdout.fnmatch_lines(["*test_logs.py::test_caplog_sees_every_logger*PASSED*"])


#: torch's c10d logger test (test_c10d_logger.py) counts the handlers of a non-propagating
#: logger: with pytest's log capture off, a rank adds none (#27).
NO_CAPTURE = """
import logging, pytest


@pytest.mark.world_size(2)
def test_a_non_propagating_logger_keeps_its_own_handlers(rank):
    logger = logging.getLogger("mylib.own")
    logger.propagate = False
    logger.addHandler(logging.NullHandler())
    logging.getLogger("mylib.own").warning("after the logger was made")


@pytest.mark.world_size(2)
def test_next(rank):
    assert [type(h).__name__ for h in logging.getLogger("mylib.own").handlers] == ["NullHandler"]
"""


def test_without_log_capture_ranks_leave_loggers_alone(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(test_no_capture=NO_CAPTURE)
    result = run_pytest("-p", "no:logging")
    result.assert_outcomes(passed=2)
