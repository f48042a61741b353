"""End-to-end: distributed tests under the pytest features users already rely on.

Scenarios share inner sessions where their options allow: ``ecosystem`` (plugin values in
ranks, coverage with the default fork server, tests run in another order than collection's,
skips decided per rank), ``ecosystem-xdist`` (the same under ``-n 2``, coverage, a breakpoint
in an xdist worker) and ``rerun-fail-on-flaky`` (pytest-rerunfailures with ``--fail-on-flaky``;
``--distrank-start-method=spawn``: coverage, and the start method's own case). Other rerun
options would change the others' outcomes, so those sessions are their own; ``--co``, ``-k``
and ``-m`` selections are checked in-process (no rank starts), and ``--lf`` reruns in the folder
``ecosystem`` ran in.
"""

from __future__ import annotations

import collections
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ..helpers import RunPytest, SharedSession
from .test_debugger import BREAKPOINT_IN_RANK_1

MIXED = """
import pytest, torch, torch.distributed as dist

@pytest.mark.world_size(2, 3)
@pytest.mark.parametrize("i", range(3))
def test_sum(rank, world_size, pg, i):
    t = torch.ones(1) * i
    dist.all_reduce(t)
    assert t.item() == i * world_size

@pytest.mark.world_size(2)
def test_fails(rank):
    assert rank == 0

def test_plain():
    pass
"""


# A plugin that settles values at configure time and hands them to pytest-xdist's workers the way
# pytest-randomly hands over its seed: a node hook registered only under xdist, read back from
# config.workerinput. The seed can be given again (--settled-seed); the token never can.
SETTLED = """
import random, uuid

import pytest


def pytest_addoption(parser):
    parser.addoption("--settled-seed", type=int, default=None)


class NodeHook:
    def pytest_configure_node(self, node):
        node.workerinput["settled"] = node.config.settled


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(NodeHook())
    if hasattr(config, "workerinput"):
        config.settled = config.workerinput["settled"]
    else:
        seed = config.getoption("settled_seed")
        seed = random.getrandbits(32) if seed is None else seed
        config.settled = {"seed": seed, "token": uuid.uuid4().hex}


def pytest_report_header(config):
    return "settled: seed={seed} token={token}".format(**config.settled)
"""
SEEN = """
import json, os, pathlib

import pytest


@pytest.mark.world_size(2)
def test_ranks_see_the_settled_values(rank, request, worker_id, testrun_uid):
    seen = dict(request.config.settled, worker_id=worker_id, testrun_uid=testrun_uid)
    seen["env"] = os.environ.get("PYTEST_XDIST_WORKER")
    pathlib.Path(f"seen-rank{rank}.json").write_text(json.dumps(seen))
"""


def _seen(folder: Path) -> list[dict[str, Any]]:
    """What each rank of ``test_seen.py`` saw (its file), rank 0 first."""
    return [json.loads((folder / f"seen-rank{rank}.json").read_text()) for rank in (0, 1)]


def _settled(result: pytest.RunResult) -> dict[str, object]:
    """The controller's settled values, from its header line."""
    line = next(line for line in result.stdout.lines if line.startswith("settled: "))
    seed, token = (part.split("=", 1)[1] for part in line.split()[1:])
    return {"seed": int(seed), "token": token}


def _counts(result: pytest.RunResult, *files: str) -> dict[str, int]:
    """Passes, failures and errors of the tests in ``files``, from the short summary of ``-rA``
    (a skip's line names where ``pytest.skip`` was called, not the test)."""
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "short test summary info" in line)
    counts: collections.Counter[str] = collections.Counter()
    words = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors"}
    for line in lines[start + 1 :]:
        word, _, rest = line.partition(" ")
        if word in words and rest.split("::")[0] in files:
            counts[words[word]] += 1
    return dict(counts)


#: The mypkg package and a test of it: lines 3 and 4 run only in ranks (line 3 only on rank 1).
COVERED = {
    "mypkg/__init__.py": """
def pick(rank):
    if rank == 1:
        return "one"
    return "other"
""",
    "test_cov.py": """
import pytest
import mypkg

@pytest.mark.world_size(2)
def test_pick(rank):
    assert mypkg.pick(rank) == ("one" if rank == 1 else "other")
""",
}
COVERAGE = ("--cov=mypkg", "--cov-branch", "--cov-report=term-missing", "-p", "pytest_cov")

