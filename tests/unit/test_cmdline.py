"""Unit tests of the command line of a rank's own pytest session (pool/cmdline.py).

Runs in the outer pytest process, starting no process. Each test builds the controller's
``Config`` in-process with ``pytester.parseconfig``, makes a rank's command line of it
(``rank_command_line``) and parses that as the rank does, with the rank's
``workerinput.WorkerInput``, in the same folder and environment (less ``PYTEST_ADDOPTS``, which
ranks' environment leaves out); the checks are on the rank's parsed config: what a test in the
rank would read. The end-to-end runs are in ``tests/e2e/test_rank_cmdline.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_distrank import plugin
from pytest_distrank.pool.pools.cmdline import REWRITE_WARNING_FILTER, rank_command_line
from pytest_distrank.pool.protocol import RankCommandLine
from pytest_distrank.pool.workerinput import WorkerInput

PYTEST_VERSION = tuple(int(part) for part in pytest.__version__.split(".")[:2])


def _rank_config(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str
) -> tuple[pytest.Config, RankCommandLine]:
    controller = pytester.parseconfig(*args)
    (pytester.path / "dbg.log").unlink(missing_ok=True)  # the controller's --debug, if any
    basetemp = pytester.path / "rank0-tmp"
    cmdline = rank_command_line(controller, basetemp)
    files = [str(pytester.path / "test_pool.py")]
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)  # as in ranks: passed in the args
    pytester.plugins.append(WorkerInput({"workerid": "distrank-pool1-rank0"}, cmdline, files))
    try:
        rank = pytester.parseconfig(*cmdline.args)
    finally:
        pytester.plugins.pop()
    assert rank.args == files
    assert rank.option.basetemp == str(basetemp)
    assert rank.rootpath == controller.rootpath and rank.inipath == controller.inipath
    assert rank.pluginmanager.is_blocked("cacheprovider")
    assert rank.pluginmanager.get_plugin("distrank") is plugin
    assert rank.option.continue_on_collection_errors
    assert rank.option.pythonwarnings[-1] == REWRITE_WARNING_FILTER  # the last filter wins
    assert not rank.getini("log_file")
    return rank, cmdline


def test_selection_and_what_the_controller_owns_do_not_act_in_ranks(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(
        """
        def pytest_addoption(parser):
            parser.addoption("--scale", type=int, default=1)
            parser.addoption("--flavour", "-F", action="store_true")
        """
    )
    pytester.makepyfile(test_a="def test_a(): pass")
    rank, cmdline = _rank_config(
        pytester,
        monkeypatch,
        *("test_a.py::test_a", "-xvs", "-F", "-n2", "--maxfail", "3", "--dist", "load"),
        *("--junitxml", "out.xml", "--junit-xml=out2.xml", "-k", "not slow", "-m", "gpu"),
        *("--lf", "--sw", "--pdb", "--cov=pkg", "--cov", "--reruns=2", "--co", "--debug=dbg.log"),
        *("--distrank-timeout=9", "--basetemp=/elsewhere", "--rootdir=/tmp", "test_a.py"),
        *("--scale", "-3", "-p", "xdist", "-o", "addopts=-x", "-o", "console_output_style=classic"),
        *("-Wdefault::UserWarning", "--runxfail", "--tb", "short", "--setup-plan"),
        *(("--", "x.py") if PYTEST_VERSION >= (8, 2) else ()),  # older pytest refuses "--" here
    )
    option = rank.option
    # Options and values as pytest read them in the controller.
    assert (option.scale, option.flavour, option.capture, option.runxfail) == (-3, True, "no", True)
    assert (option.tbstyle, option.setupplan) == ("short", True)
    assert rank.getini("console_output_style") == "classic"
    assert "default::UserWarning" in option.pythonwarnings
    assert rank.pluginmanager.hasplugin("xdist")
    # Selection, and what the controller owns, made inert.
    assert (option.keyword, option.markexpr, option.lf, option.stepwise) == ("", "", False, False)
    assert (option.maxfail, option.xmlpath, option.junitprefix) == (0, None, None)
    assert (option.usepdb, option.trace, option.collectonly) == (False, False, False)
    assert option.debug is None and not (pytester.path / "dbg.log").exists()
    # Plugins whose work the controller does: every option at its default.
    assert (option.numprocesses, option.dist, option.tx) == (None, "no", [])
    assert (option.cov_source, option.reruns) == (None, None)
    assert option.distrank_timeout == "9"  # carried: a rank's in_child counts from the deadline
    assert rank.pluginmanager.get_plugin("_cov") is None  # pytest-cov did not start measuring
    # The controller's verbosity (-v), and the rank's own options before a "--".
    assert option.verbose == 1
    if PYTEST_VERSION >= (8, 2):
        assert cmdline.args[-2:] == ("--", "x.py")
        assert cmdline.args[-4:-2] == ("-W", REWRITE_WARNING_FILTER)


def test_pytest_split_selects_and_stores_in_the_controller_only(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranks that stored durations wrote the durations file while another pool's ranks read it
    (a JSONDecodeError at a pool's start, seen in a full-suite run)."""
    pytest.importorskip("pytest_split")
    pytester.makepyfile(test_a="def test_a(): pass")
    args = ("--store-durations", "--durations-path=d.json", "--splits=2", "--group=1")
    rank, _ = _rank_config(pytester, monkeypatch, *args)
    option = rank.option
    assert (option.store_durations, option.splits, option.group) == (False, None, None)
    manager = rank.pluginmanager
    assert manager.get_plugin("pytestsplitcacheplugin") is None
    assert manager.get_plugin("pytestsplitplugin") is None


