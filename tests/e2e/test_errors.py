"""End-to-end: misuse, bad markers, unmet requirements and bad options, each an error or skip of
exactly the test it concerns (or a usage error naming the option and where its value came from).

Sessions that start no rank (misuse in ordinary tests, skips decided before any rank starts,
option errors, the header) run in-process (``run_inprocess``). The cases that must show the
distributed tests beside them still pass share one inner session, ``ERRORS``, which also holds
two cases of other files that need its options (a huge deadline from pytest-timeout's
``--timeout``, tests/e2e/test_honest.py; a world size far beyond the cores,
tests/e2e/test_start_bounds.py).
"""

from __future__ import annotations

import pytest

from ..helpers import RunPytest, SharedSession
from .test_faults import HEADER, NO_RECORDER, Session, Shared, huge_deadline_case

BAD_MARKERS = [
    ("world_size(0)", "@pytest.mark.world_size(0): world size 0 is not a positive integer*"),
    ("world_size(-1)", "@pytest.mark.world_size(-1): world size -1 is not a positive*"),
    ("world_size('four')", "*world_size('four'): world size 'four' is not a positive*"),
    ("world_size(True)", "@pytest.mark.world_size(True): world size True is not a positive*"),
    ("world_size(2, backend='glooo')", "*unknown backend 'glooo'; expected one of gloo, *"),
    ("world_size(2, backend=3)", "*backend must be a string, got 3*"),
    ("world_size(2, init_process_group='no')", "*init_process_group must be True or False*"),
    ("world_size(2, sizes=3)", "*unknown keyword 'sizes'*"),
    ("world_size(2, 2)", "*world size given twice*"),
]

#: Makes the controller believe the machine has 1 core, whatever it has.
ONE_CORE = """
import os

if "DISTRANK_RANK" not in os.environ:
    os.cpu_count = lambda: 1
"""

BESIDE_BAD_MARKERS = (
    "import pytest\n"
    + "".join(
        f"""

@pytest.mark.{marker}
def test_bad_{i}():
    pass
"""
        for i, (marker, _) in enumerate(BAD_MARKERS)
    )
    + """

@pytest.mark.world_size(2)
def test_good(rank):
    pass


def test_plain():
    pass
"""
)

BAD_TIMEOUT = """
import pytest


@pytest.mark.timeout(-1)
@pytest.mark.world_size(2)
def test_negative(rank):
    pass


@pytest.mark.world_size(2)
def test_fine(rank):
    pass
"""

FAKED_GPU = """
import pytest


@pytest.mark.world_size(2)
@pytest.mark.requires_nccl
def test_nccl():
    pass


@pytest.mark.world_size(2)
@pytest.mark.requires_gpus(1)
def test_one_gpu(rank):
    pass
"""

#: The default world size: 4 in the ini file, 3 in the environment, 2 on the command line.
SIZE = """
import pytest


@pytest.mark.world_size()
def test_size(world_size):
    assert world_size == 3
"""

CROWD = """
import pytest


@pytest.mark.world_size(8)
def test_eight(rank):
    pass


@pytest.mark.world_size(9)
def test_nine(rank):
    pass
"""

#: No timeout marker: the deadline is pytest-timeout's --timeout=3000000.
HUGE_PYTEST_TIMEOUT = HEADER + huge_deadline_case("huge_pytest_timeout")

ERRORS = Session(
    "test_errors.ERRORS",
    {
        "tox.ini": "[pytest]\ndistrank_world_size = 4\ndistrank_timeout = 50\n",
        "conftest.py": ONE_CORE,
        "test_beside_bad_markers.py": BESIDE_BAD_MARKERS,
        "test_bad_timeout.py": BAD_TIMEOUT,
        "test_faked_gpu.py": FAKED_GPU,
        "test_size.py": SIZE,
        "test_crowd.py": CROWD,
        "test_huge_pytest_timeout.py": HUGE_PYTEST_TIMEOUT,
    },
    ("-ra", "--distrank-world-size=2", "--timeout=3000000"),
    {"DISTRANK_WORLD_SIZE": "3", "DISTRANK_FAKE_GPU_COUNT": "1"},
)


@pytest.fixture
def errors(shared_session: SharedSession) -> Shared:
    return ERRORS.run(shared_session)


def test_rank_fixture_in_ordinary_test_is_an_error_of_that_test(
    pytester: pytest.Pytester, run_inprocess: RunPytest
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.fixture(scope="module")
        def per_rank(rank):
            return rank

        def test_direct(world_size):
            pass

        def test_indirect(per_rank):
            pass

        def test_fine():
            pass
        """
    )
    result = run_inprocess("-ra")
    result.assert_outcomes(errors=2, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*::test_direct uses the distributed fixture 'world_size', which exists only inside "
            "rank processes, but the test has no world_size marker.",
            "Add @pytest.mark.world_size(n) (e.g. @pytest.mark.world_size(2)) to run it on n "
            "ranks.",
        ]
    )
    result.stdout.fnmatch_lines(["*::test_indirect uses the distributed fixture 'rank'*"])


@pytest.mark.parametrize(("marker", "message"), BAD_MARKERS)
def test_bad_marker_is_an_error_of_one_test(errors: Shared, marker: str, message: str) -> None:
    test = f"test_bad_{BAD_MARKERS.index((marker, message))}"
    beside = errors.outcomes("test_good", "test_plain")
    assert [errors.outcome(test), *beside] == ["error at setup", "passed", "passed"]
    errors.result.stdout.fnmatch_lines([f"*ERROR at setup of {test}*"])
    errors.section(test).fnmatch_lines([f"*::{test}: {message}"])


def test_requires_nccl_and_gpus_skip_before_any_rank_starts(
    pytester: pytest.Pytester, run_inprocess: RunPytest
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.world_size(2)
        @pytest.mark.requires_nccl
        def test_nccl(device):
            raise AssertionError("must not run")

        @pytest.mark.world_size(2)
        @pytest.mark.requires_gpus(1)
        def test_gpus(rank):
            raise AssertionError("must not run")

        @pytest.mark.requires_gpus(2)
        def test_plain_gpus():
            raise AssertionError("must not run")
        """
    )
    result = run_inprocess("-rs")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines_random(
        [
            "SKIPPED*requires_nccl: needs NCCL and 2 GPUs, *",
            "SKIPPED*requires_gpus(1): needs 1 GPU, found 0",
            "SKIPPED*requires_gpus(2): needs 2 GPUs, found 0",
        ]
    )
    result.stdout.no_fnmatch_line("*pools started*")
    assert not list(pytester.path.rglob("pool*-rank*.log"))