#: Where each shared session ran, by name.
_FOLDERS: dict[str, Path] = {}


def _writer(name: str, files: dict[str, str]) -> Any:
    """A ``write(folder)`` for ``shared_session`` that writes ``files`` and notes the folder."""

    def write(folder: Path) -> None:
        _FOLDERS[name] = folder
        for path, source in files.items():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_text(textwrap.dedent(source))

    return write


@pytest.fixture
def ecosystem(shared_session: SharedSession) -> pytest.RunResult:
    """Plugin values (``SETTLED``), a worker's order of tests and per-rank skips. No coverage
    here: test_train's peer is killed after the grace, and a pool killed after a fault loses
    the coverage its ranks gathered for earlier tests (found here; lines test_pick ran were
    reported missing)."""
    files = {
        "conftest.py": SETTLED + "\npytest_plugins = ['worker_order']\n",
        "worker_order.py": WORKER_ORDER,
        "test_mixed.py": MIXED,
        "test_seen.py": SEEN,
        "test_a.py": MODULE_CONN,
        "test_b.py": MODULE_CONN,
        "test_dependency.py": DEPENDENT,
    }
    return shared_session("ecosystem", _writer("ecosystem", files), "-rA")


#: The seed given again under xdist (``--settled-seed``), as a user reproduces a printed one.
SEED = 1234567


@pytest.fixture
def ecosystem_xdist(shared_session: SharedSession) -> pytest.RunResult:
    """``-n 2``: plugin values, coverage and a breakpoint() in a worker's rank."""
    files = {
        "conftest.py": SETTLED,
        "test_mixed.py": MIXED,
        "test_seen.py": SEEN,
        "test_breakpoint.py": BREAKPOINT_IN_RANK_1,
        **COVERED,
    }
    write = _writer("ecosystem-xdist", files)
    args = ("-n", "2", f"--settled-seed={SEED}", "-rA", *COVERAGE)
    return shared_session("ecosystem-xdist", write, *args)


def test_plugin_values_reach_ranks_as_in_xdist_workers(ecosystem: pytest.RunResult) -> None:
    """Ranks read what plugins settled in the controller (hostile-3 D9) as xdist workers do:
    config.workerinput, filled by each plugin's pytest_configure_node; xdist's worker_id and
    testrun_uid fixtures work in ranks."""
    assert _counts(ecosystem, "test_mixed.py", "test_seen.py") == {"passed": 8, "failed": 1}
    settled = _settled(ecosystem)
    ranks = _seen(_FOLDERS["ecosystem"])
    assert [{"seed": r["seed"], "token": r["token"]} for r in ranks] == [settled, settled]
    assert ranks[0]["testrun_uid"] == ranks[1]["testrun_uid"]
    for rank, seen in enumerate(ranks):
        assert re.fullmatch(rf"distrank-pool\d+-rank{rank}", seen["worker_id"]), seen
        assert seen["env"] == seen["worker_id"]


def test_xdist_same_outcomes_and_plugin_values_in_ranks(
    ecosystem: pytest.RunResult, ecosystem_xdist: pytest.RunResult
) -> None:
    """Under xdist (each worker a controller of its own pools), with a seed given again: the
    same outcomes as without; ranks see the seed given and the worker's fresh token."""
    assert _counts(ecosystem_xdist, "test_mixed.py", "test_seen.py") == {"passed": 8, "failed": 1}
    ecosystem_xdist.stdout.fnmatch_lines(["*[[]rank 1/2[]] assert 1 == 0*"])
    again = _settled(ecosystem_xdist)
    assert again["seed"] == SEED and again["token"] != _settled(ecosystem)["token"]
    ranks = _seen(_FOLDERS["ecosystem-xdist"])
    assert [{"seed": r["seed"], "token": r["token"]} for r in ranks] == [again, again]
    for rank, seen in enumerate(ranks):
        assert re.fullmatch(rf"gw[01]-pool\d+-rank{rank}", seen["worker_id"]), seen


def test_breakpoint_under_xdist_says_why(ecosystem_xdist: pytest.RunResult) -> None:
    ecosystem_xdist.stdout.fnmatch_lines_random(
        ["PASSED test_breakpoint.py::test_after", "FAILED test_breakpoint.py::test_debug_me*"]
    )
    ecosystem_xdist.stdout.fnmatch_lines(
        ["*no debugger can open: this pytest process is a pytest-xdist*"]
    )


