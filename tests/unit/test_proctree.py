"""Unit: a test's process tree read from /proc (tree/procs.py, tree/held.py, tree/reaped.py),
its stacks (tree/dump.py) and their words (tree/words.py), on real child processes of this one.

Each check starts its own small processes and ends them; none outlives its test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_distrank.envvars import FAKE_NVIDIA_DIR_ENV, TREE_DIR_ENV, TREE_PYSPY_ENV
from pytest_distrank.pool.pools.gpus import _open_by
from pytest_distrank.settings import Value
from pytest_distrank.tree import dump, held, procs, reaped, words

pytest_plugins = ["pytester"]

SLEEPER = "import time\ndef idle():\n    time.sleep(60)\nidle()\n"


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for child in started:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def spawn(
    children: list[subprocess.Popen[bytes]], code: str, stdout: int | None = None
) -> subprocess.Popen[bytes]:
    child = subprocess.Popen([sys.executable, "-c", code], stdout=stdout)
    children.append(child)
    return child


def wait_for(predicate: Callable[[], bool], seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.02)


def test_parse_pyspy_puts_the_main_thread_first() -> None:
    frame = {"name": "f", "filename": "/x/torch/distributed/c10d.py", "line": 3}
    text = json.dumps(
        [
            {"os_thread_id": 2, "thread_name": "side", "frames": []},
            {"os_thread_id": 1, "thread_name": "MainThread", "frames": [frame]},
        ]
    )
    threads = dump.parse_pyspy(text)
    assert [t for t, _ in threads] == ["Thread 1 (MainThread)", "Thread 2 (side)"]
    assert threads[0][1] == ['File "/x/torch/distributed/c10d.py", line 3 in f']
    assert dump.parse_pyspy("not json") == []


def test_parse_faulthandler_puts_the_signalled_thread_first() -> None:
    text = (
        "Thread 0x01 (most recent call first):\n"
        '  File "a.py", line 1 in side\n\n'
        "Current thread 0x02 (most recent call first):\n"
        '  File "b.py", line 2 in main\n'
    )
    threads = dump.parse_faulthandler(text)
    assert threads == [
        ("Current thread 0x02", ['File "b.py", line 2 in main']),
        ("Thread 0x01", ['File "a.py", line 1 in side']),
    ]


def test_stacks_text_marks_a_thread_blocked_in_torch_distributed() -> None:
    proc = procs.Proc(10, 1, "python -m worker", 0, True)
    blocked = 'File "/site-packages/torch/distributed/distributed_c10d.py", line 9 in barrier'
    stacks = [
        dump.Stacks(proc, [("Thread 10 (MainThread)", [blocked, 'File "w.py", line 2 in serve'])]),
        dump.Stacks(procs.Proc(11, 10, "sleep 60", 0, False), [], "not a Python process"),
    ]
    text = words.stacks_text(stacks, "py-spy", 0.25)
    assert "2 process(es) of the test's tree, stacks by py-spy in 0.25 s" in text
    assert f"Thread 10 (MainThread)  <- blocked in torch.distributed: {blocked}" in text
    assert "pid 11 (parent 10): sleep 60\n  (not a Python process)" in text


def test_death_lines_name_the_signal_or_the_exit_code() -> None:
    proc = procs.Proc(4711, 1, "python -m vllm.worker", 0, True)
    assert words.death_line(procs.Death(proc, signal.SIGSEGV, 3.14), "worker 2") == (
        "worker 2 (pid 4711, python -m vllm.worker) died of SIGSEGV at 3.1 s"
    )
    assert words.death_line(procs.Death(proc, 3 << 8, 0.5)).endswith("exited with code 3 at 0.5 s")


def test_the_watch_names_a_child_that_died_unreaped(
    children: list[subprocess.Popen[bytes]],
) -> None:
    watch = procs.Watch(os.getpid())
    try:
        child = spawn(children, "import os, signal; os.kill(os.getpid(), signal.SIGABRT)")
        wait_for(lambda: any(d.proc.pid == child.pid for d in watch.deaths))
    finally:
        watch.stop()
    death = next(d for d in watch.deaths if d.proc.pid == child.pid)
    # Dead before a poll saw it alive: a zombie has no command line, its name stands for it.
    assert death.signal == signal.SIGABRT and "python" in death.proc.cmdline


def test_the_watch_names_a_child_reaped_at_once(
    children: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    reaped.record_reaped(str(tmp_path))
    watch = procs.Watch(os.getpid(), str(tmp_path))
    try:
        child = spawn(children, "raise SystemExit(3)")
        child.wait()  # reaped before the watch polls: only reaped.py saw its status
        watch.poll()
    finally:
        watch.stop()
        reaped.stop_recording()
    assert [(d.proc.pid, d.exit_code) for d in watch.deaths] == [(child.pid, 3)]


def test_end_tree_ends_a_setsid_daemon_of_a_double_fork(
    children: list[subprocess.Popen[bytes]],
) -> None:
    code = "import os, time\nif os.fork(): os._exit(0)\nos.setsid()\ntime.sleep(60)\n"
    with procs.subreaper():
        watch = procs.Watch(os.getpid())
        try:
            spawn(children, code).wait()
            wait_for(lambda: any("setsid" in p.cmdline for p in watch.living()))
            daemon = next(p for p in watch.living() if "setsid" in p.cmdline)
            assert procs._stat(daemon.pid)[1] == os.getpid()  # type: ignore[index]  # adopted
            ended = procs.end_tree(watch.living(), os.getpid())
        finally:
            watch.stop()
    assert daemon in ended
    assert procs._stat(daemon.pid) is None  # killed and reaped


def test_ports_and_segments_the_tree_left(
    children: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    before = held.shm_segments()
    name = f"distrank-unit-{os.getpid()}"
    code = (
        "import socket, time, sys\n"
        f"open('/dev/shm/{name}', 'w').close()\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "print(s.getsockname()[1], flush=True); time.sleep(60)\n"
    )
    child = spawn(children, code, stdout=subprocess.PIPE)
    try:
        port = int(child.stdout.readline())  # type: ignore[union-attr]
        proc = procs.read_proc(child.pid, os.getpid())
        ports = held.listening_ports([proc], os.getpid())
        left = sorted(held.shm_segments() - before)
        text = held.held_text(left, ports)
    finally:
        os.unlink(f"/dev/shm/{name}")
    assert left == [name]
    assert ports == [(port, proc)]
    assert f"/dev/shm segment left: {name}" in text and f"port {port} was listening" in text


def test_gpu_holders_are_read_from_proc_fd_links(
    children: list[subprocess.Popen[bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "nvidia1").write_text("")
    monkeypatch.setenv(FAKE_NVIDIA_DIR_ENV, str(tmp_path))
    device = str(tmp_path / "nvidia1")
    code = f"import time\nf = open({device!r})\nprint(1, flush=True)\ntime.sleep(60)\n"
    child = spawn(children, code, stdout=subprocess.PIPE)
    child.stdout.readline()  # type: ignore[union-attr]
    assert held.gpu_holders(["0"]) == {}
    text = held.holders_text(["0", "1"])
    assert text.startswith(f"GPU 1 is held open by pid {child.pid} (")
    # A lease that waits in vain says it after the lock holders (pool/pools/gpus.py).
    assert _open_by(["1"]) == f"\n{held.holders_text(['1'])}"


def test_pyspy_reads_a_childs_stack(children: list[subprocess.Popen[bytes]]) -> None:
    if dump.pyspy() is None:
        pytest.skip("py-spy is not installed (the stacks extra)")
    child = spawn(children, SLEEPER)
    time.sleep(0.5)
    stacks, method = dump.dump_tree([procs.read_proc(child.pid, os.getpid())], None)
    assert method == "py-spy"
    frames = stacks[0].threads[0][1]
    assert any("in idle" in f for f in frames), stacks


def _armed_child(
    children: list[subprocess.Popen[bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> procs.Proc:
    for name, value in dump.fallback_env(str(tmp_path)).items():
        monkeypatch.setenv(name, value)
    child = spawn(children, SLEEPER)
    wait_for(lambda: (tmp_path / f"{child.pid}.stacks").exists())
    time.sleep(0.2)
    return procs.read_proc(child.pid, os.getpid())


def test_the_faulthandler_fallback_reads_a_childs_stack(
    children: list[subprocess.Popen[bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = _armed_child(children, tmp_path, monkeypatch)
    monkeypatch.setenv(TREE_PYSPY_ENV, "none")
    stacks, method = dump.dump_tree([proc], str(tmp_path))
    assert method.startswith("faulthandler (py-spy is not installed")
    assert any("in idle" in f for f in stacks[0].threads[0][1]), stacks
    assert os.environ[TREE_DIR_ENV] == str(tmp_path)


def test_a_refused_pyspy_falls_back_and_says_so(
    children: list[subprocess.Popen[bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = _armed_child(children, tmp_path, monkeypatch)
    refuse = tmp_path / "refuse.sh"
    refuse.write_text("#!/bin/sh\necho 'Error: Operation not permitted (os error 1)' >&2\nexit 1\n")
    refuse.chmod(0o755)
    monkeypatch.setenv(TREE_PYSPY_ENV, str(refuse))
    stacks, method = dump.dump_tree([proc], str(tmp_path))
    assert (
        method == "faulthandler (py-spy was refused: Error: Operation not permitted (os error 1))"
    )
    assert any("in idle" in f for f in stacks[0].threads[0][1])


def test_at_most_max_procs_are_read_the_rest_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TREE_PYSPY_ENV, "none")
    many = [procs.Proc(10**7 + i, 1, f"python w{i}", os.geteuid(), True) for i in range(20)]
    stacks, _ = dump.dump_tree([*many, procs.Proc(1, 0, "init", 0, False)], None)
    missing = [s.missing for s in stacks]
    assert missing.count(f"not read: more than {dump.MAX_PROCS} processes") == 20 - dump.MAX_PROCS
    assert missing.count("not a Python process") == 1
    assert missing.count("no stack: the fallback was not armed") == dump.MAX_PROCS


def test_segments_the_test_process_maps_itself_are_not_the_trees() -> None:
    import multiprocessing

    before = held.shm_segments()
    queue = multiprocessing.get_context("spawn").Queue()  # three named semaphores, mapped here
    try:
        new = held.shm_segments() - before
        assert len(new) == 3
        assert held.mapped_segments(os.getpid(), new) == new
        assert held.mapped_segments(os.getppid(), new) == set()
    finally:
        queue.close()
        queue.join_thread()


def test_a_ranks_stack_reads_past_the_trees_waitpid_wrapper() -> None:
    from pytest_distrank.outcome.stacks import where_blocked

    dump_text = (
        "Current thread 0x01 (most recent call first):\n"
        '  File "/x/pytest_distrank/tree/reaped.py", line 27 in waitpid\n'
        '  File "/lib/python3.11/multiprocessing/popen_fork.py", line 27 in poll\n'
        '  File "/t/test_x.py", line 9 in test_x\n'
    )
    assert where_blocked(dump_text, "/t/test_x.py").startswith("blocked in poll at ")


def test_a_forks_stack_stops_at_pytests_frames() -> None:
    frames = [
        'File "w.py", line 2 in serve',
        'File "/x/_pytest/python.py", line 187 in pytest_pyfunc_call',
        'File "/x/pluggy/_callers.py", line 9 in _multicall',
    ]
    stacks = [
        dump.Stacks(procs.Proc(10, 1, "python", 0, True), [("Thread 10 (MainThread)", frames)])
    ]
    text = words.stacks_text(stacks, "py-spy", 0.1)
    assert '    File "w.py", line 2 in serve\n    (2 frames of pytest\'s below)' in text
    assert "pyfunc_call" not in text


def test_who_opts_in_and_how_deaths_count(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The marker, or the session's option from any source; ``deaths=`` beats the option, and a
    bad value names where it came from."""
    from pytest_distrank.options import PROCESS_TREE, TREE_DEATHS
    from pytest_distrank.tree.options import deaths_policy, opted_in

    for name in (PROCESS_TREE.env, TREE_DEATHS.env, "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(
        """
        import pytest

        def test_plain():
            pass

        @pytest.mark.process_tree(deaths="fail")
        def test_marked():
            pass

        @pytest.mark.process_tree(deaths="never")
        def test_bad():
            pass
        """
    )

    def items(*args: str) -> dict[str, pytest.Item]:
        found, _ = pytester.inline_genitems("-p", "distrank", *args)
        return {item.name: item for item in found}

    plain = items()
    assert not opted_in(plain["test_plain"]) and opted_in(plain["test_marked"])
    assert deaths_policy(plain["test_plain"]) == Value("report", "default")
    assert deaths_policy(plain["test_marked"]) == Value(
        "fail", "@pytest.mark.process_tree(deaths='fail')"
    )
    with pytest.raises(pytest.UsageError, match=r"test_bad: @pytest.mark.process_tree\(deaths="):
        deaths_policy(plain["test_bad"])
    assert opted_in(items("--distrank-process-tree")["test_plain"])
    pytester.makeini("[pytest]\ndistrank_process_tree = true\ndistrank_tree_deaths = fail\n")
    from_ini = items()["test_plain"]
    assert opted_in(from_ini)
    assert deaths_policy(from_ini) == Value("fail", "distrank_tree_deaths = fail (in tox.ini)")
