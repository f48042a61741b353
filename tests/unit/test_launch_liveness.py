"""Unit: launcher mode's watch over the ranks' signs of life (launch/liveness.py): how a process's
end is told, when what rank 0's /proc says is evidence, and which silent rank rank 0 reports gone
(a fake control channel, real processes)."""

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
    UNSEEN,
    Liveness,
    exit_words,
    proc_identity,
    read_stat,
    verdict,
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


def _identity_of(pid: int) -> str:
    """Process ``pid``'s :func:`proc_identity`, as it would say it (this host, this namespace)."""
    stat = read_stat(pid)
    assert stat
    boot_and_namespace = proc_identity().rpartition(":")[0]
    return f"{boot_and_namespace}:{stat.rsplit(b')', 1)[1].split()[19].decode()}"


def _zombie(sig: int) -> tuple[subprocess.Popen[bytes], str]:
    child = subprocess.Popen(["sleep", "30"])
    identity = _identity_of(child.pid)
    os.kill(child.pid, sig)
    end = time.monotonic() + 10
    while verdict(proc_identity(), identity, read_stat(child.pid)) is None:
        assert time.monotonic() < end
        time.sleep(0.01)
    return child, identity


def test_a_process_is_running_a_zombie_or_gone() -> None:
    mine = proc_identity()
    assert mine.count(":") == 2 and mine.rpartition(":")[2].isdigit()
    assert verdict(mine, mine, read_stat(os.getpid())) is None
    child, theirs = _zombie(signal.SIGKILL)
    assert verdict(mine, theirs, read_stat(child.pid)) == "its process killed by signal 9 (SIGKILL)"
    child.wait()
    gone = "its process is gone (its exit status went to the launcher)"
    assert verdict(mine, theirs, read_stat(child.pid)) == gone


_STATES = st.sampled_from([b"R", b"S", b"D", b"T", b"t", b"Z", b"X"])


def _stat(state: bytes, start: int, status: int = 9) -> bytes:
    """A ``/proc/<pid>/stat`` line: fields 3 (state), 22 (start time), 52 (exit code)."""
    fields = [state] + [b"0"] * 18 + [str(start).encode()] + [b"0"] * 29 + [str(status).encode()]
    return b"42 (py) thon) " + b" ".join(fields)


@given(
    st.sampled_from(["b1:4026531836", "b1:4026532000", "b2:4026531836", ""]),
    st.sampled_from(["b1:4026531836", "b1:4026532000", "b2:4026531836", ""]),
    _STATES, st.integers(0, 2**40), st.integers(0, 2**40), st.booleans(),
)  # fmt: skip
def test_only_the_same_boot_and_namespace_and_start_time_is_evidence(
    mine: str, theirs: str, state: bytes, start: int, now: int, gone: bool
) -> None:
    """Another host (boot), another PID namespace, or a pid that is another process's now (its
    start time differs) says nothing about the rank: neither does a process that runs or is
    stopped. Only a missing pid, or the rank's own process as a zombie, is evidence."""
    stat = None if gone else _stat(state, now)
    found = verdict(f"{mine}:{start}" if mine else "", f"{theirs}:{start}" if theirs else "", stat)
    if not mine or mine != theirs:
        assert found is None
    elif gone:
        assert found == "its process is gone (its exit status went to the launcher)"
    elif state in (b"Z", b"X") and now == start:
        assert found == "its process killed by signal 9 (SIGKILL)"
    else:
        assert found is None


def test_an_unreadable_stat_is_no_evidence() -> None:
    assert verdict("b:1:2", "b:1:2", b"") is None
    assert verdict("b:1:2", "b:1:2", b"42 (x) Z 1 2") is None  # too short: not this /proc


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


def _alive(beat: int, index: int = 4, pid: int = 1, proc: str = "") -> keys.Alive:
    return {
        "beat": beat, "when": "call", "pid": pid, "index": index, "nodeid": "t.py::test_x",
        "proc": proc,
    }  # fmt: skip


def test_rank_0_reports_a_silent_rank_gone_only_on_evidence() -> None:
    """Rank 1 is a killed process (a zombie here), rank 2 runs (it holds the GIL: left to the
    deadline), rank 3 is on another host, rank 4 in another PID namespace, rank 5 said nothing of
    its process, rank 6's pid is another process's now (its start time differs): from none of
    these four does rank 0's /proc say anything, and their silence alone fails nothing."""
    child, theirs = _zombie(signal.SIGKILL)
    mine, me = proc_identity(), os.getpid()
    boot, namespace, start = mine.split(":")
    here = socket.gethostname()
    channel = _Channel()
    logs = {rank: f"{here}:/l{rank}" for rank in range(1, 7)} | {3: "elsewhere:/l3"}
    lines: list[str] = []
    rs = SimpleNamespace(
        pids=(me, child.pid, me, 99, 9, me, me), world_size=7, exit_code=None,
        exiting=False, channel=channel, logs=logs, log=lines.append,
        launch=SimpleNamespace(label=lambda: "rank 0/7"),
    )  # fmt: skip
    watch = Liveness(cast(RankSession, rs))
    procs = {
        1: theirs, 2: mine, 3: f"other-boot:{namespace}:{start}", 4: f"{boot}:1:{start}", 5: "",
        6: f"{boot}:{namespace}:{int(start) + 1}",
    }  # fmt: skip
    for rank, proc in procs.items():
        channel.put(keys.alive(rank), _alive(7, pid=rs.pids[rank], proc=proc))
    watch.look(100.0)
    watch.look(100.0 + GONE_AFTER - 0.5)
    assert not any(key.startswith("fatal/") for key in channel.data)  # not silent long enough
    assert not lines
    channel.put(keys.alive(2), _alive(8, pid=me, proc=mine))  # rank 2 moved: silence restarts
    watch.look(100.0 + GONE_AFTER)
    assert sorted(k for k in channel.data if k.startswith("fatal/")) == ["fatal/1"]
    fatal = channel.data["fatal/1"]
    assert fatal["message"] == (
        f"launched rank 1 (pid {child.pid} on {here}) sent no sign of life for 5 s in call of "
        "t.py::test_x: its process killed by signal 9 (SIGKILL)"
    )
    assert (fatal["pid"], fatal["index"], fatal["when"]) == (child.pid, 4, "call")
    assert channel.data[keys.BYE] == 1 and channel.data[keys.early_count(4)] == 1
    silent = [line for line in lines if "(SIGKILL)" not in line]
    assert silent == [
        f"distrank: rank 0/7: launched rank {rank} (pid {rs.pids[rank]} on "
        f"{logs[rank].split(':')[0]}) sent no sign of life for 5 s in call of t.py::test_x: "
        f"{UNSEEN}: the test's deadline ends it"
        for rank in (3, 4, 5)
    ]  # said once each (rank 6 is in this namespace: its pid is only not the rank's)
    for later in (1, 2, 60):
        watch.look(100.0 + GONE_AFTER + later)
    assert sorted(k for k in channel.data if k.startswith("fatal/")) == ["fatal/1"]
    assert len(lines) == 4 and channel.data[keys.BYE] == 1  # rank 1 counted once
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
