"""End-to-end: misuse, bad markers, unmet requirements and bad options, each an error or skip of
exactly the test it concerns (or a usage error naming the option and where its value came from)."""

from __future__ import annotations

import pytest

from ..helpers import RunPytest


def test_rank_fixture_in_ordinary_test_is_an_error_of_that_test(
    pytester: pytest.Pytester, run_pytest: RunPytest
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
    result = run_pytest("-ra")
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


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("world_size(0)", "@pytest.mark.world_size(0): world size 0 is not a positive integer*"),
        ("world_size(-1)", "@pytest.mark.world_size(-1): world size -1 is not a positive*"),
        ("world_size('four')", "*world_size('four'): world size 'four' is not a positive*"),
        ("world_size(True)", "@pytest.mark.world_size(True): world size True is not a positive*"),
        ("world_size(2, backend='glooo')", "*unknown backend 'glooo'; expected one of gloo, *"),
        ("world_size(2, backend=3)", "*backend must be a string, got 3*"),
        ("world_size(2, init_process_group='no')", "*init_process_group must be True or False*"),
        ("world_size(2, sizes=3)", "*unknown keyword 'sizes'*"),
        ("world_size(2, 2)", "*world size given twice*"),
    ],
)
def test_bad_marker_is_an_error_of_one_test(
    pytester: pytest.Pytester, run_pytest: RunPytest, marker: str, message: str
) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.{marker}
        def test_bad():
            pass

        @pytest.mark.world_size(2)
        def test_good(rank):
            pass

        def test_plain():
            pass
        """
    )
    result = run_pytest("-ra")
    result.assert_outcomes(errors=1, passed=2)
    result.stdout.fnmatch_lines(["*ERROR at setup of test_bad*", f"*::test_bad: {message}"])


def test_requires_nccl_and_gpus_skip_before_any_rank_starts(
    pytester: pytest.Pytester, run_pytest: RunPytest
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
    result = run_pytest("-rs")
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


def test_faked_gpu_count_still_needs_nccl(
    pytester: pytest.Pytester, run_pytest: RunPytest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "1")
    pytester.makepyfile(
        """
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
    )
    result = run_pytest("-rs")
    result.assert_outcomes(skipped=1, passed=1)
    result.stdout.fnmatch_lines(["SKIPPED*requires_nccl: needs NCCL and 2 GPUs*"])


@pytest.mark.parametrize("backend", ["mpi", "ucc"])
def test_unavailable_backend_is_a_skip(
    pytester: pytest.Pytester, run_pytest: RunPytest, backend: str
) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.world_size(2, backend="{backend}")
        def test_backend():
            raise AssertionError("must not run")
        """
    )
    result = run_pytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [f"SKIPPED*backend '{backend}' is not available in this torch build (torch *)"]
    )


def test_invalid_option_on_command_line(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    result = run_pytest("--distrank-world-size=0")
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
    pytester: pytest.Pytester, run_pytest: RunPytest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTRANK_START_METHOD", "fork")
    result = run_pytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*invalid value 'fork' for --distrank-start-method*from DISTRANK_START_METHOD=fork "
            "(environment):",
            "  expected one of forkserver, spawn",
        ]
    )


def test_invalid_option_from_ini(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makeini("[pytest]\ndistrank_timeout = soon\n")
    result = run_pytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*invalid value 'soon' for --distrank-timeout*from distrank_timeout = soon (in tox.ini):"]
    )


def test_command_line_beats_environment_beats_ini(
    pytester: pytest.Pytester, run_pytest: RunPytest, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeini("[pytest]\ndistrank_world_size = 4\ndistrank_timeout = 50\n")
    monkeypatch.setenv("DISTRANK_WORLD_SIZE", "3")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.world_size()
        def test_size(world_size):
            assert world_size == EXPECTED
        """.replace("EXPECTED", "3")
    )
    result = run_pytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["distrank: *timeout 50 s (distrank_timeout = 50 (in tox.ini)), default world size 3"]
    )
    result = run_pytest("--distrank-world-size=2", "--timeout=7")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*- traceback of rank */2 -*", "the same as rank */2"])
    result.stdout.fnmatch_lines(
        [
            "distrank: *timeout 7 s (--timeout=7* (pytest-timeout, command line)), "
            "default world size 2"
        ]
    )


def test_own_fixtures_and_params_with_rank_names_are_not_misuse(
    pytester: pytest.Pytester, run_pytest: RunPytest
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
    run_pytest().assert_outcomes(passed=2)


def test_bad_timeout_marker_is_an_error_of_that_test(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        test_bad_timeout="""
        import pytest

        @pytest.mark.timeout(-1)
        @pytest.mark.world_size(2)
        def test_negative(rank):
            pass

        @pytest.mark.world_size(2)
        def test_fine(rank):
            pass
        """
    )
    result = run_pytest()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*test_bad_timeout.py::test_negative: @pytest.mark.timeout(-1): expected a number of*"]
    )
