"""End-to-end: reporting plugins that write a file write it once, from the controller, with the
merged reports of each distributed test; ranks write none.

Runs in the outer pytest process; the inner sessions run in subprocesses. ``report-files`` is one
shared session with pytest-reportlog, pytest-html and pytest-json-report at once, and a
``conftest.py`` that records in every process (controller and ranks) which of those plugins'
file writers it registered. The SIGKILL and SIGTERM cases run a session each and signal its
controller in the middle of a test. Each test skips when a plugin it checks is not installed.
"""

from __future__ import annotations

import html
import json
import os
import re
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from ..helpers import RUN_TIMEOUT, TAG_ENV, SharedSession, Started, start_pytest, wait_gone

pytestmark = pytest.mark.timeout(RUN_TIMEOUT + 60)

#: The report files, in a folder of their own: nothing else may appear there.
REPORT_ARGS = (
    "--report-log=reports/log.jsonl",
    "--html=reports/report.html",
    "--self-contained-html",
    "--json-report",
    "--json-report-file=reports/report.json",
)
#: The folder the probe conftest writes one file per process into.
PROBE_ENV = "REPORT_FILES_PROBE"

# In every process of the session (controller, each rank): which file writers of the three
# plugins this process registered, after every plugin's pytest_configure. A writer that is not
# registered runs no hook: it writes nothing.
PROBE = f"""
import json, os, pathlib

import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    plugins = config.pluginmanager.get_plugins()
    found = {{
        "pid": os.getpid(),
        "rank": os.environ.get("RANK"),
        "workerinput": hasattr(config, "workerinput"),
        "reportlog": hasattr(config, "_report_log_plugin"),
        "html": any(type(p).__module__.startswith("pytest_html.") for p in plugins),
        "json": type(getattr(config, "_json_report", None)).__name__,
    }}
    folder = pathlib.Path(os.environ["{PROBE_ENV}"])
    folder.mkdir(exist_ok=True)
    (folder / f"{{os.getpid()}}.json").write_text(json.dumps(found))
"""

TESTS = """
import pytest


@pytest.mark.world_size(2)
def test_metadata(rank, json_metadata):
    json_metadata["rank"] = rank
    json_metadata["same"] = "on every rank"
    if rank == 1:
        json_metadata["only_rank_1"] = True


@pytest.mark.world_size(2)
def test_fails_on_rank_1(rank, json_metadata):
    json_metadata["where"] = f"rank {rank}"
    print(f"output of rank {rank}")
    assert rank == 0


@pytest.mark.world_size(2)
@pytest.mark.parametrize("i", range(2))
def test_param(rank, i):
    pass


def test_plain():
    pass
"""

NODEIDS = [
    "test_files.py::test_metadata",
    "test_files.py::test_fails_on_rank_1",
    "test_files.py::test_param[0]",
    "test_files.py::test_param[1]",
    "test_files.py::test_plain",
]


#: The folder the shared session ran in (the pytester folder of the test that ran it).
_FOLDER: list[Path] = []


def _write(folder: Path) -> None:
    _FOLDER.append(folder)
    (folder / "conftest.py").write_text(PROBE)
    (folder / "test_files.py").write_text(TESTS)


@pytest.fixture
def report_files(shared_session: SharedSession) -> Path:
    """The folder ``report-files`` ran in (the same for every test that asks)."""
    pytest.importorskip("pytest_reportlog")
    pytest.importorskip("pytest_html")
    pytest.importorskip("pytest_jsonreport")
    result = shared_session(
        "report-files",
        _write,
        *REPORT_ARGS,
        env={PROBE_ENV: "{folder}/probe", "COLUMNS": "200"},
    )
    result.assert_outcomes(passed=4, failed=1)
    return _FOLDER[0]


def _probes(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((folder / "probe").iterdir())]


def _log(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "reports/log.jsonl").read_text().splitlines()]


def test_ranks_register_no_report_file_writer(report_files: Path) -> None:
    """In each rank, pytest-reportlog, pytest-html and pytest-json-report find
    ``config.workerinput`` before their ``pytest_configure`` and register no file writer (the
    json report registers its worker part, which only attaches data to reports); the controller
    registered each writer; the report folder holds exactly the three files."""
    probes = _probes(report_files)
    controller = [p for p in probes if p["rank"] is None]
    ranks = sorted((p for p in probes if p["rank"] is not None), key=lambda p: p["rank"])
    assert [{k: v for k, v in p.items() if k != "pid"} for p in controller] == [
        {"rank": None, "workerinput": False, "reportlog": True, "html": True, "json": "JSONReport"}
    ]
    assert [{k: v for k, v in p.items() if k != "pid"} for p in ranks] == [
        {
            "rank": str(rank),
            "workerinput": True,
            "reportlog": False,
            "html": False,
            "json": "JSONReportWorker",
        }
        for rank in (0, 1)
    ]
    names = sorted(p.name for p in (report_files / "reports").iterdir())
    assert names == ["log.jsonl", "report.html", "report.json"]


