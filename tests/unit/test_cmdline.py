"""Unit tests of the command line of a rank's own pytest session (pool/cmdline.py).

They build the controller's ``Config`` in-process with ``pytester.parseconfig`` and read the rank
arguments that ``rank_pytest_args`` makes of it, starting no process. The end-to-end runs are in
``tests/e2e/test_rank_cmdline.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_distrank.pool.cmdline import REWRITE_WARNING_FILTER, rank_pytest_args

PYTEST_VERSION = tuple(int(part) for part in pytest.__version__.split(".")[:2])


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


def test_a_no_of_the_plugin_before_its_p_does_not_reach_ranks(pytester: pytest.Pytester) -> None:
    # addopts = -p no:distrank in a project's ini, -p distrank on the command line: the rank
    # must load the plugin, not be told to block it.
    pytester.makeini("[pytest]\naddopts = -p no:distrank -p no:randomly\n")
    args = _rank_args(pytester, "-p", "distrank")
    assert "no:distrank" not in args and args.count("distrank") == 1
    assert _has(args, "-p", "no:randomly")
