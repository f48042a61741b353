"""End-to-end: launcher mode, pytest inside torchrun, srun or mpirun, each pytest process one rank.

Runs in subprocesses started by this (outer) pytest process: ``python -m torch.distributed.run
... -m pytest -p distrank``, two torchrun agents as two nodes, and plain ``python -m pytest``
processes with Slurm's or Open MPI's variables set by hand. Every run has a timeout and must leave
no process behind. The unit tests of the detection logic and of the collection comparison are in
``tests/unit/test_launch_env.py`` and ``tests/unit/test_launch_report.py``.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from pytest_distrank.settings import OPTIONS

from ..helpers import TAG_ENV, wait_gone

#: Bound on one launched run (each rank imports torch: ~2-4 s per process on 2 cores).
RUN_TIMEOUT = 120
LAUNCH_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "GROUP_RANK", "GROUP_WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_ID",
    "SLURM_NNODES", "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
)  # fmt: skip

# -- end-to-end helpers ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class Run:
    """The processes of one launched run: their outputs and exit codes, in start order."""

    outputs: list[str]
    codes: list[int]

    def match(self, index: int, lines: list[str]) -> None:
        pytest.LineMatcher(self.outputs[index].splitlines()).fnmatch_lines(lines)


@pytest.fixture
def launch_env(pytester: pytest.Pytester) -> Iterator[dict[str, str]]:
    """A clean environment for launched runs, tagged so that leftover processes are found."""
    tag = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    for option in OPTIONS:
        env.pop(option.env, None)
    env.pop("PYTEST_ADDOPTS", None)
    env.update({TAG_ENV: tag, "COLUMNS": "200", "OMP_NUM_THREADS": "1"})
    yield env
    leftover = wait_gone(tag, 15)
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"processes outlived their launched run: {leftover}"


def start(cmds: list[list[str]], envs: list[Mapping[str, str]], cwd: Path) -> Run:
    """Start every command at once, wait for all (bounded), return outputs and exit codes."""
    procs, files = [], []
    for i, (cmd, env) in enumerate(zip(cmds, envs, strict=True)):
        out = open(cwd / f"launch-out{i}.txt", "w+")
        files.append(out)
        procs.append(
            # umask 022, the usual one: the plugin's folders and logs must be private anyway.
            subprocess.Popen(cmd, env=dict(env), cwd=cwd, stdout=out, stderr=out, umask=0o022)
        )
    deadline = time.monotonic() + RUN_TIMEOUT
    try:
        codes = [p.wait(max(1.0, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        codes = [p.wait() for p in procs]
    outputs = []
    for out in files:
        out.seek(0)
        outputs.append(out.read())
        out.close()
    if time.monotonic() > deadline:
        pytest.fail("launched run timed out:\n" + "\n-----\n".join(outputs))
    return Run(outputs, codes)


def pytest_args(cwd: Path, *args: str, basetemp: bool = True) -> list[str]:
    given = [f"--basetemp={cwd / 'bt'}"] if basetemp else []
    return ["-m", "pytest", "-p", "distrank", *given, "-ra", *args]


def torchrun(env: dict[str, str], cwd: Path, nproc: int, *args: str) -> Run:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1", f"--master-port={free_port()}", *pytest_args(cwd, *args),
    ]  # fmt: skip
    return start([cmd], [env], cwd)


def by_hand(
    env: dict[str, str], cwd: Path, ranks: list[dict[str, str]], *args: str, basetemp: bool = True
) -> Run:
    """One plain ``python -m pytest`` per rank, with the launcher's variables set by hand."""
    rdzv = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    cmd = [sys.executable, *pytest_args(cwd, *args, basetemp=basetemp)]
    return start([cmd] * len(ranks), [{**env, **rdzv, **r} for r in ranks], cwd)


HEADER = "import os, time, pytest, torch, torch.distributed as dist\n"


# -- end-to-end: torchrun ----------------------------------------------------------------------