def test_report_log_has_the_merged_phases_once(report_files: Path) -> None:
    """Every line is JSON; each test has exactly its setup, call and teardown lines, once, in
    order, with the merged outcome (the failure names its rank); the session's lines frame
    them."""
    lines = _log(report_files)
    assert lines[0]["$report_type"] == "SessionStart"
    assert lines[-1] == {"exitstatus": 1, "$report_type": "SessionFinish"}
    tests = [line for line in lines if line["$report_type"] == "TestReport"]
    assert [(t["nodeid"], t["when"]) for t in tests] == [
        (nodeid, when) for nodeid in NODEIDS for when in ("setup", "call", "teardown")
    ]
    outcomes = {(t["nodeid"], t["when"]): t["outcome"] for t in tests}
    assert outcomes.pop((NODEIDS[1], "call")) == "failed"
    assert set(outcomes.values()) == {"passed"}
    failed = next(t for t in tests if t["outcome"] == "failed")
    assert failed["longrepr"]["reprcrash"]["message"].startswith("[rank 1/2] assert 1 == 0")


def test_json_report_keeps_the_ranks_metadata(report_files: Path) -> None:
    """pytest-json-report's per-test metadata, set in the ranks, is in the controller's file:
    every key any rank set, the lowest rank's value where they differ."""
    report = json.loads((report_files / "reports/report.json").read_text())
    tests = {t["nodeid"]: t for t in report["tests"]}
    assert list(tests) == NODEIDS
    assert tests[NODEIDS[0]]["metadata"] == {
        "rank": 0,
        "same": "on every rank",
        "only_rank_1": True,
    }
    assert tests[NODEIDS[1]]["metadata"] == {"where": "rank 0"}
    assert tests[NODEIDS[1]]["outcome"] == "failed"
    assert "[rank 1/2]" in tests[NODEIDS[1]]["call"]["crash"]["message"]
    assert "metadata" not in tests[NODEIDS[2]]
    assert report["summary"] == {"passed": 4, "failed": 1, "total": 5, "collected": 5}


def test_html_report_has_the_merged_outcomes(report_files: Path) -> None:
    """pytest-html's file counts each distributed test once, with the merged failure and every
    rank's output."""
    html = (report_files / "reports/report.html").read_text()
    assert "4 Passed" in html and "1 Failed" in html
    assert "root cause: rank 1/2" in html
    assert "output of rank 0" in html and "output of rank 1" in html


# -- SIGKILL of the controller -------------------------------------------------------------------

KILLED = """
import os, pathlib, time

import pytest


@pytest.mark.world_size(2)
@pytest.mark.parametrize("i", range(3))
def test_done(rank, i):
    pass


@pytest.mark.world_size(2)
def test_killed_in_here(rank):
    if rank == 0:
        pathlib.Path(os.environ["KILLED_STARTED"]).touch()
    time.sleep(120)
"""


def start_session(
    pytester: pytest.Pytester, env: Mapping[str, str], *args: str
) -> tuple[Started, str]:
    """Start ``pytest -p distrank ARGS`` in the pytester folder, tagged, with ``env`` added
    (``{folder}`` in a value: the folder), its output in ``output``."""
    tag = f"report-files-{os.getpid()}-{time.time_ns()}"
    folder = str(pytester.path)
    env = {**os.environ, TAG_ENV: tag, **{k: v.format(folder=folder) for k, v in env.items()}}
    env.pop("PYTEST_ADDOPTS", None)
    base = ["-p", "distrank", "-p", "no:cacheprovider", f"--basetemp={pytester.path / 'basetemp'}"]
    output = pytester.path / "output"
    return start_pytest([*base, *args], pytester.path, env, (output, output)), tag


def signal_when(pytester: pytest.Pytester, proc: Started, tag: str, started: Path, sig: int) -> str:
    """Send ``sig`` to the session once ``started`` exists; its output once it ended, and no
    process of it left."""
    output = pytester.path / "output"
    try:
        end = time.monotonic() + RUN_TIMEOUT
        while not started.exists():
            assert proc.poll() is None, output.read_text()
            assert time.monotonic() < end, f"{started.name} never appeared\n{output.read_text()}"
            time.sleep(0.1)
        proc.send_signal(sig)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        left = wait_gone(tag, 15)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert not left, f"alive after {signal.Signals(sig).name} of the controller: {left}"
    return output.read_text()