def test_collect_only_starts_no_process(
    pytester: pytest.Pytester, run_inprocess: RunPytest
) -> None:
    """In-process (``run_inprocess``), its basetemp in the test's folder: a pool would be named
    in the summary and leave its ranks' logs there."""
    pytester.makepyfile(test_mixed=MIXED)
    result = run_inprocess("--co", "-q", f"--basetemp={pytester.path / 'basetemp'}")
    result.stdout.fnmatch_lines(["test_mixed.py::test_sum[[]ws2-0[]]", "*8 tests collected*"])
    result.stdout.no_fnmatch_line("*pools started*")
    assert not list(pytester.path.rglob("pool*-rank*.log"))


@pytest.mark.parametrize(
    "selection, selected",
    [
        pytest.param(["-k", "ws3"], [f"test_sum[ws3-{i}]" for i in range(3)], id="keyword"),
        pytest.param(
            ["-m", "world_size"],
            [f"test_sum[ws{n}-{i}]" for n in (2, 3) for i in range(3)] + ["test_fails"],
            id="marker",
        ),
        pytest.param(["-m", "not world_size"], ["test_plain"], id="not-marker"),
    ],
)
def test_keyword_and_marker_select_distributed_tests(
    pytester: pytest.Pytester, run_inprocess: RunPytest, selection: list[str], selected: list[str]
) -> None:
    """Selection happens at collection, before any rank starts: checked with ``--co`` here;
    the selected tests run as every test of ``ecosystem`` does, and ``--lf`` runs a selection."""
    pytester.makepyfile(test_mixed=MIXED)
    result = run_inprocess(*selection, "--co", "-q")
    ids = [line.split("::", 1)[1] for line in result.stdout.lines if "::" in line]
    assert sorted(ids) == sorted(selected), result.stdout.str()


def test_last_failed_reruns_just_the_distributed_test_that_failed(
    ecosystem: pytest.RunResult, run_pytest: RunPytest
) -> None:
    # the ecosystem session filled its folder's cache: --lf reruns the distributed test that
    # failed in test_mixed.py (its rootdir and cache: that folder)
    folder = _FOLDERS["ecosystem"]
    result = run_pytest("--lf", f"--rootdir={folder}", str(folder / "test_mixed.py"))
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["run-last-failure: rerun previous 1 failure*"])


@pytest.mark.parametrize(
    "session",
    [
        pytest.param("reruns", id="forkserver"),
        pytest.param("rerun_fail_on_flaky", id="spawn"),
        pytest.param("ecosystem_xdist", id="xdist"),
    ],
)
def test_coverage_counts_lines_run_only_in_ranks(
    request: pytest.FixtureRequest, session: str
) -> None:
    result: pytest.RunResult = request.getfixturevalue(session)
    result.stdout.fnmatch_lines(["PASSED test_cov.py::test_pick"])
    # Lines 3 and 4 run only in ranks (line 3 only on rank 1); without the ranks' data they would
    # be listed as missing.
    result.stdout.fnmatch_lines(["mypkg*__init__.py * 4 * 0 * 2 * 0 * 100%*"])


FLAKY = """
import pathlib, pytest, torch, torch.distributed as dist

@pytest.mark.world_size(2)
def test_flaky(rank, pg):
    marker = pathlib.Path("attempted-once")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.barrier()
    if rank == 1 and not marker.exists():
        marker.write_text("")
        raise AssertionError("rank 1 fails the first attempt")
    assert t.item() == 2

@pytest.mark.world_size(2)
def test_always_fails(rank):
    assert rank == 0, "rank 1 always fails"

@pytest.mark.flaky(reruns=1)
@pytest.mark.world_size(2)
def test_marked(rank):
    if rank == 0:
        with open("rank0-attempts", "a") as f:
            f.write("x")
    marker = pathlib.Path("marked-once")
    if rank == 1 and not marker.exists():
        marker.write_text("")
        raise AssertionError("rank 1 fails the first attempt")
"""


@pytest.fixture
def reruns(shared_session: SharedSession) -> pytest.RunResult:
    """pytest-rerunfailures with ``--reruns=2``, and coverage with the fork server."""
    write = _writer("reruns", {"test_flaky.py": FLAKY, **COVERED})
    args = ("-p", "rerunfailures", "--reruns=2", "-rfRp", "--distrank-start-method=forkserver")
    return shared_session("reruns", write, *args, *COVERAGE)