def test_torchrun_two_ranks_one_report(
    pytester: pytest.Pytester, launch_env: dict[str, str]
) -> None:
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
def test_all_reduce(rank, world_size, local_rank, backend, pg, device, dist_store,
                    shared_tmp_path):
    assert (os.environ["RANK"], local_rank, backend) == (str(rank), rank, "gloo")
    assert str(device) == "cpu"
    t = torch.ones(1) * rank
    dist.all_reduce(t, group=pg)
    assert t.item() == 1
    dist_store.set(f"r{rank}", "here")
    (shared_tmp_path / f"r{rank}").write_text("x")
    dist.barrier()
    assert dist_store.get(f"r{1 - rank}") == b"here" and len(list(shared_tmp_path.iterdir())) == 2

@pytest.mark.world_size(2)
def test_fails_on_rank_1(rank):
    print(f"rank {rank} speaking")
    assert rank == 0, "rank 1 disagrees"

@pytest.mark.world_size(4)
def test_needs_four(rank):
    pass

@pytest.mark.world_size(2)
def test_skips_on_rank_1(rank):
    if rank == 1:
        pytest.skip("not here")

def test_ordinary():
    assert "RANK" in os.environ

@pytest.mark.world_size(2)
def test_destroys_the_group(rank):
    dist.destroy_process_group()

@pytest.mark.world_size(2)
def test_fresh_group_after_that(rank, pg):
    t = torch.ones(1)
    dist.all_reduce(t, group=pg)
    assert t.item() == 2
"""
    )
    run = torchrun(launch_env, pytester.path, 2, "--junitxml=junit.xml")
    assert run.codes == [1], run.outputs[0]
    run.match(
        0,
        [
            "distrank: 0.1.0, launcher torchrun (from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, "
            "MASTER_PORT; --distrank-launcher auto (default)), world size 2, backend gloo, *",
        ],
    )
    # Rank 1's one line; ranks share the launcher's stdout, so it may come before the header.
    run.match(0, ["distrank: rank 1/2 (torchrun): report on rank 0; log in *rank1.log"])
    run.match(
        0,
        [
            "distrank: 1 of 2 ranks failed; root cause: rank 1/2",
            "  rank 0/2  passed",
            "  rank 1/2  failed in call: AssertionError: rank 1 disagrees  <- root cause",
            "*AssertionError: rank 1 disagrees",
            "cd * && torchrun --nproc-per-node=2 -m pytest -p distrank *::test_fails_on_rank_1",
            "*Captured stdout call (rank 0/2)*",
            "rank 0 speaking",
            "*Captured stdout call (rank 1/2)*",
            "rank 1 speaking",
        ],
    )
    run.match(
        0,
        [
            "SKIPPED [[]1[]] *: needs world_size 4, this launched world has 2 ranks (torchrun)",
            "SKIPPED [[]1[]] *: skipped on rank 1 of 2 (rank 0 did not): not here",
            "FAILED *::test_fails_on_rank_1 - [[]rank 1/2[]] AssertionError: rank 1 disagrees",
            "*= 1 failed, 4 passed, 2 skipped in *",
        ],
    )
    # Every rank exits with rank 0's exit code, and torchrun's summary shows it for both.
    assert run.outputs[0].count("exitcode  : 1 ") == 2, run.outputs[0]
    cases = ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")
    assert [c.get("name") for c in cases] == [
        "test_all_reduce", "test_fails_on_rank_1", "test_needs_four", "test_skips_on_rank_1",
        "test_ordinary", "test_destroys_the_group", "test_fresh_group_after_that",
    ]  # fmt: skip
    log = next((pytester.path / "bt").glob("distrank-*/rank1.log")).read_text()
    assert "test_fails_on_rank_1: setup passed, call failed" in log
    assert "exit code 1 (rank 0's)" in log


def test_torchrun_four_ranks(pytester: pytest.Pytester, launch_env: dict[str, str]) -> None:
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(4)
def test_sum(rank, pg):
    t = torch.ones(1) * rank
    dist.all_reduce(t, group=pg)
    assert t.item() == 6

@pytest.mark.world_size(4)
def test_rank_3_fails(rank):
    assert rank != 3

@pytest.mark.world_size(2, 4)
def test_sizes(rank, world_size):
    assert world_size == 4
"""
    )
    run = torchrun(launch_env, pytester.path, 4)
    assert run.codes == [1]
    run.match(
        0,
        [
            "distrank: 1 of 4 ranks failed; root cause: rank 3/4",
            "  rank 0/4  passed",
            "  rank 3/4  failed in call: assert 3 != 3  <- root cause",
            "SKIPPED [[]1[]] *: needs world_size 2, this launched world has 4 ranks (torchrun)",
            "*= 1 failed, 2 passed, 1 skipped in *",
        ],
    )


