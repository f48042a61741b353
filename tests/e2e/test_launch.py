"""End-to-end: launcher mode, pytest inside torchrun, srun or mpirun, each pytest process one rank.

Runs in subprocesses started by this (outer) pytest process: ``python -m torch.distributed.run
... -m pytest -p distrank``, two torchrun agents as two nodes, and plain ``python -m pytest``
processes with torchrun's, Slurm's or Open MPI's variables set by hand. Every run has a timeout
and must leave no process behind.

A launched world costs a process per rank, each importing torch and pytest, so the scenarios
share worlds (``WORLDS``): one world per launcher set-up, each with several test files, and the
tests here check each its own behaviour in the shared output, junit report and rank logs. A
scenario that ends its world (a hang, a desync, a session that ends on a rank, a collection
mismatch) is the last file of its world: the launched world stops there, and the test after it
in its file shows how. The decisions and the texts have unit tests without a world:
``tests/unit/test_launch_env.py`` (detection), ``test_launch_plan.py`` (what runs where),
``test_launch_gather.py`` (rank 0 gathering with a fake channel) and ``test_launch_report.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import stat
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from pytest_distrank.envvars import REQUIRE_SECRET_ENV, SECRET_ENV, TEST_WAITS_ENV
from pytest_distrank.options import OPTIONS

from ..helpers import TAG_ENV, RunPytest, run_at_once, wait_gone
from .test_deadlocks import LEGAL_SIZES

#: Bound on one launched world (each rank imports torch: ~2-4 s per process on 2 cores).
RUN_TIMEOUT = 180
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
    """The processes of one launched world: their outputs and exit codes, in start order, the
    folder it ran in and how long it took."""

    outputs: list[str]
    codes: list[int]
    folder: Path
    seconds: float

    def match(self, index: int, lines: list[str]) -> None:
        pytest.LineMatcher(self.outputs[index].splitlines()).fnmatch_lines(lines)

    def outcomes(self, module: str, junit: str) -> dict[str, str]:
        """The outcome of each test of ``module`` (no ``.py``) in the junit report, in order."""
        cases = ET.parse(self.folder / junit).getroot().iter("testcase")
        found = {}
        for case in cases:
            if case.get("classname") == module:
                tags = {child.tag for child in case}
                outcome = next((t for t in ("failure", "error", "skipped") if t in tags), "passed")
                found[str(case.get("name"))] = outcome
        return found


@pytest.fixture
def launch_env(pytester: pytest.Pytester) -> Iterator[dict[str, str]]:
    """A clean environment for launched runs, tagged so that leftover processes are found; the
    end-of-test rule's fixed waits take 1 s (``DISTRANK_TEST_WAITS``, as ``run_pytest`` sets)."""
    tag = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    for name in [o.env for o in OPTIONS] + [SECRET_ENV, REQUIRE_SECRET_ENV, "PYTEST_ADDOPTS"]:
        env.pop(name, None)
    env.update({TAG_ENV: tag, "COLUMNS": "200", "OMP_NUM_THREADS": "1", TEST_WAITS_ENV: "1"})
    yield env
    leftover = wait_gone(tag, 15)
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"processes outlived their launched run: {leftover}"


def start(cmds: list[list[str]], envs: list[Mapping[str, str]], cwd: Path) -> Run:
    """Start every command at once, wait for all (bounded), return outputs and exit codes
    (``helpers.run_at_once``: torchrun agents and by-hand ranks forked from the suite's zygote,
    which saves their ``import torch``; torchrun's ranks are exec'd by it, fresh)."""
    outputs = [cwd / f"launch-out{i}.txt" for i in range(len(cmds))]
    started = time.monotonic()
    # umask 022, the usual one: the plugin's folders and logs must be private anyway.
    codes = run_at_once(cmds, envs, cwd, outputs, RUN_TIMEOUT, umask=0o022)
    texts = [out.read_text(errors="replace") for out in outputs]
    if codes is None:
        pytest.fail("launched run timed out:\n" + "\n-----\n".join(texts))
    return Run(texts, codes, cwd, time.monotonic() - started)


def pytest_args(cwd: Path, *args: str, basetemp: bool = True) -> list[str]:
    given = [f"--basetemp={cwd / 'bt'}"] if basetemp else []
    return ["-m", "pytest", "-p", "distrank", *given, "-ra", *args]


def torchrun(env: dict[str, str], cwd: Path, nproc: int, *args: str) -> Run:
    """One torchrun agent of ``nproc`` ranks."""
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