def test_reruns_rerun_a_distributed_test_on_all_ranks(reruns: pytest.RunResult) -> None:
    result = reruns
    # (test_cov.py's test is the third pass)
    assert result.parseoutcomes() == {"passed": 3, "failed": 1, "rerun": 4}
    result.stdout.fnmatch_lines(["test_flaky.py R.RRFR.*"])
    # flaky(reruns=1) reran the test on both ranks, not on rank 1 alone.
    assert (_FOLDERS["reruns"] / "rank0-attempts").read_text() == "xx"
    result.stdout.fnmatch_lines(
        ["RERUN test_flaky.py::test_flaky", "PASSED test_flaky.py::test_flaky"]
    )
    result.stdout.fnmatch_lines(
        ["FAILED test_flaky.py::test_always_fails - *[[]rank 1/2[]] AssertionError: rank 1 alw*"]
    )
    # Both attempts of test_flaky ran on the same warm pool (and every other test too).
    result.stdout.fnmatch_lines(["*pools started: 1 at world size 2"])


# pytest-rerunfailures decides for a distributed test as for an ordinary one (hostile-3 D2). Each
# distributed test has an ordinary twin that fails alike; rank 1 fails the first attempt. Attempts
# are counted in files of the folder $RERUN_STATE (per rank for distributed tests).
RERUN_HELPERS = """
import os, time, pytest

def attempt(name):
    path = os.path.join(os.environ["RERUN_STATE"], name)
    n = int(open(path).read()) + 1 if os.path.exists(path) else 1
    with open(path, "w") as f:
        f.write(str(n))
    return n

def dist_first(rank, name, error):
    if attempt(f"{name}-{rank}") == 1 and rank == 1:
        raise error

def plain_first(name, error):
    if attempt(name) == 1:
        raise error
"""


def _twins(name: str, error: str, marks: str = "") -> str:
    """A distributed test (rank 1 raises ``error`` on the first attempt) and its ordinary twin."""
    return f"""
{marks}@pytest.mark.world_size(2)
def test_dist_{name}(rank):
    dist_first(rank, "{name}", {error})

{marks}def test_plain_{name}():
    plain_first("{name}", {error})
"""


RERUN_FILTERS = (
    RERUN_HELPERS
    + _twins("valueerror", 'ValueError("not rerun: --only-rerun matches no ValueError")')
    + _twins("excepted", 'AssertionError("excepted: not rerun, --rerun-except")')
    + _twins(
        "condition_false",
        'AssertionError("condition=False: not rerun")',
        "@pytest.mark.flaky(reruns=2, condition=False)\n",
    )
    + """
@pytest.mark.world_size(2)
def test_dist_root_cause_decides(rank):
    if attempt(f"root-{rank}") == 1:
        if rank == 0:
            time.sleep(0.3)  # fails second: rank 1 is the root cause
            raise AssertionError("a rerun would be allowed for this one")
        raise ValueError("the root cause: not rerun")
"""
    + _twins("takes_a_slot", 'AssertionError("rerun: takes one of the 2 suite reruns")')
    + _twins("over_the_cap", 'AssertionError("not rerun: --max-suite-reruns 2 used up")')
)
RERUN_EXCLUDED = RERUN_HELPERS + _twins(
    "excluded", 'AssertionError("not rerun: --rerun-exclude-path")'
)
RERUN_FLAKY = (
    RERUN_HELPERS
    + """
@pytest.mark.world_size(2)
def test_dist_flaky(rank):
    dist_first(rank, "flaky", AssertionError("rerun, then passes"))

@pytest.mark.flaky(reruns=2, condition=lambda error: "rank 1's" in str(error))
@pytest.mark.world_size(2)
def test_dist_condition_reads_the_rank_error(rank):
    dist_first(rank, "reads", AssertionError("rank 1's error: rerun"))

@pytest.mark.flaky(reruns=2, reruns_delay=0.1, reruns_delay_backoff_factor=4)
@pytest.mark.world_size(2)
def test_dist_backoff(rank):
    if attempt(f"backoff-{rank}") < 3 and rank == 1:
        raise AssertionError("fails twice")
    if rank == 0:
        with open(os.path.join(os.environ["RERUN_STATE"], "backoff-starts"), "a") as f:
            f.write(f"{time.monotonic()}\\n")
"""
)


