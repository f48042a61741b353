"""Unit: launcher mode's watch over the ranks' signs of life (launch/liveness.py): how a process's
end is told, and which silent rank rank 0 reports gone (a fake control channel, real processes)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from types import SimpleNamespace
from typing import Any, cast

from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.launch import keys
from pytest_distrank.launch.liveness import (
    GONE_AFTER,
    LEAVING,
    Liveness,
    exit_words,
    process_end,
)
from pytest_distrank.launch.session import RankSession


@given(st.integers(1, 64))
def test_a_signal_is_named(number: int) -> None:
    words = exit_words(number)
    assert words.startswith(f"killed by signal {number}")
    if number in {s.value for s in signal.Signals}:
        assert words.endswith(f"({signal.Signals(number).name})")


@given(st.integers(0, 255))
def test_an_exit_code_is_said(code: int) -> None:
    assert exit_words(code << 8) == f"exited with code {code}"


def _zombie(sig: int) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(["sleep", "30"])
    os.kill(child.pid, sig)
    end = time.monotonic() + 10
    while process_end(child.pid) is None and time.monotonic() < end:
        time.sleep(0.01)
    return child


def test_a_process_is_running_a_zombie_or_gone() -> None:
    assert process_end(os.getpid()) is None
    child = _zombie(signal.SIGKILL)
    assert process_end(child.pid) == "its process killed by signal 9 (SIGKILL)"
    child.wait()
    assert process_end(child.pid) == "its process is gone (its exit status went to the launcher)"


class _Channel:
    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def has(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str, read: Any) -> Any:
        return self.data[key]

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value

    def add(self, key: str, amount: int) -> int:
        self.data[key] = self.data.get(key, 0) + amount
        return int(self.data[key])


def _alive(beat: int, index: int = 4) -> keys.Alive:
    return {"beat": beat, "when": "call", "pid": 1, "index": index, "nodeid": "t.py::test_x"}


def test_rank_0_reports_a_silent_rank_gone_only_where_its_process_ended() -> None:
    """Rank 1 is a killed process (a zombie here), rank 2 runs (it holds the GIL: left to the
    deadline), rank 3 is on another host (its silence is all that is known)."""
    child = _zombie(signal.SIGKILL)
    here = socket.gethostname()
    channel = _Channel()
    logs = {1: f"{here}:/l1", 2: f"{here}:/l2", 3: "elsewhere:/l3"}
    rs = SimpleNamespace(
        pids=(os.getpid(), child.pid, os.getpid(), 99), world_size=4, exit_code=None,
        exiting=False, channel=channel, logs=logs, log=lambda text: None,
        launch=SimpleNamespace(label=lambda: "rank 0/4"),
    )  # fmt: skip
    watch = Liveness(cast(RankSession, rs))
    for rank in (1, 2, 3):
        channel.put(keys.alive(rank), _alive(7))
    watch.look(100.0)
    watch.look(100.0 + GONE_AFTER - 0.5)
    assert not any(key.startswith("fatal/") for key in channel.data)  # not silent long enough
    channel.put(keys.alive(3), _alive(8))  # rank 3 moved: its silence starts again
    watch.look(100.0 + GONE_AFTER)
    assert sorted(k for k in channel.data if k.startswith("fatal/")) == ["fatal/1"]
    fatal = channel.data["fatal/1"]
    assert fatal["message"] == (
        f"launched rank 1 (pid {child.pid} on {here}) sent no sign of life for 5 s in call of "
        "t.py::test_x: its process killed by signal 9 (SIGKILL)"
    )
    assert (fatal["pid"], fatal["index"], fatal["when"]) == (child.pid, 4, "call")
    assert channel.data[keys.BYE] == 1 and channel.data[keys.early_count(4)] == 1
    watch.look(100.0 + 2 * GONE_AFTER + 1)
    assert "fatal/2" not in channel.data  # running: not gone
    elsewhere = channel.data["fatal/3"]["message"]
    assert "launched rank 3 (pid 99 on elsewhere) sent no sign" in elsewhere
    assert "cannot be looked at from here" in elsewhere
    assert channel.data[keys.BYE] == 2  # rank 1 counted once
    child.wait()


def test_a_rank_that_said_it_leaves_is_not_reported() -> None:
    """A rank left stuck waits for rank 0's end in its watchdog, which then says nothing more."""
    channel = _Channel()
    rs = SimpleNamespace(
        pids=(1, 99), world_size=2, exit_code=None, exiting=False, channel=channel,
        logs={1: "elsewhere:/l1"}, log=lambda text: None,
        launch=SimpleNamespace(label=lambda: "rank 0/2"),
    )  # fmt: skip
    watch = Liveness(cast(RankSession, rs))
    channel.put(keys.alive(1), {**_alive(-1), "when": LEAVING})
    watch.look(0.0)
    watch.look(10 * GONE_AFTER)
    assert "fatal/1" not in channel.data