def test_torchrun_hang_times_out_with_every_ranks_stack(
    pytester: pytest.Pytester, launch_env: dict[str, str]
) -> None:
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
@pytest.mark.timeout(3)
def test_hang(rank):
    if rank == 0:
        dist.barrier()
    time.sleep(600)

@pytest.mark.world_size(2)
def test_never_reached(rank):
    pass
"""
    )
    run = torchrun(launch_env, pytester.path, 2, "--junitxml=junit.xml")
    assert run.codes == [1]
    run.match(
        0,
        [
            "collectives: rank 0 waits in barrier #1 on the default group; rank 1 never entered "
            "it: it is blocked in test_hang at *.py:8",
            "  rank 0/2  timed out in call after 3 s; in barrier #1 on the default group; blocked "
            "in barrier at torch/distributed/distributed_c10d.py:*, called from test_hang at "
            "*.py:7  <- root*",
            "  rank 1/2  timed out in call after 3 s; blocked in test_hang at *.py:8",
            "rank 0/2: Timeout: still in call after 3 s (timeout from @pytest.mark.timeout(3))",
            "Stack of its main thread (most recent call first):",
            '  File "*distributed_c10d.py", line * in barrier',
        ],
    )
    run.match(
        0,
        [
            "SKIPPED [[]1[]] *: not run: *::test_hang left rank(s) 0, 1 stuck (timeout); a rank "
            "stuck in a collective cannot be interrupted, so the launched world stops here",
            "FAILED *::test_hang - [[]rank 0/2[]] Timeout: still in call after 3 s *",
            "*= 1 failed, 1 skipped in *",
        ],
    )
    assert (pytester.path / "junit.xml").exists()  # written by rank 0's watchdog


@pytest.mark.parametrize("stuck", [0, 1])
def test_torchrun_desync_ends_the_run_promptly(
    pytester: pytest.Pytester, launch_env: dict[str, str], stuck: int
) -> None:
    """One rank raises, the other waits in a barrier: the grace period ends the run. Rank 0
    stuck: its watchdog writes the report; rank 1 stuck: rank 0's main thread does."""
    pytester.makepyfile(
        HEADER
        + f"""
@pytest.mark.world_size(2)
def test_desync(rank):
    if rank != {stuck}:
        raise RuntimeError(f"rank {{rank}} gave up")
    dist.barrier()

def test_ordinary_after():
    pass
"""
    )
    started = time.monotonic()
    run = torchrun(launch_env, pytester.path, 2, "--distrank-failure-grace=1", "--junitxml=j.xml")
    assert time.monotonic() - started < 100  # far below the 300 s deadline
    assert run.codes == [1]
    gave_up = 1 - stuck
    rows = {
        stuck: f"  rank {stuck}/2  stuck in call * s after rank {gave_up} failed; in barrier #1 on "
        "the default group; blocked in barrier at *, called from test_desync at *.py:7",
        gave_up: f"  rank {gave_up}/2  failed in call: RuntimeError: rank {gave_up} gave up  <- *",
    }
    run.match(
        0,
        [
            f"distrank: 1 of 2 ranks failed, 1 killed after it; root cause: rank {gave_up}/2",
            rows[0],
            rows[1],
            f"*RuntimeError: rank {gave_up} gave up",
            f"rank {stuck}/2: stuck in call: rank {gave_up} failed first",
            "SKIPPED [[]1[]] *: not run: *::test_desync left rank(s) * stuck (rank * failed)*",
            f"FAILED *::test_desync - [[]rank {gave_up}/2[]] RuntimeError: rank {gave_up} gave up",
        ],
    )
    junit = ET.parse(pytester.path / "j.xml").getroot().find("testsuite")
    assert junit is not None
    assert (junit.get("tests"), junit.get("failures"), junit.get("skipped")) == ("2", "1", "1")


