"""The command line of a rank's own pytest session (pool/rankargs.py), end to end and unit by unit.

Runs in the outer pytest process. The end-to-end tests run pytest in a subprocess through
``run_pytest`` (``pytest -p distrank ARGS`` with the process-leak check); the unit tests build the
controller's ``Config`` in-process with ``pytester.parseconfig`` and read the rank arguments that
``rank_pytest_args`` makes of it, starting no process.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_distrank.pool.rankargs import REWRITE_WARNING_FILTER, rank_pytest_args

from .conftest import RunPytest

PYTEST_VERSION = tuple(int(part) for part in pytest.__version__.split(".")[:2])

REPO_ROOT = Path(__file__).resolve().parents[1]

WS2 = """
import pytest

@pytest.mark.world_size(2)
def test_two(rank):
    assert rank in (0, 1)
"""


def test_warnings_as_errors_on_the_command_line(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(test_werror=WS2)
    result = run_pytest("-W", "error", "-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_werror.py::test_two PASSED*"])


def test_conftest_options_reach_every_rank(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makeconftest(
        """
        def pytest_addoption(parser):
            parser.addoption("--scale", type=int, default=1)
            parser.addoption("--tag", required=True)
        """
    )
    pytester.makepyfile(
        test_scale="""
        import pytest, torch, torch.distributed as dist

        @pytest.mark.world_size(2)
        def test_scale(request, rank, pg):
            scale = request.config.getoption("scale")
            tag = request.config.getoption("tag")
            seen = torch.tensor([float(scale)])
            dist.all_reduce(seen, group=pg)
            print(f"rank {rank}: scale={scale} tag={tag} sum={seen.item()}")
            assert (scale, tag, seen.item()) == (3, "blue", 6.0), f"rank {rank}"
        """
    )
    # The space-separated spellings, the controller's positional file and -x must not confuse
    # the ranks: the option values reach them, the file list stays the pool's.
    result = run_pytest("test_scale.py", "--scale", "3", "--tag", "blue", "-x", "-rP")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*rank 0/2*", "rank 0: scale=3 tag=blue sum=6.0"])
    result.stdout.fnmatch_lines(["*rank 1/2*", "rank 1: scale=3 tag=blue sum=6.0"])


def test_runxfail_reaches_the_ranks(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(
        test_runxfail="""
        import pytest

        @pytest.mark.world_size(2)
        @pytest.mark.xfail(reason="known bug")
        def test_known_bug(rank):
            assert rank < 0, f"rank {rank} ran the xfail test as an ordinary one"
        """
    )
    result = run_pytest("--runxfail", "-ra")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["FAILED *::test_known_bug - [[]rank *] AssertionError: rank * ran the xfail test as*"]
    )


def test_boolean_verbose_from_a_conftest_does_not_break_pools(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makeconftest(
        """
        def pytest_configure(config):
            config.option.verbose = True  # as DeepSpeed's tests/conftest.py does
        """
    )
    pytester.makepyfile(test_verbose=WS2)
    result = run_pytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_verbose.py::test_two PASSED*"])


@pytest.mark.usefixtures("run_pytest")  # its process-leak check; the run itself is below
def test_plugin_loaded_by_module_path_without_install(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "Not installed": -p distrank finds the entry point even with autoload off, so a
    # sitecustomize hides this distribution from importlib.metadata in the controller, the fork
    # server and the ranks alike; the package itself comes from the checkout on PYTHONPATH.
    hide = pytester.mkdir("hide_install")
    (hide / "sitecustomize.py").write_text(
        "import importlib.metadata as md\n"
        "_distributions = md.distributions\n"
        "def distributions(**kwargs):\n"
        "    for dist in _distributions(**kwargs):\n"
        "        if dist.metadata['Name'] != 'pytest-distrank':\n"
        "            yield dist\n"
        "md.distributions = distributions\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hide), str(REPO_ROOT)]))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_by_path=WS2)
    # Not run_pytest: it would add "-p distrank".
    result = pytester.runpytest_subprocess("-p", "pytest_distrank.plugin", "-v", timeout=180)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_by_path.py::test_two PASSED*"])


# Unit tests: the argument list itself.


def _rank_args(pytester: pytest.Pytester, *args: str) -> list[str]:
    config = pytester.parseconfig(*args)
    return rank_pytest_args(config, ["/pool/test_a.py"], Path("/tmp/rank0"))


def _has(args: list[str], *part: str) -> bool:
    """Whether ``part`` occurs in ``args`` as consecutive arguments."""
    return any(args[i : i + len(part)] == list(part) for i in range(len(args)))


def test_rank_owned_and_selection_options_are_stripped(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        def pytest_addoption(parser):
            parser.addoption("--scale", type=int, default=1)
            parser.addoption("--flavour", "-F", action="store_true")
        """
    )
    pytester.makepyfile(test_a="def test_a(): pass")
    args = _rank_args(
        pytester,
        *("test_a.py::test_a", "-xvs", "-F", "-n2", "--maxfail", "3", "--dist", "load"),
        *("--junitxml", "out.xml", "--junit-xml=out2.xml", "-k", "not slow", "-m", "gpu"),
        *("--lf", "--sw", "--pdb", "--cov=pkg", "--cov", "--reruns=2", "--co"),
        *("--distrank-timeout=9", "--basetemp=/elsewhere", "--rootdir=/tmp", "test_a.py"),
        *("--scale", "-3", "-p", "xdist", "-o", "addopts=-x", "-o", "console_output_style=classic"),
        *("-Wdefault::UserWarning", "--runxfail", "--tb", "short", "--setup-plan"),
        *(("--", "x.py") if PYTEST_VERSION >= (8, 2) else ()),  # older pytest refuses "--" here
    )
    assert args[0] == "/pool/test_a.py" and args.count("/pool/test_a.py") == 1
    for gone in ("test_a.py::test_a", "test_a.py", "x.py", "-x", "-n2", "3", "load", "out.xml"):
        assert gone not in args, gone
    for gone in ("-k", "not slow", "-m", "gpu", "--lf", "--sw", "--pdb", "--co", "addopts=-x"):
        assert gone not in args, gone
    prefixes = ("--maxfail", "--junit", "--cov", "--reruns", "--distrank", "--dist", "-n", "-v")
    assert not [a for a in args if a.startswith(prefixes)]
    assert not [a for a in args if "/elsewhere" in a]
    assert [a for a in args if a.startswith("--rootdir")] == ["--rootdir=/tmp"]  # once: ours
    assert _has(args, "-s", "-F") and "--scale=-3" in args and _has(args, "-p", "xdist")
    assert _has(args, "-o", "console_output_style=classic")
    assert _has(args, "-W", "default::UserWarning", "--runxfail", "--tb=short", "--setup-plan")
    assert "--basetemp=/tmp/rank0" in args
    assert "--verbosity=1" in args
    assert args[-2:] == ["-W", REWRITE_WARNING_FILTER]


