"""Unit tests of pool/probes.why_silent: why a rank wrote no stack when asked, from /proc, on real
processes of this test (a sleep it stops, one that has exited and is not reaped yet). The
end-to-end case (tests/e2e/test_wording.py::test_stopped_rank_is_said_to_be_stopped) is a rank
that stops itself in a test."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from pytest_distrank.pool.onetest.probes import why_silent
from pytest_distrank.rank.reaper import proc_stat


def wait_for_state(pid: int, states: str) -> None:
    end = time.monotonic() + 10
    while time.monotonic() < end:
        stat = proc_stat(pid)
        if stat is not None and stat[0] in states:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never reached a state in {states!r}: {proc_stat(pid)}")


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def test_a_stopped_rank_could_not_answer(sleeper: subprocess.Popen[bytes]) -> None:
    wait_for_state(sleeper.pid, "S")
    assert why_silent(sleeper.pid) == ""  # asleep: it could have answered
    sleeper.send_signal(signal.SIGSTOP)
    wait_for_state(sleeper.pid, "Tt")
    assert why_silent(sleeper.pid) == (
        "no stack: the rank was stopped (SIGSTOP, SIGTSTP or a debugger) and could not answer "
        "the dump signal"
    )
    sleeper.send_signal(signal.SIGCONT)


def test_an_exited_rank_and_one_proc_does_not_know() -> None:
    process = subprocess.Popen(["true"])
    wait_for_state(process.pid, "Z")  # exited, not reaped yet
    assert why_silent(process.pid) == "no stack: the rank had exited"
    process.wait()
    assert why_silent(process.pid) == ""  # gone: /proc does not know