def write(folder: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        (folder / name).write_text(text)


HEADER = "import os, time, pytest, torch, torch.distributed as dist\n"

# -- the scenarios: test files, each as it ran in a world of its own before -------------------

#: Ends a file whose test may break the world's process group: the next test gets a fresh one.
AFTER = """

@pytest.mark.world_size(2)
def test_zz_after(rank, pg):
    t = torch.ones(1)
    dist.all_reduce(t, group=pg)
    assert t.item() == 2
"""

REPORT = (
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

FORKS = {
    # The parent waits for its child, which runs the rest of the test and ends.
    "child-finished-first": "pid = os.fork()\n        if pid:\n            os.waitpid(pid, 0)",
    # The child is still in the test when the parent's test ends.
    "child-still-running": "if os.fork() == 0:\n            time.sleep(3)",
}
FORK_FILES = {"child-finished-first": "test_b_fork_done", "child-still-running": "test_c_forking"}


def forks(body: str) -> str:
    return (
        HEADER
        + f"""
@pytest.mark.world_size(2)
def test_forks(rank):
    if rank == 1:
        {body}
"""
        + AFTER
    )


UNMATCHED = (
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

HANG = (
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

#: Issue 28: what must never end early (a rank that joins late, a legal uneven all_to_all_single,
#: object collectives and point-to-point ops of different sizes), each with a rank standing still
#: beyond the quiet time (1 s here); and issue 31's assertions across ranks in launcher mode.
LEGAL = (
    HEADER
    + """import pytest_distrank
from pytest_distrank import assert_equal_across_ranks

@pytest.mark.world_size(3)
def test_late_joiner_passes(rank, pg):
    if rank == 2:
        time.sleep(1.5)
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 3

@pytest.mark.world_size(3)
def test_equal_across_ranks(rank, pg):
    assert_equal_across_ranks(torch.arange(4.0))

@pytest.mark.world_size(3)
def test_rank_one_differs(rank, pg):
    t = torch.arange(4.0)
    if rank == 1:
        t[2] = 7.0
    assert_equal_across_ranks(t, name="weights")

@pytest.mark.mesh({"dp": 3}, {"dp": 2})
def test_mesh_that_fits(mesh, rank):
    assert mesh.mesh_dim_names == ("dp",) and mesh.get_local_rank("dp") == rank

@pytest_distrank.fixture(world_size=2)
def two_rank_files(rank, fixture_path):
    (fixture_path / f"{rank}.txt").write_text("x")

@pytest.mark.world_size(3)
def test_cross_size_fixture(two_rank_files):
    assert False, "skipped in launcher mode"

"""
    + LEGAL_SIZES
)

#: Rank 2 leaves the test before the second all_reduce; ranks 0 and 1 wait in it. Issue 28: the
#: ranks' records prove it, and the test ends within seconds of its 60 s deadline (rank 0's
#: watchdog reports rank 0; rank 1 sends its stack; rank 2 its flight records).
LEAVES = (
    HEADER
    + """
@pytest.mark.world_size(3)
@pytest.mark.timeout(60)
def test_rank_two_leaves(rank, pg):
    t = torch.ones(2)
    dist.all_reduce(t, group=pg)
    if rank != 2:
        dist.all_reduce(t, group=pg)
"""
)

#: Rank 0 finishes the test without entering the all_reduce on the pair group that rank 1 waits
#: in. Issue 28: rank 0, in its main thread now (gathering), ends the test early.
GROUP_LEFT = (
    HEADER
    + """
@pytest.fixture(scope="module")
def pair():
    return dist.new_group([0, 1])  # outlives the test: rank 0 leaves it open

@pytest.mark.world_size(2)
@pytest.mark.timeout(60)
def test_group_left(rank, pg, pair):
    if rank == 1:
        dist.all_reduce(torch.ones(2), group=pair)
"""
)

FOUR = (
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
    assert world_size in (2, 4)  # both run: ws2 on a sub-world (test_subworlds.py)
"""
)

#: Rank 0 interrupted while its peers wait for it in a collective (a world of 4 here).
INTERRUPT_RANK_0 = (
    HEADER
    + """
@pytest.mark.world_size(4)
def test_stop(rank, pg):
    if rank == 0:
        raise KeyboardInterrupt
    dist.barrier(group=pg)  # ranks 1-3 wait for rank 0 in a collective

@pytest.mark.world_size(4)
def test_zz_after(rank, pg):
    pass
"""
)

NODES = (
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


def desync(stuck: int) -> str:
    """One rank raises, the other waits in a barrier: the grace period ends the world."""
    return (
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


MAPPED = (
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

WARNS = (
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

RANK_0_FAILS = (
    HEADER
    + """
@pytest.mark.world_size(2)
def test_rank_0_fails(rank, local_rank):
    assert os.environ["RANK"] == os.environ["OMPI_COMM_WORLD_RANK"] == str(rank)
    assert rank == 1
"""
)

#: How rank 1's pytest session ends in test_stop, what rank 0 does meanwhile, and its row.
STOPS = {
    "pytest-exit": (
        'pytest.exit("database gone", returncode=3)',
        "dist.barrier(group=pg)",  # rank 0 waits for rank 1 in a collective: its watchdog
        "  rank 1/2  stopped serving in call: pytest.exit('database gone') was called in "
        "*::test_stop (returncode=3)  <- root cause",
    ),
    "keyboard-interrupt": (
        "raise KeyboardInterrupt",
        "pass",  # rank 0 passes: its main thread gathers
        "  rank 1/2  stopped serving in call: KeyboardInterrupt was raised in *::test_stop*"
        "  <- root cause",
    ),
}


def stop_on_rank_1(body: str, peer: str) -> str:
    return (
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


MISMATCH_CONFTEST = """
import os

def pytest_collection_modifyitems(items):
    if os.environ["RANK"] == "1":
        items[:] = [i for i in items if i.name != "test_b"]
"""

MISMATCH = """
import pytest

@pytest.mark.world_size(2)
def test_a(rank):
    pass

@pytest.mark.world_size(2)
def test_b(rank):
    pass
"""

# -- the worlds --------------------------------------------------------------------------------


FORGED_TEST = """
import time
import pytest

@pytest.mark.world_size(2)
def test_rank_one_fails(rank):
    time.sleep(6)
    if rank == 1:
        time.sleep(2)
        assert False, "rank 1 computed the wrong answer"
"""

#: hostile-4 D3's forge: another local user, with a stdlib client of torchrun's store, writes
#: rank 1's "passed" reports as soon as the plan appears (its pids are there; the plan's MAC is
#: no secret, only what it proves). Says "forged" once written.
FORGE = r"""
import json, socket, struct, sys, time
VALIDATE, SET, GET, ADD, CHECK = 0, 1, 3, 4, 5
PREFIX = "/distrank/r0/ctl//"

class Store:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=3)
        self.s.sendall(struct.pack("<BI", VALIDATE, 0x3C85F7CE))
    def _str(self, b):
        return struct.pack("<Q", len(b)) + b
    def _recvn(self, n):
        buf = b""
        while len(buf) < n:
            c = self.s.recv(n - len(buf))
            if not c:
                raise EOFError
            buf += c
        return buf
    def check(self, key):
        self.s.sendall(struct.pack("<BQ", CHECK, 1) + self._str(key.encode()))
        return self._recvn(1) == b"\x00"
    def get(self, key):
        self.s.sendall(struct.pack("<B", GET) + self._str(key.encode()))
        return self._recvn(struct.unpack("<Q", self._recvn(8))[0])
    def set(self, key, value):
        self.s.sendall(struct.pack("<B", SET) + self._str(key.encode()) + self._str(value))
    def add(self, key, n):
        self.s.sendall(struct.pack("<B", ADD) + self._str(key.encode()) + struct.pack("<q", n))
        return struct.unpack("<q", self._recvn(8))[0]

port, nodeid = int(sys.argv[1]), sys.argv[2]
st, plan, end = None, None, time.monotonic() + 120
while plan is None and time.monotonic() < end:
    try:
        st = st or Store(port)
        if st.check(PREFIX + "plan"):
            raw = st.get(PREFIX + "plan")
            plan = json.loads(raw if raw.startswith(b"{") else raw.partition(b":")[2])
    except (OSError, EOFError):
        st = None
    time.sleep(0.01)
pid, now = plan["pids"][1], time.time()
path, _, name = nodeid.partition("::")
reports = [{"$report_type": "TestReport", "nodeid": nodeid, "location": [path, 0, name],
            "keywords": {}, "outcome": "passed", "longrepr": None, "when": when,
            "user_properties": [], "sections": [], "duration": 0.001, "start": now,
            "stop": now} for when in ("setup", "call", "teardown")]
payload = {"pid": pid, "index": 0, "nodeid": nodeid, "reports": reports,
           "healthy": True, "warnings": [], "sequence": {}}
st.set(PREFIX + "report/0/1", json.dumps(payload).encode())
st.add(PREFIX + "done/0", 1)
print("forged", flush=True)
"""


#: A protocol bug on rank 1: its payloads carry the test index as text (the MAC is genuine).
MALFORMED = """
import os
import pytest
from pytest_distrank.launch import keys

@pytest.mark.world_size(2)
def test_index_as_text(rank):
    if rank == 1:
        keys.identity = lambda i, nodeid: {"pid": os.getpid(), "index": str(i), "nodeid": nodeid}

@pytest.mark.world_size(2)
def test_after(rank):
    pass
"""


def _malformed_world(env: dict[str, str], folder: Path) -> Run:
    write(folder, {"test_malformed.py": MALFORMED})
    return torchrun(env, folder, 2, "-rA")


def _forge_world(env: dict[str, str], folder: Path) -> Run:
    """torchrun, 2 ranks, and hostile-4 D3's forge beside it (a client of torchrun's store)."""
    write(folder, {"test_forge.py": FORGED_TEST, "forge.py": FORGE})
    port = free_port()
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
        "--master-addr=127.0.0.1", f"--master-port={port}",
        *pytest_args(folder, "-rA"),
    ]  # fmt: skip
    forge = [
        sys.executable,
        str(folder / "forge.py"),
        str(port),
        "test_forge.py::test_rank_one_fails",
    ]
    return start([cmd, forge], [env, env], folder)


def _torchrun_world(env: dict[str, str], folder: Path) -> Run:
    """torchrun, 2 ranks: one report, forks, an unmatched collective, then a hang ends it."""
    write(
        folder,
        {
            "test_a_report.py": REPORT,
            **{f"{FORK_FILES[k]}.py": forks(body) for k, body in FORKS.items()},
            "test_d_unmatched.py": UNMATCHED,
            "test_z_hang.py": HANG,
        },
    )
    return torchrun(env, folder, 2, "--junitxml=junit.xml")


def _four_world(env: dict[str, str], folder: Path) -> Run:
    """torchrun, 4 ranks; then rank 0 is interrupted while the others wait for it."""
    write(folder, {"test_a_four.py": FOUR, "test_z_interrupt.py": INTERRUPT_RANK_0})
    return torchrun(env, folder, 4, "--distrank-failure-grace=1")


def _two_nodes_world(env: dict[str, str], folder: Path) -> Run:
    """Two torchrun agents as two nodes; then rank 1 fails while rank 0 waits (desync[0])."""
    write(folder, {"test_a_nodes.py": NODES, "test_z_desync.py": desync(0)})
    endpoint, rdzv_id = f"127.0.0.1:{free_port()}", uuid.uuid4().hex[:8]
    cmds = [
        [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
            f"--node-rank={node}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={rdzv_id}",
            *pytest_args(folder, "--distrank-failure-grace=1", "--junitxml=j.xml"),
        ]
        for node in (0, 1)
    ]  # fmt: skip
    return start(cmds, [env, env], folder)


def _leaves_world(env: dict[str, str], folder: Path) -> Run:
    """torchrun, 3 ranks: what must not end early, then rank 2 leaves a collective its peers
    wait in, which ends the run early."""
    write(folder, {"test_a_legal.py": LEGAL, "test_z_leaves.py": LEAVES})
    return torchrun(env, folder, 3, "--junitxml=junit.xml")


def _group_left_world(env: dict[str, str], folder: Path) -> Run:
    """torchrun, 2 ranks: rank 0 leaves a group's collective that rank 1 waits in."""
    write(folder, {"test_z_group_left.py": GROUP_LEFT})
    return torchrun(env, folder, 2, "--junitxml=junit.xml")


#: Rank 1 never calls the check across ranks that rank 0 waits in (hostile-4 D14): rank 0 is the
#: one stuck, every peer finished.
RANK0_WAITS = (
    HEADER
    + """
from pytest_distrank import assert_equal_across_ranks

@pytest.mark.world_size(2)
@pytest.mark.timeout(60)
def test_rank_one_skips_the_check(rank):
    if rank == 0:
        assert_equal_across_ranks(torch.ones(2), name="w")
"""
)


def _rank0_waits_world(env: dict[str, str], folder: Path) -> Run:
    """torchrun, 2 ranks: rank 0 waits in a check that rank 1 never calls."""
    write(folder, {"test_rank0_waits.py": RANK0_WAITS})
    return torchrun(env, folder, 2, "--junitxml=junit.xml")


def _slurm_world(env: dict[str, str], folder: Path) -> Run:
    """Slurm's variables by hand, every test passes: the mapped variables, warnings; no
    --basetemp and a fresh TMPDIR, so the run folder goes to pytest-of-<user>; DISTRANK_SECRET
    set."""
    write(folder, {"test_a_mapped.py": MAPPED, "test_b_warnings.py": WARNS})
    ranks = [
        {"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r), "SLURM_STEP_ID": "0"}
        for r in (0, 1)
    ]
    env = {k: v for k, v in env.items() if k != "PYTEST_DEBUG_TEMPROOT"}
    tmp = folder / "tmp"
    tmp.mkdir()
    env["TMPDIR"] = str(tmp)
    env[SECRET_ENV] = "a secret of the two tasks"  # no node count: they may be on two nodes
    return by_hand(
        env, folder, ranks, "--junitxml=junit.xml", "--report-log=log.jsonl", basetemp=False
    )


def _mpi_world(env: dict[str, str], folder: Path) -> Run:
    """Open MPI's variables by hand: rank 0 fails; then rank 0 fails while rank 1 waits for it
    (desync[1])."""
    write(folder, {"test_a_rank0.py": RANK_0_FAILS, "test_z_desync.py": desync(1)})
    ranks = [
        {
            "OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        }
        for r in (0, 1)
    ]  # fmt: skip
    return by_hand(env, folder, ranks, "--distrank-failure-grace=1", "--junitxml=j.xml")


def _stop_world(kind: str) -> Callable[[dict[str, str], Path], Run]:
    def launch(env: dict[str, str], folder: Path) -> Run:
        body, peer, _ = STOPS[kind]
        write(folder, {"test_stop.py": stop_on_rank_1(body, peer)})
        return torchrun(env, folder, 2, "--distrank-failure-grace=1")

    return launch


def _mismatch_world(env: dict[str, str], folder: Path) -> Run:
    """torchrun's variables by hand (no agent: both exit codes are seen): rank 1's conftest
    drops a test."""
    write(folder, {"conftest.py": MISMATCH_CONFTEST, "test_mismatch.py": MISMATCH})
    ranks = [
        {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2"}
        for r in (0, 1)
    ]
    return by_hand(env, folder, ranks)


WORLDS: dict[str, Callable[[dict[str, str], Path], Run]] = {
    "torchrun": _torchrun_world,
    "four": _four_world,
    "leaves": _leaves_world,
    "group-left": _group_left_world,
    "rank0-waits": _rank0_waits_world,
    "two-nodes": _two_nodes_world,
    "slurm": _slurm_world,
    "mpi": _mpi_world,
    "pytest-exit": _stop_world("pytest-exit"),
    "keyboard-interrupt": _stop_world("keyboard-interrupt"),
    "mismatch": _mismatch_world,
    "forge": _forge_world,
    "malformed": _malformed_world,
}
#: Worlds already launched in this outer session, by name (or why one did not finish).
_LAUNCHED: dict[str, Run | str] = {}


@pytest.fixture
def world(pytester: pytest.Pytester, launch_env: dict[str, str]) -> Callable[[str], Run]:
    """``world(name)``: the launched world of that name, run by the first test that asks (its
    leak check then covers it); later tests get the same run."""

    def get(name: str) -> Run:
        if name not in _LAUNCHED:
            try:
                _LAUNCHED[name] = WORLDS[name](launch_env, pytester.path)
            except (Exception, pytest.fail.Exception) as exc:
                _LAUNCHED[name] = f"{type(exc).__name__}: {exc}"
        run = _LAUNCHED[name]
        if isinstance(run, str):
            pytest.fail(f"the launched world {name!r} did not finish: {run}")
        return run

    return get


# -- torchrun, 2 ranks ---------------------------------------------------------------------------


def test_torchrun_two_ranks_one_report(world: Callable[[str], Run]) -> None:
    run = world("torchrun")
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
            "SKIPPED [[]1[]] test_a_report.py:*: needs world_size 4, this launched world has 2 "
            "ranks (torchrun)",
            "SKIPPED [[]1[]] test_a_report.py:*: skipped on rank 1 of 2 (rank 0 did not): not here",
            "FAILED test_a_report.py::test_fails_on_rank_1 - [[]rank 1/2[]] AssertionError: rank "
            "1 disagrees",
        ],
    )
    # Every rank exits with rank 0's exit code, and torchrun's summary shows it for both.
    assert run.outputs[0].count("exitcode  : 1 ") == 2, run.outputs[0]
    # One junit report, rank 0's, with every test of the file in order (1 failed, 4 passed,
    # 2 skipped), and the world's summary line counts every file of it.
    assert run.outcomes("test_a_report", "junit.xml") == {
        "test_all_reduce": "passed", "test_fails_on_rank_1": "failure",
        "test_needs_four": "skipped", "test_skips_on_rank_1": "skipped",
        "test_ordinary": "passed", "test_destroys_the_group": "passed",
        "test_fresh_group_after_that": "passed",
    }  # fmt: skip
    assert list(run.outcomes("test_a_report", "junit.xml")) == [
        "test_all_reduce", "test_fails_on_rank_1", "test_needs_four", "test_skips_on_rank_1",
        "test_ordinary", "test_destroys_the_group", "test_fresh_group_after_that",
    ]  # fmt: skip
    run.match(0, ["*= 5 failed, 8 passed, 3 skipped in *"])
    log = next((run.folder / "bt").glob("distrank-*/rank1.log")).read_text()
    assert "test_fails_on_rank_1: setup passed, call failed" in log
    # The hang ends this world with rank 1 stuck: it leaves with rank 0's exit code, and says
    # which (as a rank that reaches the end does: test_two_torchrun_agents_as_two_nodes).
    last = log.rstrip().splitlines()[-2:]
    assert last[0].endswith("leaving with rank 0's exit code"), log
    assert last[1] == "distrank: rank 1/2 (torchrun): exit code 1 (rank 0's)", log


@pytest.mark.parametrize(
    ("kind", "row"),
    [
        ("child-finished-first", "  rank 1/2  sent reports from pid *, not its own (*): a process "
         "forked by the test?*"),
        ("child-still-running", "  rank 1/2  forked pid * which still ran the rank's own code "
         "when the test ended*"),
    ],
    ids=["child-finished-first", "child-still-running"],
)  # fmt: skip
def test_torchrun_a_forked_test_process_is_not_a_rank(
    world: Callable[[str], Run], kind: str, row: str
) -> None:
    run = world("torchrun")
    module = FORK_FILES[kind]
    run.match(0, [row])
    run.match(0, [f"FAILED {module}.py::test_forks - [[]rank 1/2[]] *"])
    # The test fails; the next test of the file gets a working process group.
    assert run.outcomes(module, "junit.xml") == {"test_forks": "failure", "test_zz_after": "passed"}


def test_torchrun_unmatched_collective_fails_the_test_that_left_it(
    world: Callable[[str], Run],
) -> None:
    run = world("torchrun")
    run.match(
        0,
        [
            "  rank 0/2  issued 1 more collective than its peers on the default group: an "
            "unmatched collective (its last: gloo:all_reduce)  <- root cause",
            "  rank 1/2  passed",
        ],
    )
    assert run.outcomes("test_d_unmatched", "junit.xml") == {
        "test_culprit": "failure",
        "test_innocent": "passed",
        "test_point_to_point_is_not_a_desync": "passed",
    }


def test_torchrun_hang_times_out_with_every_ranks_stack(world: Callable[[str], Run]) -> None:
    run = world("torchrun")
    assert run.codes == [1]
    run.match(
        0,
        [
            "collectives: rank 0 waits in barrier #1 on the default group; rank 1 never entered "
            "it: it is blocked in test_hang at *.py:8",
            # Rank 1 sleeps: the verdict blames it, as in pool mode (issue 28).
            "  rank 0/2  waited in barrier #1 on the default group for rank 1; timed out in "
            "call after 3 s",
            "  rank 1/2  timed out in call after 3 s; blocked in test_hang at *.py:8  <- root "
            "cause",
            "*- traceback of rank 0/2 -*",
            "rank 0/2: Timeout: still in call after 3 s (timeout from @pytest.mark.timeout(3))",
            "in barrier #1 on the default group; blocked in barrier at "
            "torch/distributed/distributed_c10d.py:*, called from test_hang at *.py:7",
            "Stack of its main thread (most recent call first):",
            '  File "*distributed_c10d.py", line * in barrier',
        ],
    )
    run.match(
        0,
        [
            "SKIPPED [[]1[]] *: not run: test_z_hang.py::test_hang left rank(s) 0, 1 stuck "
            "(timeout): rank 0 in barrier #1 on the default group (blocked in barrier at *); "
            "rank 1 in no collective (*); a rank still inside its test cannot be taken out of it "
            "(a collective cannot be interrupted, and the plugin raises nothing into Python "
            "code), so the launched world stops here",
            "FAILED test_z_hang.py::test_hang - [[]rank 1/2[]] never entered barrier #1 on the "
            "default group (rank 0 waits in it); Timeout: still in call after 3 s *",
        ],
    )
    # Written by rank 0's watchdog (its main thread is stuck), with the test not run.
    assert run.outcomes("test_z_hang", "junit.xml") == {
        "test_hang": "failure",
        "test_never_reached": "skipped",
    }


# -- torchrun, 4 ranks ---------------------------------------------------------------------------


def test_torchrun_four_ranks(world: Callable[[str], Run]) -> None:
    run = world("four")
    assert run.codes == [1]
    run.match(
        0,
        [
            "distrank: 1 of 4 ranks failed; root cause: rank 3/4",
            "  rank 0/4  passed",
            "  rank 3/4  failed in call: assert 3 != 3  <- root cause",
            "*= 1 failed, 3 passed in *",
        ],
    )


def test_torchrun_keyboard_interrupt_on_rank_0_does_not_hang_its_peers(
    world: Callable[[str], Run],
) -> None:
    run = world("four")
    assert run.seconds < 90, run.outputs[0]
    # Rank 0 reports its own interruption as pytest does (the interrupted test and the rest are
    # not counted); the other ranks adopt its exit code (2, pytest's INTERRUPTED; torchrun
    # itself exits with 1 when a rank exits non-zero).
    run.match(0, ["*! KeyboardInterrupt !*", "*= 1 failed, 3 passed in *"])
    assert "test_zz_after" not in run.outputs[0]
    assert run.codes == [1], run.outputs[0]
    # torchrun lists every rank; once the first rank exits it sends SIGTERM to those still
    # running, so under load a peer may be terminated (-15) just before its own exit with 2
    # (all three were, once, in a loaded CI run). That each adopted rank 0's code is in its log:
    # rank 0 leaves only after every peer reached the end, past that line.
    codes = re.findall(r"exitcode  : (-?\d+) ", run.outputs[0])
    assert len(codes) == 4 and set(codes) <= {"2", "-15"}, run.outputs[0]
    for rank in (1, 2, 3):
        log = next((run.folder / "bt").glob(f"distrank-*/rank{rank}.log")).read_text()
        assert "(torchrun): exit code 2 (rank 0's)" in log, log


# -- torchrun: two agents as two nodes -----------------------------------------------------------


def test_two_torchrun_agents_as_two_nodes(world: Callable[[str], Run]) -> None:
    run = world("two-nodes")
    assert run.codes == [1, 1]
    reporting = [i for i, out in enumerate(run.outputs) if "test session starts" in out]
    assert len(reporting) == 1, run.outputs  # one report, on the node of rank 0
    run.match(
        reporting[0],
        [
            "distrank: * launcher torchrun (from *), world size 2 on 2 nodes, backend gloo, *",
            "  rank 1/2  failed in call: assert 1 == 0  <- root cause",
        ],
    )
    run.match(1 - reporting[0], ["distrank: rank 1/2 (torchrun): report on rank 0; log in *"])
    # Rank 1 failed a test itself, yet exits with rank 0's exit code, and its log says so.
    log = next((run.folder / "bt").glob("distrank-*/rank1.log")).read_text()
    assert "test_rank_1_fails: setup passed, call failed" in log
    assert "distrank: rank 1/2 (torchrun): exit code 1 (rank 0's)" in log
    assert run.outcomes("test_a_nodes", "j.xml") == {
        "test_across_nodes": "passed",
        "test_rank_1_fails": "failure",
    }
    run.match(reporting[0], ["*= 2 failed, 1 passed, 1 skipped in *"])
    # Two nodes and no DISTRANK_SECRET: the run says once that its results are unauthenticated.
    assert run.outputs[reporting[0]].count("distrank: results UNAUTHENTICATED: ") == 1


# -- the control store is authenticated ----------------------------------------------------------


def test_a_forged_passed_report_fails_the_test_naming_the_key(world: Callable[[str], Run]) -> None:
    """hostile-4 D3: another local user wrote rank 1's "passed" reports into torchrun's store
    before rank 1's own, and a failing test was reported PASSED. Now the forgery is named, the
    test fails, and the run stops after it."""
    run = world("forge")
    assert run.outputs[1].strip() == "forged", run.outputs[1]  # the forge did write, in time
    assert run.codes == [1, 0], run.outputs[0]
    run.match(
        0,
        [
            "  rank 0/2  passed",
            "  rank 1/2  control store tampered with: 'report/0/1' carries no MAC  <- root cause",
            "*the control store's 'report/0/1' (rank 1) carries no MAC: someone other than the "
            "ranks of this run wrote to the control store at MASTER_ADDR:MASTER_PORT*",
        ],
    )
    run.match(
        0,
        [
            "run ended early: the control store was written by someone other than the ranks in "
            "test_forge.py::test_rank_one_fails ('report/0/1' was tampered with): no later result "
            "could be trusted",
            "FAILED test_forge.py::test_rank_one_fails - [[]rank 1/2[]] control store tampered "
            "with: 'report/0/1' carries no MAC",
            "*= 1 failed in *",
        ],
    )
    assert "PASSED test_forge.py::test_rank_one_fails" not in run.outputs[0]
    # The secret file is gone once every rank read it; its folder is this user's alone.
    secrets = run.folder / "bt" / ".distrank-secrets"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    assert list(secrets.iterdir()) == []


# -- desync: the failure grace ends the world ----------------------------------------------------


@pytest.mark.parametrize("stuck", [0, 1])
def test_torchrun_desync_ends_the_run_promptly(world: Callable[[str], Run], stuck: int) -> None:
    """One rank raises, the other waits in a barrier: the grace period ends the run. Rank 0
    stuck (two torchrun agents): its watchdog writes the report; rank 1 stuck (Open MPI's
    variables by hand): rank 0's main thread does."""
    run = world("two-nodes" if stuck == 0 else "mpi")
    out = next(i for i, text in enumerate(run.outputs) if "test session starts" in text)
    assert run.seconds < 100  # far below the 300 s deadline
    assert run.codes == [1, 1]
    gave_up = 1 - stuck
    rows = {
        stuck: f"  rank {stuck}/2  stuck in call * s after rank {gave_up} failed; in barrier #1 on "
        "the default group; blocked in barrier at *, called from test_desync at *.py:7",
        gave_up: f"  rank {gave_up}/2  failed in call: RuntimeError: rank {gave_up} gave up  <- *",
    }
    run.match(
        out,
        [
            f"distrank: 1 of 2 ranks failed, 1 killed after it; root cause: rank {gave_up}/2",
            rows[0],
            rows[1],
            f"*RuntimeError: rank {gave_up} gave up",
            f"rank {stuck}/2: stuck in call: rank {gave_up} failed first",
            "SKIPPED [[]1[]] *: not run: test_z_desync.py::test_desync left rank(s) * stuck (rank "
            "* failed)*",
            f"FAILED test_z_desync.py::test_desync - [[]rank {gave_up}/2[]] RuntimeError: rank "
            f"{gave_up} gave up",
        ],
    )
    assert run.outcomes("test_z_desync", "j.xml") == {
        "test_desync": "failure",
        "test_ordinary_after": "skipped",
    }
    # Counted with the world's other file: two-nodes has 2 tests (1 failed), mpi 1 (failed).
    junit = ET.parse(run.folder / "j.xml").getroot().find("testsuite")
    assert junit is not None
    totals = (junit.get("tests"), junit.get("failures"), junit.get("skipped"))
    assert totals == (("4", "2", "1") if stuck == 0 else ("3", "2", "1"))


# -- what the plugin cannot trust: a rank's session ends (docs/failure-reports.md) ---------------


@pytest.mark.parametrize("kind", list(STOPS), ids=list(STOPS))
def test_torchrun_session_ending_exception_on_rank_1_fails_the_test_promptly(
    world: Callable[[str], Run], kind: str
) -> None:
    run = world(kind)
    assert run.seconds < 60, run.outputs[0]  # not the 300 s deadline
    assert run.codes == [1], run.outputs[0]
    run.match(0, [STOPS[kind][2]])
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


def test_a_malformed_payload_fails_the_test_naming_the_key(world: Callable[[str], Run]) -> None:
    """A payload that verifies but does not read as its kind (a protocol bug) is never read as a
    default: the test fails naming the store key, the payload's key and what was there."""
    run = world("malformed")
    assert run.codes == [1], run.outputs[0]
    run.match(
        0,
        [
            "  rank 1/2  malformed control payload: 'report/0/1' does not read: the PeerReport "
            "payload's 'index' is '0' (str), not int  <- root cause",
            "*a rank wrote what this version of pytest-distrank does not read*",
            "*Run one version of pytest-distrank on every rank; if it is one, please report this.",
        ],
    )
    run.match(
        0,
        [
            "run ended early: a rank wrote a malformed 'report/0/1' in "
            "test_malformed.py::test_index_as_text: no later result could be trusted",
            "FAILED test_malformed.py::test_index_as_text - [[]rank 1/2[]] malformed control "
            "payload: 'report/0/1' does not read: the PeerReport payload's 'index' is '0' (str), "
            "not int",
            "*= 1 failed, 1 skipped in *",
        ],
    )


def test_mismatched_collection_is_an_error_not_a_hang(world: Callable[[str], Run]) -> None:
    run = world("mismatch")
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
    assert run.codes == [2, 2], run.outputs  # both ranks: pytest's INTERRUPTED


# -- Slurm and MPI, launched by hand -------------------------------------------------------------


def test_slurm_by_hand(world: Callable[[str], Run]) -> None:
    run = world("slurm")
    assert run.codes == [0, 0], run.outputs
    (mine,) = (run.folder / "tmp").glob("pytest-of-*")
    (root,) = mine.glob("distrank-*")
    # Private as pytest makes it (0700 folders, 0600 logs) under umask 022 (hostile review 3,
    # D10).
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (mine, root, root / "rank1.log")}
    assert modes == {mine.name: 0o700, root.name: 0o700, "rank1.log": 0o600}
    run.match(
        0,
        [
            "distrank: 0.1.0, launcher slurm (from SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, "
            "MASTER_ADDR, MASTER_PORT; --distrank-launcher auto (default)), world size 2, *",
            "*= 3 passed, 3 warnings in *",
        ],
    )
    assert run.outcomes("test_a_mapped", "junit.xml") == {"test_mapped": "passed"}
    assert run.outputs[1].strip().startswith("distrank: rank 1/2 (slurm): report on rank 0; log in")
    # DISTRANK_SECRET signs the control store's messages: authenticated, and no secret file.
    assert "UNAUTHENTICATED" not in run.outputs[0]
    assert not (mine / ".distrank-secrets").exists()


def test_launched_warnings_of_every_rank_are_in_the_summary_once(
    world: Callable[[str], Run],
) -> None:
    run = world("slurm")
    assert run.codes == [0, 0], run.outputs[0]
    run.match(
        0,
        [
            "*warnings summary*",
            "*.py:*: DeprecationWarning: deprecated thing",
            "*.py:*: UserWarning: [[]rank 1/2[]] only on rank 1",
            "*.py:*: UserWarning: from an ordinary test",
        ],
    )
    assert run.outcomes("test_b_warnings", "junit.xml") == {
        "test_warns": "passed",
        "test_ordinary_warns": "passed",
    }
    # Rank 0's own warning is not shown again on its own, unmerged.
    assert run.outputs[0].count("DeprecationWarning: ") == 1, run.outputs[0]


def test_open_mpi_by_hand(world: Callable[[str], Run]) -> None:
    run = world("mpi")
    assert run.codes == [1, 1]  # rank 1 passed its test, but adopts rank 0's exit code
    run.match(
        0,
        [
            "distrank: 0.1.0, launcher mpi (from OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, "
            "OMPI_COMM_WORLD_LOCAL_RANK, MASTER_ADDR, MASTER_PORT; *), world size 2, *",
            "  rank 0/2  failed in call: assert 0 == 1  <- root cause",
            "cd * && mpirun -np 2 python -m pytest -p distrank *::test_rank_0_fails",
        ],
    )
    assert run.outcomes("test_a_rank0", "j.xml") == {"test_rank_0_fails": "failure"}


def test_slurm_without_rendezvous_is_a_usage_error(
    pytester: pytest.Pytester, run_inprocess: RunPytest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused at configure time, before any rank or store: a session in this process."""
    for name in (*LAUNCH_VARS, *(option.env for option in OPTIONS), "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "7"}
    for name, value in slurm.items():
        monkeypatch.setenv(name, value)
    pytester.makepyfile("def test_x():\n    pass\n")
    result = run_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    pytest.LineMatcher(result.outlines + result.errlines).fnmatch_lines(
        [
            "ERROR: pytest-distrank: launched by Slurm (srun) (SLURM_PROCID=0, SLURM_NTASKS=2), "
            "but MASTER_ADDR and MASTER_PORT are not set.",
            '*export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        ]
    )


def test_torchrun_verdict_compares_the_records_of_the_ranks_that_finished(
    world: Callable[[str], Run],
) -> None:
    """Issue 28: launcher mode explains as much as pool mode. Rank 2 finished the test; its
    flight records (asked for while it waits for rank 0's verdict) say it never entered the
    all_reduce its peers wait in, and the root cause follows them."""
    run = world("leaves")
    run.match(
        0,
        [
            "distrank: 2 of 3 ranks failed; root cause: rank 2/3 never entered all_reduce #2 on "
            "the default group (ranks 0, 1 wait in it)",
            "collectives: ranks 0, 1 wait in all_reduce #2 on the default group; rank 2 never "
            "entered it: it left the test (after all_reduce #1)",
            "  rank 0/3  waited in all_reduce #2 on the default group for rank 2; ended in call "
            "after *.* s: a deadlock (deadline was 60 s)",
            "  rank 1/3  waited in all_reduce #2 on the default group for rank 2; ended in call "
            "after *.* s: a deadlock (deadline was 60 s)",
            "  rank 2/3  passed  <- root cause",
        ],
    )
    run.match(0, ["FAILED test_z_leaves.py::test_rank_two_leaves - [[]rank 2/3[]] never entered *"])


def test_torchrun_a_proven_deadlock_ends_early_and_slow_ranks_do_not(
    world: Callable[[str], Run],
) -> None:
    """Issue 28 in launcher mode: each rank's watchdog says when its rank stands still, and rank
    0 ends the test once their records prove it can never finish: within seconds of a 60 s
    deadline. Ranks that stand still beyond the quiet time (1 s) only because a peer is late, a
    legal uneven all_to_all_single, object collectives and p2p of different sizes pass. Issue 31
    in the same world: a mesh shape that fits the launched world runs with its mesh fixture, a
    smaller one on a sub-world (issue 42); a test that requests a fixture at another world size is
    skipped, naming both sizes."""
    run = world("leaves")
    assert run.outcomes("test_a_legal", "junit.xml") == {
        "test_late_joiner_passes": "passed",
        "test_uneven_all_to_all_passes": "passed",
        "test_object_collectives_and_p2p_of_different_sizes_pass": "passed",
        "test_equal_across_ranks": "passed",
        "test_rank_one_differs": "failure",
        "test_mesh_that_fits[ws3-dp3]": "passed",
        "test_mesh_that_fits[ws2-dp2]": "passed",  # on a sub-world of 2 (issue 42)
        "test_cross_size_fixture": "skipped",
    }
    run.match(
        0,
        [
            "SKIPPED [[]1[]] test_a_legal.py:*: *'two_rank_files'* needs world_size 2, this "
            "launched world has 3 ranks (torchrun); run it in pool mode (pytest without a "
            "launcher)",
        ],
    )
    cases = ET.parse(run.folder / "junit.xml").getroot().iter("testcase")
    (leaves,) = [c for c in cases if c.get("name") == "test_rank_two_leaves"]
    assert float(leaves.get("time", "inf")) < 30, leaves.get("time")  # its deadline: 60 s
    run.match(
        0,
        [
            "*rank 0/3: Deadlock: still in call after *.* s, which can never finish: ended early "
            "(deadline was 60 s, timeout from @pytest.mark.timeout(60))",
            "*left rank(s) 0, 1 stuck (a proven deadlock): rank 0 in * (*); rank 1 in * (*); a "
            "rank still inside its test cannot be taken out of it *, so the launched world stops "
            "here",
        ],
    )


def test_torchrun_a_rank_left_in_a_group_its_peer_left_ends_early(
    world: Callable[[str], Run],
) -> None:
    """Issue 28 in launcher mode, rank 0 finished: its main thread judges while it gathers."""
    run = world("group-left")
    run.match(
        0,
        [
            "distrank: 1 of 2 ranks failed; root cause: rank 0/2 never entered all_reduce #1 on "
            "the group of ranks 0, 1 (rank 1 waits in it)",
            "*rank 0/2  passed  <- root cause",
            "*rank 1/2: Deadlock: still in call after *.* s, which can never finish: ended early "
            "(deadline was 60 s, timeout from @pytest.mark.timeout(60))",
        ],
    )
    cases = ET.parse(run.folder / "junit.xml").getroot().iter("testcase")
    (case,) = [c for c in cases if c.get("name") == "test_group_left"]
    assert float(case.get("time", "inf")) < 30, case.get("time")  # its deadline: 60 s
    (failure,) = case.iter("failure")
    assert failure.get("message", "").startswith("[rank 0/2] never entered all_reduce #1"), failure


def test_torchrun_rank_0_left_waiting_in_a_check_names_the_rank_that_skipped_it(
    world: Callable[[str], Run],
) -> None:
    """Rank 0 is the one stuck and every peer finished: the world's twin is made at its start
    (no check waits in its rendezvous), the test ends early, and the finished peers' records
    name the rank that never entered, as pool mode does (it named rank 0 before)."""
    run = world("rank0-waits")
    run.match(
        0,
        [
            "distrank: 1 of 2 ranks failed; root cause: rank 1/2 never entered a check across "
            "ranks (assert_*_across_ranks; its all_gather #1 on the group of ranks 0, 1) (rank 0 "
            "waits in it)",
            "*rank 0/2  waited in a check across ranks*for rank 1; ended in call after *.* s: a "
            "deadlock (deadline was 60 s)",
            "*rank 1/2  passed  <- root cause",
        ],
    )
    cases = ET.parse(run.folder / "junit.xml").getroot().iter("testcase")
    (case,) = [c for c in cases if c.get("name") == "test_rank_one_skips_the_check"]
    assert float(case.get("time", "inf")) < 30, case.get("time")  # its deadline: 60 s


def test_torchrun_assertions_across_ranks_show_every_ranks_table(
    world: Callable[[str], Run],
) -> None:
    """Issue 31 in launcher mode: an assertion across ranks gives every rank the same verdict
    (no rank is left waiting) with the per-rank table; rank 0 shows it once."""
    run = world("leaves")
    run.match(
        0,
        [
            "distrank: all 3 ranks failed the same way (AssertionError at test_a_legal.py:*); "
            "shown: rank 0/3",
            "E       weights differs on rank 1 at (2,): 7 there, 2 on rank 0",
            "E       1     (4,) float32  5            2.5          1/4        (2,)      7      2 "
            "               differs",
            "*traceback of rank 1/3*",
            "the same as rank 0/3",
        ],
    )


def test_launched_report_log_is_rank_0s_alone(world: Callable[[str], Run]) -> None:
    """Issue 29: pytest-reportlog writes one file, rank 0's, with the merged reports; rank 1
    opens none. (It used to: each rank opened the shared file at configure time and wrote its
    own session's lines at its own offsets, over rank 0's.)"""
    pytest.importorskip("pytest_reportlog")
    run = world("slurm")
    lines = (run.folder / "log.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line whole
    kinds = [r.get("$report_type") for r in records]
    assert kinds[0] == "SessionStart" and kinds[-1] == "SessionFinish", lines
    assert kinds.count("SessionStart") == kinds.count("SessionFinish") == 1, lines
    phases = [(r["nodeid"], r["when"]) for r in records if r.get("$report_type") == "TestReport"]
    assert phases and len(phases) == len(set(phases)), lines  # each phase once
    assert {when for _, when in phases} == {"setup", "call", "teardown"}
