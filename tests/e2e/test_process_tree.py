"""End-to-end: a test's process tree is part of its report (issue 41 items 1-3).

One shared session, ``tree``, runs every scenario, ordinary tests (run by the controller, their
deadline taken from pytest-timeout) and distributed ones (their deadline the pool's) side by
side: workers that hang (their stacks, by py-spy, by the faulthandler fallback, and with py-spy
refused), workers in a gloo group (the one blocked in ``barrier`` is marked), a worker that
crashes (named; with ``deaths="fail"`` the test fails), a test that leaves a ``setsid`` daemon, a
``/dev/shm`` segment and a listening port (ended, named), a module fixture's server that two
tests use (not theirs: it survives), a fork server's workers left running (ended), a deadline in
a fixture's setup (its stacks), and plain tests after them (the session goes on and ends).
The leak check of ``run_pytest`` proves no process outlived the session.
Ctrl-C cannot share that session (it ends it): test_process_tree_interrupt.py.
"""

from __future__ import annotations

import glob
import os
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_distrank.envvars import TREE_PYSPY_ENV

from ..helpers import SharedSession

DEADLINE = 3
SETUP_DEADLINE = 2
SHM_PREFIX = "distrank-e2e-tree-"

WORKERS = '''
    """Worker processes' code (no torch import: a spawned worker starts in a blink)."""
    import os, signal, socket, time

    def serve(q):
        q.get()  # never answered

    def crash():
        os.kill(os.getpid(), signal.SIGSEGV)

    def leave(name):
        if os.fork():
            os._exit(0)
        os.setsid()
        open(f"/dev/shm/{name}", "w").close()
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        time.sleep(600)
'''

CONFTEST = f'''
    import os, pytest

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(item):
        """The py-spy seam, per test, in the process that takes the stacks (the controller)."""
        seam = {{"fallback": "none", "refused": os.path.join(str(item.path.parent), "refuse.sh")}}
        key = next((k for k in seam if k in item.name), None)
        if key is not None:
            os.environ["{TREE_PYSPY_ENV}"] = seam[key]
        try:
            return (yield)
        finally:
            os.environ.pop("{TREE_PYSPY_ENV}", None)
'''

REFUSE = (
    "#!/bin/sh\necho 'Error: Failed to attach: Operation not permitted (os error 1)' >&2\nexit 1\n"
)

ORDINARY = f'''
    import multiprocessing as mp, os, subprocess, sys, time
    import pytest
    import torch.distributed as dist
    import workers

    def hang_two(method):
        ctx = mp.get_context(method)
        q = ctx.Queue()
        procs = [ctx.Process(target=workers.serve, args=(q,), name=f"worker {{i}}") for i in (1, 2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()

    @pytest.mark.process_tree
    @pytest.mark.timeout({DEADLINE})
    def test_hung_workers():
        hang_two("spawn")

    def group_member(rank, path):
        dist.init_process_group("gloo", init_method=f"file://{{path}}", rank=rank, world_size=2)
        if rank == 0:
            dist.barrier()  # rank 1 never joins
        time.sleep(600)

    @pytest.mark.process_tree
    @pytest.mark.timeout({DEADLINE + 1})
    def test_group_hang(tmp_path):
        ctx = mp.get_context("fork")
        procs = [ctx.Process(target=group_member, args=(r, tmp_path / "store")) for r in (0, 1)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()

    def crash_one():
        p = mp.get_context("fork").Process(target=workers.crash)
        p.start()
        p.join()

    @pytest.mark.process_tree
    def test_crashed_worker():
        crash_one()

    @pytest.mark.process_tree(deaths="fail")
    def test_crashed_worker_fails():
        crash_one()

    @pytest.mark.process_tree
    def test_leaves_a_daemon():
        name = "{SHM_PREFIX}%d" % os.getpid()
        p = mp.get_context("fork").Process(target=workers.leave, args=(name,))
        p.start()
        p.join()
        time.sleep(0.5)

    @pytest.mark.process_tree
    @pytest.mark.timeout({DEADLINE})
    def test_hung_fallback():
        hang_two("spawn")

    @pytest.mark.process_tree
    @pytest.mark.timeout({DEADLINE})
    def test_hung_refused():
        hang_two("spawn")

    @pytest.fixture(scope="module")
    def server():
        p = subprocess.Popen(["sleep", "600"])
        yield p
        p.kill()
        p.wait()

    @pytest.mark.process_tree(deaths="fail")
    def test_server_first(server):
        assert server.poll() is None

    @pytest.mark.process_tree(deaths="fail")
    def test_server_second(server):
        assert server.poll() is None, f"the module fixture's server is gone: {{server.returncode}}"

    FORKSERVER_USER = (  # its own fork server: this session's is the plugin's
        "import multiprocessing as mp, workers\\n"
        "if __name__ == '__main__':\\n"
        "    ctx = mp.get_context('forkserver')\\n"
        "    q = ctx.Queue()\\n"
        "    ps = [ctx.Process(target=workers.serve, args=(q,)) for i in (1, 2)]\\n"
        "    [p.start() for p in ps]\\n"
        "    print('started', flush=True)\\n"
        "    [p.join() for p in ps]\\n"
    )

    @pytest.mark.process_tree
    def test_leaves_forkserver_workers():
        p = subprocess.Popen([sys.executable, "-c", FORKSERVER_USER], stdout=subprocess.PIPE)
        assert p.stdout.readline() == b"started\\n"
        p.stdout.close()
        LEFT.append(p)  # held: no Popen.__del__ warning before the plugin ends it

    LEFT = []

    @pytest.fixture
    def engine():
        hang_two("spawn")

    @pytest.mark.process_tree
    @pytest.mark.timeout({SETUP_DEADLINE})
    def test_setup_hangs(engine):
        pass

    def test_after():
        pass
'''