def test_faked_gpu_count_still_needs_nccl(errors: Shared) -> None:
    """DISTRANK_FAKE_GPU_COUNT=1 in the ERRORS session."""
    assert errors.outcomes("test_nccl", "test_one_gpu") == ["skipped", "passed"]
    errors.result.stdout.fnmatch_lines(["SKIPPED*requires_nccl: needs NCCL and 2 GPUs*"])


@pytest.mark.parametrize("backend", ["mpi", "ucc"])
def test_unavailable_backend_is_a_skip(
    pytester: pytest.Pytester, run_inprocess: RunPytest, backend: str
) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.world_size(2, backend="{backend}")
        def test_backend():
            raise AssertionError("must not run")
        """
    )
    result = run_inprocess("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [f"SKIPPED*backend '{backend}' is not available in this torch build (torch *)"]
    )


def test_invalid_option_on_command_line(run_inprocess: RunPytest) -> None:
    result = run_inprocess("--distrank-world-size=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: pytest-distrank: invalid value '0' for --distrank-world-size "
            "(ini: distrank_world_size, env: DISTRANK_WORLD_SIZE), from "
            "--distrank-world-size=0 (command line):",
            "  expected a positive integer",
        ]
    )


def test_invalid_option_from_environment(
    run_inprocess: RunPytest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTRANK_START_METHOD", "fork")
    result = run_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*invalid value 'fork' for --distrank-start-method*from DISTRANK_START_METHOD=fork "
            "(environment):",
            "  expected one of forkserver, forkserver-late, spawn",
        ]
    )


def test_invalid_option_from_ini(pytester: pytest.Pytester, run_inprocess: RunPytest) -> None:
    pytester.makeini("[pytest]\ndistrank_timeout = soon\n")
    result = run_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*invalid value 'soon' for --distrank-timeout*from distrank_timeout = soon (in tox.ini):"]
    )


def test_command_line_beats_environment_beats_ini(
    pytester: pytest.Pytester, run_inprocess: RunPytest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resolved values, as the header shows them (no rank needed); the next test checks
    that ranks get them."""
    pytester.makeini("[pytest]\ndistrank_world_size = 4\ndistrank_timeout = 50\n")
    monkeypatch.setenv("DISTRANK_WORLD_SIZE", "3")
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = run_inprocess()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["distrank: *timeout 50 s (distrank_timeout = 50 (in tox.ini)), default world size 3"]
    )
    result = run_inprocess("--distrank-world-size=2", "--timeout=7")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "distrank: *timeout 7 s (--timeout=7* (pytest-timeout, command line)), "
            "default world size 2"
        ]
    )


def test_command_line_beats_environment_beats_ini_in_ranks(
    shared_session: SharedSession,
) -> None:
    """The ranks' world size: the environment's 3 beats the ini file's 4 (NO_RECORDER, of
    tests/e2e/test_faults.py); the command line's 2 beats both (ERRORS): ``assert world_size
    == 3`` fails on both of its ranks alike."""
    no_recorder = NO_RECORDER.run(shared_session)
    assert no_recorder.outcome("test_world_size_from_env") == "passed"
    no_recorder.result.stdout.fnmatch_lines(["distrank: *default world size 3"])
    errors = ERRORS.run(shared_session)
    assert errors.outcome("test_size") == "failed"
    errors.section("test_size").fnmatch_lines(
        ["*- traceback of rank */2 -*", "the same as rank */2"]
    )
    errors.result.stdout.fnmatch_lines(["distrank: *default world size 2"])


def test_own_fixtures_and_params_with_rank_names_are_not_misuse(
    pytester: pytest.Pytester, run_inprocess: RunPytest
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.fixture
        def rank():
            return 42

        @pytest.mark.parametrize("backend", ["mine"])
        def test_param(backend):
            assert backend == "mine"

        def test_own_rank(rank):
            assert rank == 42
        """
    )
    run_inprocess().assert_outcomes(passed=2)


def test_bad_timeout_marker_is_an_error_of_that_test(errors: Shared) -> None:
    assert errors.outcomes("test_negative", "test_fine") == ["error at setup", "passed"]
    errors.section("test_negative").fnmatch_lines(
        ["*test_bad_timeout.py::test_negative: @pytest.mark.timeout(-1): expected a number of*"]
    )