def test_ini_and_env_addopts_are_forwarded_filtered(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeini("[pytest]\naddopts = -x --strict-markers -p no:randomly --junitxml=j.xml\n")
    monkeypatch.setenv("PYTEST_ADDOPTS", "--maxfail=2 -rA")
    args = _rank_args(pytester, "-W", "error::DeprecationWarning", "-q")
    assert f"-c={pytester.path / 'tox.ini'}" in args
    assert _has(
        args, "--strict-markers", "-p", "no:randomly", "-r", "A", "-W", "error::DeprecationWarning"
    )
    assert not [a for a in args if a.startswith(("--maxfail", "--junitxml", "-x", "-q"))]
    assert "--verbosity=-1" in args
    # The plugin's filter comes after the user's -W filters, so it wins for its one warning.
    assert (
        args.index("error::DeprecationWarning")
        < args.index(REWRITE_WARNING_FILTER)
        == len(args) - 1
    )
    assert _has(args, "-o", "addopts=") and _has(args, "-o", "log_file=")


@pytest.mark.skipif(PYTEST_VERSION < (8, 2), reason="@file arguments are pytest 8.2's")
def test_arguments_from_a_file_are_read(pytester: pytest.Pytester) -> None:
    pytester.makefile(".txt", args="-x\n--runxfail\ntest_a.py\n")
    pytester.makepyfile(test_a="def test_a(): pass")
    args = _rank_args(pytester, "@args.txt")
    assert "--runxfail" in args and "-x" not in args and "test_a.py" not in args


def test_plugin_name_follows_the_controller(pytester: pytest.Pytester) -> None:
    args = _rank_args(pytester, "-p", "distrank")
    assert args[1:5] == ["-p", "distrank", "-p", "no:cacheprovider"]
    assert args.count("distrank") == 1