def test_report_log_keeps_finished_tests_after_sigkill(pytester: pytest.Pytester) -> None:
    """pytest-reportlog writes and flushes each merged report as its test ends: after SIGKILL of
    the controller in the fourth test, a plain ``--report-log`` file holds every line of the
    three finished tests, each whole, and nothing of the fourth; no process is left."""
    pytest.importorskip("pytest_reportlog")
    pytester.makepyfile(test_killed=KILLED)
    env = {"KILLED_STARTED": "{folder}/started"}
    proc, tag = start_session(pytester, env, "--report-log=log.jsonl")
    signal_when(pytester, proc, tag, pytester.path / "started", signal.SIGKILL)
    text = (pytester.path / "log.jsonl").read_text()
    assert text.endswith("\n")
    lines = [json.loads(line) for line in text.splitlines()]
    tests = [(t["nodeid"], t["when"], t["outcome"]) for t in lines if "when" in t]
    assert tests == [
        (f"test_killed.py::test_done[{i}]", when, "passed")
        for i in range(3)
        for when in ("setup", "call", "teardown")
    ]
    assert lines[-1]["$report_type"] == "TestReport"  # no SessionFinish: it was killed


# -- SIGTERM: the test in flight --------------------------------------------------------------

INTERRUPTED = """
import os, pathlib, time

import pytest


@pytest.mark.world_size(2)
def test_a_done(rank):
    pass


@pytest.mark.world_size(2)
def test_b_in_flight(rank):
    folder = pathlib.Path(os.environ["IN_FLIGHT"])
    folder.mkdir(exist_ok=True)
    if rank == 1:  # "rank1", which the signal waits for, once both ranks are in the call
        while not (folder / "rank0").exists():
            time.sleep(0.01)
    (folder / f"rank{rank}").touch()
    time.sleep(120)
"""


def _html_rows(path: Path) -> dict[str, list[str]]:
    """pytest-html's rows by node id: the result of each (its data blob, as its page reads it)."""
    blob = re.search(r'data-jsonblob="([^"]*)"', path.read_text())
    assert blob is not None, "no data blob in the html report"
    tests = json.loads(html.unescape(blob.group(1)))["tests"]
    return {nodeid: [row["result"] for row in rows] for nodeid, rows in tests.items()}


def test_the_test_in_flight_at_sigterm_has_its_row_in_every_report_file(
    pytester: pytest.Pytester,
) -> None:
    """hostile-4 D8: SIGTERM while both ranks are in a test: the session ends interrupted (exit
    code 2) and the test in flight has its row in pytest-html's file (written at its teardown
    report, which its killed ranks never sent: the controller adds one) and all three phases in
    report-log's; its report names no rank "root cause" (every rank was only interrupted, the
    issue) and says where each rank was."""
    pytest.importorskip("pytest_reportlog")
    pytest.importorskip("pytest_html")
    pytester.makepyfile(test_in_flight=INTERRUPTED)
    args = ("--report-log=log.jsonl", "--html=report.html", "--self-contained-html")
    proc, tag = start_session(pytester, {"IN_FLIGHT": "{folder}/started"}, *args)
    started = pytester.path / "started" / "rank1"
    output = signal_when(pytester, proc, tag, started, signal.SIGTERM)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output
    b = "test_in_flight.py::test_b_in_flight"
    assert _html_rows(pytester.path / "report.html") == {
        "test_in_flight.py::test_a_done": ["Passed"],
        b: ["Failed"],
    }, output
    lines = [json.loads(line) for line in (pytester.path / "log.jsonl").read_text().splitlines()]
    phases = [(t["when"], t["outcome"]) for t in lines if t.get("nodeid") == b and "when" in t]
    assert phases == [("setup", "passed"), ("call", "failed"), ("teardown", "passed")], output
    assert lines[-1] == {"exitstatus": 2, "$report_type": "SessionFinish"}
    assert "root cause:" not in output and "<- root cause" not in output, output
    pytest.LineMatcher(output.splitlines()).fnmatch_lines(
        [
            "distrank: the session was interrupted by SIGTERM while all 2 ranks were in the "
            "test: no rank failed, none is the root cause (where each was, below); shown: rank 0/2",
            "  rank 0/2  interrupted in call by SIGTERM after * s; blocked in test_b_in_flight "
            "at test_in_flight.py:*",
            "  rank 1/2  interrupted in call by SIGTERM after * s; blocked in test_b_in_flight "
            "at test_in_flight.py:*",
        ],
        consecutive=True,
    )