def test_ini_and_env_addopts_reach_ranks_once(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeini("[pytest]\naddopts = -x --strict-markers -p no:randomly --junitxml=j.xml\n")
    monkeypatch.setenv("PYTEST_ADDOPTS", "--maxfail=2 -rA -p no:faulthandler")
    rank, cmdline = _rank_config(pytester, monkeypatch, "-W", "error::DeprecationWarning", "-q")
    assert rank.inipath == pytester.path / "tox.ini"
    assert rank.option.strict_markers and "A" in rank.option.reportchars
    assert rank.pluginmanager.is_blocked("randomly")
    assert rank.pluginmanager.is_blocked("faulthandler")
    assert (rank.option.maxfail, rank.option.xmlpath, rank.option.verbose) == (0, None, -1)
    # PYTEST_ADDOPTS where pytest puts it: after the ini's addopts, before the command line.
    assert cmdline.args[:3] == ("--maxfail=2", "-rA", "-p")
    filters = rank.option.pythonwarnings
    assert filters.index("error::DeprecationWarning") < filters.index(REWRITE_WARNING_FILTER)


@pytest.mark.skipif(PYTEST_VERSION < (8, 2), reason="@file arguments are pytest 8.2's")
def test_arguments_from_a_file_are_read_in_the_controllers_folder(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makefile(".txt", args="-x\n--runxfail\ntest_a.py\n")
    pytester.makepyfile(test_a="def test_a(): pass")
    rank, cmdline = _rank_config(pytester, monkeypatch, "@args.txt")
    assert cmdline.invocation_dir == str(pytester.path)
    assert rank.option.runxfail and rank.option.maxfail == 0


def test_positional_arguments_choose_initial_conftests_not_files(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The conftest of the controller's folder argument adds an option, as in the controller;
    # the rank collects the pool's files, not the folder.
    sub = pytester.mkdir("sub")
    (sub / "conftest.py").write_text(
        "def pytest_addoption(parser):\n    parser.addoption('--tag', required=True)\n"
    )
    rank, _ = _rank_config(pytester, monkeypatch, "sub", "--tag", "blue", "-k", "x")
    assert rank.option.tag == "blue" and rank.option.keyword == ""


def test_plugin_name_follows_the_controller(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, cmdline = _rank_config(pytester, monkeypatch, "-p", "distrank")
    own = cmdline.args.index("-p", 1)
    assert cmdline.args[own : own + 2] == ("-p", "distrank")


def test_a_no_of_the_plugin_before_its_p_does_not_reach_ranks(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # addopts = -p no:distrank in a project's ini, -p distrank on the command line: the rank
    # must load the plugin (_rank_config checks it), not be told to block it.
    pytester.makeini("[pytest]\naddopts = -p no:distrank -p no:randomly\n")
    rank, _ = _rank_config(pytester, monkeypatch, "-p", "distrank")
    assert rank.pluginmanager.is_blocked("randomly")


def test_the_live_rank_captures_nothing(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    controller = pytester.parseconfig()
    cmdline = rank_command_line(controller, Path("rank0"), live=True)
    assert "--capture=no" in cmdline.args
    assert cmdline.args[-2:] == ("-W", REWRITE_WARNING_FILTER)