def test_torchrun_mismatched_collection_is_an_error_not_a_hang(
    pytester: pytest.Pytester, launch_env: dict[str, str]
) -> None:
    pytester.makeconftest(
        """
import os

def pytest_collection_modifyitems(items):
    if os.environ["RANK"] == "1":
        items[:] = [i for i in items if i.name != "test_b"]
"""
    )
    pytester.makepyfile(
        """
import pytest

@pytest.mark.world_size(2)
def test_a(rank):
    pass

@pytest.mark.world_size(2)
def test_b(rank):
    pass
"""
    )
    run = torchrun(launch_env, pytester.path, 2)
    assert run.codes == [1]
    run.match(
        0,
        [
            "pytest-distrank: the ranks of this launched world (2 ranks, torchrun) collected "
            "different tests, so they cannot run them in lock-step; no test was run.",
            "Rank 0 collected 2 tests; rank(s) 1 collected others:",
            "  rank 1: 1 test; not 1 of rank 0's: *::test_b",
            "*Interrupted: the ranks of the launched world did not collect the same tests*",
            "*= 1 error in *",
        ],
    )
    assert run.outputs[0].count("exitcode  : 2 ") == 2  # both ranks: pytest's INTERRUPTED


def test_two_torchrun_agents_as_two_nodes(
    pytester: pytest.Pytester, launch_env: dict[str, str]
) -> None:
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
def test_across_nodes(rank, local_rank, pg):
    assert local_rank == 0
    t = torch.ones(1)
    dist.all_reduce(t, group=pg)
    assert t.item() == 2

@pytest.mark.world_size(2)
def test_rank_1_fails(rank):
    assert rank == 0
"""
    )
    endpoint, rdzv_id = f"127.0.0.1:{free_port()}", uuid.uuid4().hex[:8]
    cmds = [
        [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
            f"--node-rank={node}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={rdzv_id}", *pytest_args(pytester.path),
        ]
        for node in (0, 1)
    ]  # fmt: skip
    run = start(cmds, [launch_env, launch_env], pytester.path)
    assert run.codes == [1, 1]
    reporting = [i for i, out in enumerate(run.outputs) if "test session starts" in out]
    assert len(reporting) == 1, run.outputs  # one report, on the node of rank 0
    run.match(
        reporting[0],
        [
            "distrank: * launcher torchrun (from *), world size 2 on 2 nodes, backend gloo, *",
            "  rank 1/2  failed in call: assert 1 == 0  <- root cause",
            "*= 1 failed, 1 passed in *",
        ],
    )
    run.match(1 - reporting[0], ["distrank: rank 1/2 (torchrun): report on rank 0; log in *"])


# -- end-to-end: what the plugin cannot trust (docs/failure-reports.md, pool mode's fixes) -----

AFTER = """

@pytest.mark.world_size(2)
def test_zz_after(rank, pg):
    t = torch.ones(1)
    dist.all_reduce(t, group=pg)
    assert t.item() == 2
"""


@pytest.mark.parametrize(
    ("body", "peer", "row"),
    [
        (
            'pytest.exit("database gone", returncode=3)',
            "dist.barrier(group=pg)",  # rank 0 waits for rank 1 in a collective: its watchdog
            "  rank 1/2  stopped serving in call: pytest.exit('database gone') was called in "
            "*::test_stop (returncode=3)  <- root cause",
        ),
        (
            "raise KeyboardInterrupt",
            "pass",  # rank 0 passes: its main thread gathers
            "  rank 1/2  stopped serving in call: KeyboardInterrupt was raised in *::test_stop*"
            "  <- root cause",
        ),
    ],
    ids=["pytest-exit", "keyboard-interrupt"],
)
def test_torchrun_session_ending_exception_on_rank_1_fails_the_test_promptly(
    pytester: pytest.Pytester, launch_env: dict[str, str], body: str, peer: str, row: str
) -> None:
    pytester.makepyfile(
        HEADER
        + f"""
@pytest.mark.world_size(2)
def test_stop(rank, pg):
    if rank == 1:
        {body}
    {peer}