POOLED = f"""
    import multiprocessing as mp
    import pytest
    import torch.distributed as dist
    import workers

    @pytest.mark.process_tree
    @pytest.mark.world_size(2)
    @pytest.mark.timeout({DEADLINE})
    def test_pool_hung(rank):
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=workers.serve, args=(q,))
        p.start()
        p.join()

    @pytest.mark.process_tree
    @pytest.mark.world_size(2)
    @pytest.mark.timeout({DEADLINE})
    def test_pool_hung_fallback(rank):
        test_pool_hung(rank)

    @pytest.mark.process_tree
    @pytest.mark.world_size(2)
    def test_pool_crash(rank):
        if rank == 1:
            p = mp.get_context("fork").Process(target=workers.crash)
            p.start()
            p.join()
        dist.barrier()

    @pytest.mark.world_size(2)
    def test_pool_after(rank):
        dist.barrier()
"""


#: The folder the shared session ran in (its junit report is there).
_FOLDER: list[Path] = []


def _write(folder: Path) -> None:
    _FOLDER.append(folder)
    for name, text in {
        "workers.py": WORKERS,
        "conftest.py": CONFTEST,
        "test_own_workers.py": ORDINARY,
        "test_pool_workers.py": POOLED,
    }.items():
        (folder / name).write_text(textwrap.dedent(text))
    (folder / "refuse.sh").write_text(REFUSE)
    (folder / "refuse.sh").chmod(0o755)


@pytest.fixture
def tree(shared_session: SharedSession) -> pytest.RunResult:
    try:
        # The plugin closes what it opens in the test's process (an unclosed file is an error).
        args = ("-rA", "-p", "no:randomly", "--junitxml=junit.xml", "-W", "error")
        return shared_session("tree", _write, *args)
    finally:
        for path in glob.glob(f"/dev/shm/{SHM_PREFIX}*"):
            os.unlink(path)


def _section(result: pytest.RunResult, test: str, title: str) -> list[str]:
    """The lines of section ``title`` in the report of ``test`` (up to the next section)."""
    lines = result.outlines
    head = next(i for i, line in enumerate(lines) if line.strip("_ ") == test)
    return _sections(lines[head + 1 :], title)[0]


def _sections(lines: list[str], title: str) -> list[list[str]]:
    """Every section ``title`` in ``lines``, each up to the next section."""
    found = []
    for start in (i for i, line in enumerate(lines) if line.strip("- ") == title):
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i][:3] in ("---", "___", "===")),
            len(lines),
        )
        found.append(lines[start + 1 : end])
    return found


def test_tree_session_outcomes(tree: pytest.RunResult) -> None:
    tree.assert_outcomes(passed=8, failed=7, errors=1)


def test_a_module_fixtures_process_is_not_the_tests_and_survives(tree: pytest.RunResult) -> None:
    tree.stdout.fnmatch_lines_random(
        [
            "PASSED test_own_workers.py::test_server_first",
            "PASSED test_own_workers.py::test_server_second",
        ]
    )
    assert not [line for line in tree.outlines if "(sleep 600)" in line]


def test_forkserver_workers_left_running_are_ended(tree: pytest.RunResult) -> None:
    # The leak check of the session proves they were: they wait on their queue forever.
    sections = _sections(tree.outlines, "process tree (teardown)")
    ended = [s[0] for s in sections if s[0].startswith("ended 3 process(es)")]
    # the process that started them, then its fork server's two workers (not the server: a
    # fourth); command lines are cut to a width, so a long interpreter path hides their ends
    pytest.LineMatcher(ended).fnmatch_lines(
        ["ended 3 process(es) the test left running: * (*python*), * (*python*), * (*python*)"]
    )


def test_a_deadline_in_setup_attaches_the_stacks(tree: pytest.RunResult) -> None:
    section = _section(tree, "ERROR at setup of test_setup_hangs", "process tree: stacks")
    pytest.LineMatcher(section).fnmatch_lines(
        [
            f"at pytest-timeout's {SETUP_DEADLINE} s: * process(es) of the test's tree, *",
            '    File "*workers.py", line 6 in serve',
        ]
    )


