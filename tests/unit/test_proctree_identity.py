"""Unit: who belongs to a test's process tree and what counts as a death in it (tree/procs.py,
tree/reaped.py): a fork server's workers, a reused pid, a tree that starts late, a stopped
child, another library's ``os.waitpid`` wrapper, the fallback's own signal.

Each check starts its own small processes and ends them; none outlives its test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.tree import procs, reaped

FORKSERVER = "python3 -c from multiprocessing.forkserver import main; main(3, 4, ['__main__'])"


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen(["sleep", "60"])
    yield child
    child.kill()
    child.wait()


def wait_for(predicate: Callable[[], bool], seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.02)


def test_a_fork_server_is_a_helper_and_its_workers_are_not() -> None:
    server = procs.Proc(10, 1, FORKSERVER, 0, True)
    worker = procs.Proc(11, 10, FORKSERVER, 0, True)
    assert procs.is_helper(server, parent_cmdline="python -m pytest")
    assert not procs.is_helper(worker, parent_cmdline=FORKSERVER)
    assert not procs.is_helper(procs.Proc(12, 1, "sleep 60", 0, False), parent_cmdline="")


def test_a_pid_ended_in_an_earlier_test_is_watched_again_when_reused(
    sleeper: subprocess.Popen[bytes],
) -> None:
    """The watch skips a process the plugin ended earlier (its parent may reap it now), by pid
    and start time: the same pid with another start time is another process, in the tree."""
    start = procs.start_time(sleeper.pid)
    assert start > 0
    for ended, watched in (({(sleeper.pid, start)}, False), ({(sleeper.pid, start - 1)}, True)):
        watch = procs.Watch(os.getpid(), ended=ended)
        watch.before.discard(sleeper.pid)  # as if born in the test, on an ended one's pid
        try:
            living = [p.pid for p in watch.living()]
        finally:
            watch.stop()
        assert (sleeper.pid in living) is watched


def test_a_tree_that_starts_late_leaves_out_what_ran_before() -> None:
    """A module fixture's server, started before the test's function-scoped fixtures."""
    watch = procs.Watch(os.getpid())
    server = subprocess.Popen(["sleep", "60"])
    try:
        wait_for(lambda: server.pid in [p.pid for p in watch.living()])
        watch.rebase()
        assert server.pid not in [p.pid for p in watch.living()]
    finally:
        watch.stop()
        server.kill()
        server.wait()


@given(st.integers(1, 64), st.integers(0, 255))
def test_a_stop_or_a_continue_is_no_death(sig: int, code: int) -> None:
    stopped = (sig << 8) | 0x7F
    assert not reaped.is_death(stopped)
    assert not reaped.is_death(0xFFFF)  # WCONTINUED's status
    assert reaped.is_death(code << 8) is (code != 0)
    if sig < 0x7F:
        assert reaped.is_death(sig)  # ended by signal ``sig``


def test_a_stopped_child_is_not_recorded(tmp_path: Path) -> None:
    reaped.record_reaped(str(tmp_path))
    try:
        pid = os.fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGSTOP)
            os._exit(0)
        assert os.WIFSTOPPED(os.waitpid(pid, os.WUNTRACED)[1])
        os.kill(pid, signal.SIGCONT)
        assert os.waitpid(pid, 0)[1] == 0
    finally:
        reaped.stop_recording()
    assert reaped.read_reaped(str(tmp_path)) == {}


def test_another_waitpid_wrapper_is_chained_and_restored(tmp_path: Path) -> None:
    """As gevent.monkey's: it keeps being called while the tree records, and is put back."""
    builtin = os.waitpid
    calls: list[int] = []

    def theirs(pid: int, options: int) -> tuple[int, int]:
        calls.append(pid)
        return builtin(pid, options)

    os.waitpid = theirs
    try:
        reaped.record_reaped(str(tmp_path))
        try:
            child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
            child.wait()
        finally:
            reaped.stop_recording()
        assert os.waitpid is theirs
    finally:
        os.waitpid = builtin
    assert child.pid in calls
    assert reaped.read_reaped(str(tmp_path))[child.pid][1] == 3 << 8


def test_the_fallbacks_own_signal_is_no_death() -> None:
    """A process with no handler for it dies of it: the plugin's doing, not the test's."""
    watch = procs.Watch(os.getpid())
    child = subprocess.Popen(["sleep", "60"])
    crash = subprocess.Popen(["sh", "-c", "sleep 0.5; kill -SEGV $$"])
    try:
        wait_for(lambda: child.pid in [p.pid for p in watch.living()])
        os.kill(child.pid, procs.FALLBACK_SIGNAL)
        wait_for(lambda: any(d.proc.pid == crash.pid for d in watch.deaths))
        watch.poll()
    finally:
        watch.stop()
        child.kill()
        child.wait()
        crash.wait()
    assert [d.proc.pid for d in watch.deaths] == [crash.pid]