"""
        + AFTER
    )
    started = time.monotonic()
    run = torchrun(launch_env, pytester.path, 2, "--distrank-failure-grace=1")
    assert time.monotonic() - started < 60, run.outputs[0]  # not the 300 s deadline
    assert run.codes == [1], run.outputs[0]
    run.match(0, [row])
    run.match(
        0,
        [
            "SKIPPED [[]1[]] *: not run: rank 1 stopped serving: * in *::test_stop*; a rank "
            "whose pytest session ended cannot run the remaining tests, so the launched world "
            "stops here",
            "FAILED *::test_stop - [[]rank 1/2[]] stopped serving in call: *",
            "*= 1 failed, 1 skipped in *",
        ],
    )


def test_torchrun_keyboard_interrupt_on_rank_0_does_not_hang_its_peers(
    pytester: pytest.Pytester, launch_env: dict[str, str]
) -> None:
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
def test_stop(rank, pg):
    if rank == 0:
        raise KeyboardInterrupt
    dist.barrier(group=pg)  # rank 1 waits for rank 0 in a collective
"""
        + AFTER
    )
    started = time.monotonic()
    run = torchrun(launch_env, pytester.path, 2, "--distrank-failure-grace=1")
    assert time.monotonic() - started < 60, run.outputs[0]
    # Rank 0 reports its own interruption as pytest does; rank 1 adopts its exit code (2,
    # pytest's INTERRUPTED; torchrun itself exits with 1 when a rank exits non-zero).
    run.match(0, ["*! KeyboardInterrupt !*", "*= no tests ran in *"])
    assert run.codes == [1], run.outputs[0]
    assert run.outputs[0].count("exitcode  : 2 ") == 2, run.outputs[0]


def test_torchrun_warnings_of_every_rank_are_in_the_summary_once(
    pytester: pytest.Pytester, launch_env: dict[str, str]
) -> None:
    pytester.makepyfile(
        HEADER
        + """
import warnings

@pytest.mark.world_size(2)
def test_warns(rank):
    warnings.warn("deprecated thing", DeprecationWarning)
    if rank == 1:
        warnings.warn("only on rank 1")

def test_ordinary_warns():
    warnings.warn("from an ordinary test")
"""
    )
    run = torchrun(launch_env, pytester.path, 2)
    assert run.codes == [0], run.outputs[0]
    run.match(
        0,
        [
            "*warnings summary*",
            "*.py:*: DeprecationWarning: [[]ranks 0, 1 of 2[]] deprecated thing",
            "*.py:*: UserWarning: [[]rank 1/2[]] only on rank 1",
            "*.py:*: UserWarning: from an ordinary test",
            "*= 2 passed, 3 warnings in *",
        ],
    )
    # Rank 0's own warning is not shown again on its own, unmerged.
    assert run.outputs[0].count("DeprecationWarning: ") == 1, run.outputs[0]


@pytest.mark.parametrize(
    ("body", "row"),
    [
        (
            # The parent waits for its child, which runs the rest of the test and ends.
            "pid = os.fork()\n        if pid:\n            os.waitpid(pid, 0)",
            "  rank 1/2  sent reports from pid *, not its own (*): a process forked by the test?*",
        ),
        (
            # The child is still in the test when the parent's test ends.
            "if os.fork() == 0:\n            time.sleep(3)",
            "  rank 1/2  forked pid * which still ran the rank's own code when the test ended*",
        ),
    ],
    ids=["child-finished-first", "child-still-running"],
)
def test_torchrun_a_forked_test_process_is_not_a_rank(
    pytester: pytest.Pytester, launch_env: dict[str, str], body: str, row: str
) -> None:
    pytester.makepyfile(
        HEADER
        + f"""
@pytest.mark.world_size(2)
def test_forks(rank):
    if rank == 1:
        {body}
"""
        + AFTER
    )
    run = torchrun(launch_env, pytester.path, 2)
    assert run.codes == [1], run.outputs[0]
    run.match(0, [row])
    run.match(0, ["FAILED *::test_forks - [[]rank 1/2[]] *", "*= 1 failed, 1 passed in *"])


def test_torchrun_unmatched_collective_fails_the_test_that_left_it(
    pytester: pytest.Pytester, launch_env: dict[str, str]
) -> None:
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
def test_culprit(rank, pg):
    if rank == 0:
        dist.all_reduce(torch.ones(1) * 100, group=pg, async_op=True)  # no peer matches it

@pytest.mark.world_size(2)
def test_innocent(rank, pg):
    t = torch.ones(1)
    dist.all_reduce(t, group=pg)
    assert t.item() == 2