def test_hung_workers_show_their_stacks_and_end_within_deadline_plus_5_s(
    tree: pytest.RunResult,
) -> None:
    section = pytest.LineMatcher(_section(tree, "test_hung_workers", "process tree: stacks"))
    section.fnmatch_lines(
        [
            f"at pytest-timeout's {DEADLINE} s: * process(es) of the test's tree, stacks by "
            "py-spy in *",
            "pid * (parent *): *spawn_main*",
            "  Thread * (MainThread)",
            '    File "*workers.py", line 6 in serve',
            "pid * (parent *): *spawn_main*",
            '    File "*workers.py", line 6 in serve',
        ]
    )
    tree.stdout.fnmatch_lines(
        [
            "E *Failed: Timeout: test_own_workers.py::test_hung_workers ran past "
            "pytest-timeout's 3 s; *"
        ]
    )
    junit = ET.parse(_FOLDER[0] / "junit.xml").getroot()
    seconds = {c.get("name"): float(c.get("time", "0")) for c in junit.iter("testcase")}
    assert seconds["test_hung_workers"] < DEADLINE + 5


def test_a_worker_blocked_in_a_collective_is_marked(tree: pytest.RunResult) -> None:
    section = pytest.LineMatcher(_section(tree, "test_group_hang", "process tree: stacks"))
    section.fnmatch_lines(
        [
            "  Thread * (MainThread)  <- blocked in torch.distributed: "
            "*distributed_c10d.py*in barrier",
            "    File *in group_member",
        ]
    )


def test_a_crashed_worker_is_named_though_the_test_passed(tree: pytest.RunResult) -> None:
    pytest.LineMatcher(_section(tree, "test_crashed_worker", "process tree")).fnmatch_lines(
        ["process (pid *) died of SIGSEGV at *.* s"]
    )
    tree.stdout.fnmatch_lines(["PASSED test_own_workers.py::test_crashed_worker"])


def test_deaths_fail_fails_the_test_for_a_crashed_worker(tree: pytest.RunResult) -> None:
    tree.stdout.fnmatch_lines(
        [
            "test_own_workers.py::test_crashed_worker_fails: a process of its tree died during "
            "the test (@pytest.mark.process_tree(deaths='fail') fails the test for it):",
            "process (pid *) died of SIGSEGV at *",
        ]
    )


def test_a_setsid_daemon_is_ended_and_its_port_and_segment_named(tree: pytest.RunResult) -> None:
    # pytest prints a passed test's teardown sections without its name when its call has none.
    sections = _sections(tree.outlines, "process tree (teardown)")
    section = next(lines for lines in sections if lines[0].startswith("ended 1 process"))
    pytest.LineMatcher(section).fnmatch_lines(
        [
            "ended 1 process(es) the test left running: * (*)",
            f"/dev/shm segment left: {SHM_PREFIX}*",
            "port * was listening (pid *)",
        ]
    )


def test_without_py_spy_the_fallback_reads_the_stacks(tree: pytest.RunResult) -> None:
    section = pytest.LineMatcher(_section(tree, "test_hung_fallback", "process tree: stacks"))
    section.fnmatch_lines(
        [
            "at pytest-timeout's 3 s: * stacks by faulthandler (py-spy is not installed: "
            "pip install pytest-distrank?stacks?) in *",
            "  Current thread 0x*",
            '    File "*workers.py", line 6 in serve',
        ]
    )


def test_a_refused_py_spy_is_said_and_the_fallback_reads_the_stacks(
    tree: pytest.RunResult,
) -> None:
    section = pytest.LineMatcher(_section(tree, "test_hung_refused", "process tree: stacks"))
    section.fnmatch_lines(
        [
            "* stacks by faulthandler (py-spy was refused: Error: Failed to attach: Operation "
            "not permitted (os error 1)) in *",
            '    File "*workers.py", line 6 in serve',
        ]
    )


def test_a_stuck_ranks_tree_shows_its_stacks(tree: pytest.RunResult) -> None:
    for rank in (0, 1):
        title = f"process tree: stacks (rank {rank}/2)"
        section = pytest.LineMatcher(_section(tree, "test_pool_hung", title))
        section.fnmatch_lines(
            [
                f"[rank {rank}/2]",
                "1 process(es) of the test's tree, stacks by py-spy in *",
                '    File "*workers.py", line 6 in serve',
            ]
        )
    fallback = _section(tree, "test_pool_hung_fallback", "process tree: stacks (rank 0/2)")
    pytest.LineMatcher(fallback).fnmatch_lines(
        [
            "* stacks by faulthandler (py-spy is not installed*",
            '    File "*workers.py", line 6 in serve',
        ]
    )


def test_a_ranks_crashed_worker_is_named(tree: pytest.RunResult) -> None:
    section = _section(tree, "test_pool_crash", "process tree (rank 1/2)")
    pytest.LineMatcher(section).fnmatch_lines(
        ["[rank 1/2]", "process (pid *) died of SIGSEGV at *"]
    )


def test_the_session_goes_on_after_the_hangs(tree: pytest.RunResult) -> None:
    tree.stdout.fnmatch_lines_random(
        ["PASSED test_own_workers.py::test_after", "PASSED test_pool_workers.py::test_pool_after"]
    )