def _outcomes(result: pytest.RunResult) -> dict[str, list[str]]:
    """Each test's ``-v`` outcome words (RERUN, PASSED, FAILED), in order, by test name."""
    words: dict[str, list[str]] = {}
    for line in result.stdout.lines:
        parts = line.split()
        if len(parts) >= 2 and "::" in parts[0] and parts[1] in ("RERUN", "PASSED", "FAILED"):
            words.setdefault(parts[0].split("::")[1], []).append(parts[1])
    return words


def test_rerun_filters_paths_and_the_suite_cap_decide_as_for_ordinary_tests(
    pytester: pytest.Pytester, run_pytest: RunPytest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RERUN_STATE", str(pytester.mkdir("state")))
    pytester.makepyfile(test_filters=RERUN_FILTERS, test_excluded=RERUN_EXCLUDED)
    result = run_pytest(
        *("-p", "rerunfailures", "--reruns=2", "-v", "--only-rerun=AssertionError"),
        *("--rerun-except=excepted", "--rerun-exclude-path=test_excluded.py"),
        "--max-suite-reruns=2",
    )
    # Each distributed test and its ordinary twin: the same -v outcome words, attempt by attempt.
    not_rerun = ["excluded", "valueerror", "excepted", "condition_false", "over_the_cap"]
    expected = {f"test_{side}_{n}": ["FAILED"] for n in not_rerun for side in ("dist", "plain")}
    expected["test_dist_root_cause_decides"] = ["FAILED"]  # rank 1's ValueError decides
    expected["test_dist_takes_a_slot"] = expected["test_plain_takes_a_slot"] = ["RERUN", "PASSED"]
    assert _outcomes(result) == expected
    result.stdout.fnmatch_lines(["*[[]rank 1/2[]] ValueError: the root cause: not rerun*"])
    assert result.parseoutcomes() == {"failed": 11, "passed": 2, "rerun": 2}


#: An all_reduce in ranks that spawn started (test_spawn_start_method).
SPAWN = """
import pytest, torch, torch.distributed as dist

@pytest.mark.world_size(2)
def test_sum(rank):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2
"""


@pytest.fixture
def rerun_fail_on_flaky(shared_session: SharedSession) -> pytest.RunResult:
    """pytest-rerunfailures with ``--fail-on-flaky`` (no test may fail outright here: the exit
    status would be 1, not 7), and coverage and an all_reduce with rank processes started by
    spawn."""

    def write(folder: Path) -> None:
        files = {"test_flaky.py": RERUN_FLAKY, "test_spawn.py": SPAWN, **COVERED}
        _writer("rerun-fail-on-flaky", files)(folder)
        (folder / "state").mkdir()

    args = ("-p", "rerunfailures", "--reruns=2", "--fail-on-flaky", "-v", "-rA")
    return shared_session(
        "rerun-fail-on-flaky",
        write,
        *args,
        "--distrank-start-method=spawn",
        *COVERAGE,
        env={"RERUN_STATE": "{folder}/state"},
    )


def test_spawn_start_method(rerun_fail_on_flaky: pytest.RunResult) -> None:
    """Moved from tests/e2e/test_basics.py (a session of its own there): the spawn session's
    ``test_spawn.py``; every distributed test of the session ran on its one pool."""
    rerun_fail_on_flaky.stdout.fnmatch_lines(
        [
            "distrank: *start method spawn*",
            "test_spawn.py::test_sum PASSED*",
            "5 distributed tests; pools started: 1 at world size 2",
        ]
    )


def test_rerun_fail_on_flaky_conditions_and_backoff_decide_as_for_ordinary_tests(
    rerun_fail_on_flaky: pytest.RunResult,
) -> None:
    result = rerun_fail_on_flaky
    state = _FOLDERS["rerun-fail-on-flaky"] / "state"
    outcomes = _outcomes(result)
    assert outcomes["test_dist_flaky"] == ["RERUN", "PASSED"]
    # The condition got the exception rank 1 raised (evaluated in the rank).
    assert outcomes["test_dist_condition_reads_the_rank_error"] == ["RERUN", "PASSED"]
    assert outcomes["test_dist_backoff"] == ["RERUN", "RERUN", "PASSED"]
    # --fail-on-flaky: a test that passed only on a rerun fails the run, as an ordinary one does.
    assert result.ret == 7
    starts = [float(t) for t in (state / "backoff-starts").read_text().split()]
    first, second = starts[1] - starts[0], starts[2] - starts[1]
    rerunfailures = pytest.importorskip("pytest_rerunfailures")
    if hasattr(rerunfailures, "get_reruns_delay_backoff_factor"):
        assert first >= 0.1 and second >= 0.4 and second - first >= 0.2, (first, second)


# Tests run in an order other than collection, as a pytest-xdist worker runs them under --dist load
# (hostile-3 D4: gw1 ran test_a[3, 4, 5, 9, 10], then test_b[1]); a rank is told the test that
# follows in its pool's collection order. Ranks also track outcomes each for itself, as
# pytest-dependency does (D11).
#: (a plugin module of the session: its conftest holds SETTLED)
WORKER_ORDER = """
import os

import pytest

ORDER = ["a0", "a1", "b0", "a2", "a3", "b1"]
FAILED = set()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    if "DISTRANK_RANK" in os.environ:
        return None  # a rank serves the controller's tests
    by_name = {f"{item.path.stem[-1]}{item.callspec.params['i']}": item
               for item in session.items if item.name.startswith("test_k")}
    items = [by_name[name] for name in ORDER if name in by_name]
    items += [item for item in session.items if item not in items]
    for i, item in enumerate(items):
        nextitem = items[i + 1] if i + 1 < len(items) else None
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
    return True


def pytest_configure(config):
    config.addinivalue_line("markers", "after(name): skip if the test name failed here")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        FAILED.add(item.name)
    return report


def pytest_runtest_setup(item):
    for mark in item.iter_markers("after"):
        if mark.args[0] in FAILED:
            pytest.skip(f"{mark.args[0]} failed")
"""
MODULE_CONN = """
import pytest


@pytest.fixture(scope="module")
def conn(rank):
    yield "conn"
    if __name__ == "test_a":
        raise RuntimeError("closing module a's connection failed")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("i", range(2 if __name__ == "test_b" else 4))
def test_k(rank, conn, i):
    pass
"""
DEPENDENT = """
import pytest, torch, torch.distributed as dist


@pytest.mark.world_size(2)
def test_load(rank):
    assert rank == 0, "the checkpoint shard of rank 1 is corrupt"


@pytest.mark.after("test_load")
@pytest.mark.world_size(2)
def test_fails_alone(rank):
    assert False, "rank 0 fails on its own"


@pytest.mark.after("test_load")
@pytest.mark.world_size(2)
def test_train(rank, pg):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2
"""


def test_teardown_errors_of_earlier_tests_and_skips_decided_per_rank(
    ecosystem: pytest.RunResult,
) -> None:
    """D4: module a is left for a module-b test and come back to, twice: two teardown errors, as
    plain pytest reports for this order, none only in a rank's log. D11: rank 1 skips test_train
    in setup (test_load failed there) while rank 0 waits for it in all_reduce: skipped, with the
    skip's reason; a rank that fails on its own after such a skip still fails the test."""
    result = ecosystem
    files = ("test_a.py", "test_b.py", "test_dependency.py")
    assert _counts(result, *files) == {"passed": 6, "errors": 2, "failed": 2}
    skips = [line for line in result.stdout.lines if line.startswith("SKIPPED [")]
    assert len(skips) == 1 and skips[0].endswith(": test_load failed"), skips
    errors = [
        line for line in result.stdout.lines if line.startswith(("ERROR test_a", "ERROR test_b"))
    ]
    assert len(errors) == 2, errors
    assert result.stdout.str().count("E           RuntimeError: closing module a's connection") >= 2
    result.stdout.fnmatch_lines_random(
        [
            "FAILED test_dependency.py::test_load - [[]rank 1/2[]] AssertionError: the checkpoint*",
            "FAILED test_dependency.py::test_fails_alone - [[]rank 0/2[]] AssertionError: rank 0 *",
            "SKIPPED [[]1[]] *: skipped on rank 1 of 2 (rank 0 did not, and was stopped while "
            "waiting for it): test_load failed",
        ]
    )
    result.stdout.no_fnmatch_line("*no rank failed on its own*")