@pytest.mark.world_size(2)
def test_point_to_point_is_not_a_desync(rank, pg):
    t = torch.zeros(1)
    if rank == 0:
        dist.send(torch.ones(1), 1)
    else:
        dist.recv(t, 0)
"""
    )
    run = torchrun(launch_env, pytester.path, 2)
    assert run.codes == [1], run.outputs[0]
    run.match(
        0,
        [
            "  rank 0/2  issued 1 more collective than its peers on the default group: an "
            "unmatched collective (its last: gloo:all_reduce)  <- root cause",
            "  rank 1/2  passed",
        ],
    )
    run.match(0, ["*= 1 failed, 2 passed in *"])


# -- end-to-end: Slurm and MPI, launched by hand -----------------------------------------------


def test_slurm_by_hand(pytester: pytest.Pytester, launch_env: dict[str, str]) -> None:
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
def test_mapped(rank, local_rank, world_size, pg):
    # torchrun's variables are set for code that reads them
    assert os.environ["RANK"] == os.environ["SLURM_PROCID"] == str(rank)
    assert os.environ["LOCAL_RANK"] == str(local_rank) == str(rank)
    assert os.environ["WORLD_SIZE"] == "2" == str(world_size)
    t = torch.ones(1)
    dist.all_reduce(t, group=pg)
    assert t.item() == 2
"""
    )
    ranks = [
        {"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r), "SLURM_STEP_ID": "0"}
        for r in (0, 1)
    ]
    # No --basetemp, a fresh TMPDIR: the run folder goes to pytest-of-<user>, private as pytest
    # makes it (0700 folders, 0600 logs) under umask 022 (hostile review 3, D10).
    launch_env.pop("PYTEST_DEBUG_TEMPROOT", None)
    tmp = pytester.mkdir("tmp")
    launch_env["TMPDIR"] = str(tmp)
    run = by_hand(launch_env, pytester.path, ranks, basetemp=False)
    assert run.codes == [0, 0], run.outputs
    (mine,) = tmp.glob("pytest-of-*")
    (root,) = mine.glob("distrank-*")
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (mine, root, root / "rank1.log")}
    assert modes == {mine.name: 0o700, root.name: 0o700, "rank1.log": 0o600}
    run.match(
        0,
        [
            "distrank: 0.1.0, launcher slurm (from SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, "
            "MASTER_ADDR, MASTER_PORT; --distrank-launcher auto (default)), world size 2, *",
            "*= 1 passed in *",
        ],
    )
    assert run.outputs[1].strip().startswith("distrank: rank 1/2 (slurm): report on rank 0; log in")


def test_open_mpi_by_hand(pytester: pytest.Pytester, launch_env: dict[str, str]) -> None:
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.world_size(2)
def test_rank_0_fails(rank, local_rank):
    assert os.environ["RANK"] == os.environ["OMPI_COMM_WORLD_RANK"] == str(rank)
    assert rank == 1
"""
    )
    ranks = [
        {
            "OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        }
        for r in (0, 1)
    ]  # fmt: skip
    run = by_hand(launch_env, pytester.path, ranks)
    assert run.codes == [1, 1]  # rank 1 passed, but adopts rank 0's exit code
    run.match(
        0,
        [
            "distrank: 0.1.0, launcher mpi (from OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, "
            "OMPI_COMM_WORLD_LOCAL_RANK, MASTER_ADDR, MASTER_PORT; *), world size 2, *",
            "  rank 0/2  failed in call: assert 0 == 1  <- root cause",
            "cd * && mpirun -np 2 python -m pytest -p distrank *::test_rank_0_fails",
        ],
    )


def test_slurm_without_rendezvous_is_a_usage_error(
    pytester: pytest.Pytester, launch_env: dict[str, str]
) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "7"}
    run = start(
        [[sys.executable, *pytest_args(pytester.path)]], [{**launch_env, **slurm}], pytester.path
    )
    assert run.codes == [4]
    run.match(
        0,
        [
            "ERROR: pytest-distrank: launched by Slurm (srun) (SLURM_PROCID=0, SLURM_NTASKS=2), "
            "but MASTER_ADDR and MASTER_PORT are not set.",
            '*export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        ],
    )
