"""Launcher mode: a rank whose process died (SIGKILL, a crash, ``os._exit``) is known in seconds.

Runs in every rank of a launched world: :func:`beat` in each watchdog thread (every second),
:class:`Liveness` in rank 0's, :func:`hook_exit` from the main thread at configure time (its
wrapper runs where test code calls ``os._exit``).

Under a launcher that lets the other ranks run on when one dies (``srun``, a hand-made env://
world; torchrun and mpirun stop them all), a dead rank said nothing: rank 0 waited for the test's
deadline, its failure grace and 30 s more, then reported it as silent. Now:

- a rank that calls ``os._exit`` in a test says so first, with its code (``fatal/<rank>``, as a
  rank whose pytest session ended does), and counts itself at the final meeting (``bye``);
- every rank's watchdog writes a sign of life every second (``alive/<rank>``: a count, and the
  test and phase it is in). When one has not changed for :data:`GONE_AFTER` seconds, rank 0 looks
  at the process where it can (same host: ``/proc/<pid>``): a process that still runs holds the
  GIL (its watchdog cannot run) and is left to the test's deadline; one that is gone, or a zombie
  (its exit status or signal is then known), or one on another host (nothing is known there but
  its silence) is reported gone: rank 0 writes ``fatal/<rank>`` for it, naming its last test and
  phase, and counts it at the final meeting. The test it was in fails at once, naming the rank in
  the sub-world's and the launched numbering, and the run ends after its batch (the tests after
  it are reported as not run): no later test can count on that rank.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Callable
from typing import NoReturn

from . import keys
from .channel import ChannelError
from .current import Current
from .session import RankSession

#: Seconds without a sign of life after which rank 0 looks at a rank's process.
GONE_AFTER = 5.0


#: The last sign of life of a rank whose watchdog waits for rank 0's end (a test left it stuck):
#: it says no more, and rank 0 does not count its silence.
LEAVING = "leaving"


def beat(rs: RankSession, cur: Current | None, count: int, when: str = "") -> None:
    """A rank other than 0 (its watchdog): this rank lives, in ``cur`` (None: between tests)."""
    payload: keys.Alive = {
        "beat": count,
        "when": when or (cur.when if cur is not None else ""),
        **keys.identity(cur.index if cur is not None else -1, cur.item.nodeid if cur else ""),
    }
    rs.channel.put(keys.alive(rs.rank), payload)


def exit_words(status: int) -> str:
    """A wait status (``/proc/<pid>/stat``'s exit code) in words."""
    if status & 0x7F:
        number = status & 0x7F
        with contextlib.suppress(ValueError):
            return f"killed by signal {number} ({signal.Signals(number).name})"
        return f"killed by signal {number}"
    return f"exited with code {status >> 8}"


def process_end(pid: int) -> str | None:
    """How process ``pid`` of this host ended, in words; None while it runs."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        return "its process is gone (its exit status went to the launcher)"
    except OSError:
        return None
    if fields[0] not in (b"Z", b"X"):
        return None
    if len(fields) > 49:  # field 52, exit_code (Linux 3.5+); fields[0] is field 3
        return f"its process {exit_words(int(fields[49]))}"
    return "its process ended"


class Liveness:
    """Rank 0's watch over the other ranks' signs of life (its watchdog calls :meth:`look`)."""

    def __init__(self, rs: RankSession) -> None:
        self.rs = rs
        #: Per rank: its last sign of life, and when (monotonic) it last changed.
        self.seen: dict[int, tuple[int, float]] = {}
        self.alive: dict[int, keys.Alive] = {}
        #: Ranks reported gone (or whose session ended): not looked at again.
        self.gone: set[int] = set()

    def look(self, now: float) -> None:
        rs = self.rs
        if not rs.pids or rs.exit_code is not None or rs.exiting:
            return  # before the plan every rank's watchdog may not be up; after: leaving
        for rank in range(1, rs.world_size):
            if rank in self.gone:
                continue
            key = keys.alive(rank)
            beat = -1
            if rs.channel.has(key):
                with contextlib.suppress(ChannelError):
                    data = rs.channel.get(key, keys.read_alive)
                    self.alive[rank], beat = data, data["beat"]
            if rank in self.alive and self.alive[rank]["when"] == LEAVING:
                continue
            last = self.seen.get(rank)
            if last is None or beat != last[0]:
                self.seen[rank] = (beat, now)
            elif now - last[1] >= GONE_AFTER:
                self._judge(rank, now - last[1])

    def _judge(self, rank: int, silent: float) -> None:
        rs = self.rs
        if rs.channel.has(keys.fatal(rank)):  # its session ended, and it said so
            self.gone.add(rank)
            return
        pid = rs.pids[rank] if rank < len(rs.pids) else 0
        host = rs.logs.get(rank, "?").split(":", 1)[0]
        if host == socket.gethostname():
            how = process_end(pid)
            if how is None:
                return  # it runs: it holds the GIL; the test's deadline ends it
        else:
            how = (
                f"it is on {host}, where its process cannot be looked at from here (it died, "
                "or it holds the GIL); the launcher's output there names its exit code or signal"
            )
        self.gone.add(rank)
        last = self.alive.get(rank)
        index, nodeid, when = -1, "", ""
        if last is not None:
            index, nodeid, when = last["index"], last["nodeid"], last["when"]
        where = f"in {when or 'call'} of {nodeid}" if index >= 0 else "between tests"
        message = (
            f"launched rank {rank} (pid {pid} on {host}) sent no sign of life for {silent:.0f} s "
            f"{where}: {how}"
        )
        rs.log(f"distrank: {rs.launch.label()}: {message}")
        payload: keys.Fatal = {
            "message": message,
            "when": when,
            "reports": [],
            "warnings": [],
            "pid": pid,
            "index": index,
            "nodeid": nodeid,
        }
        with contextlib.suppress(ChannelError):
            rs.channel.put(keys.fatal(rank), payload)
            rs.channel.add(keys.BYE, 1)  # it will not come to the final meeting
            if index >= 0:
                rs.channel.add(keys.early_count(index), 1)  # its test's rank 0 looks at once


def hook_exit(rs: RankSession, current: Callable[[], Current | None]) -> None:
    """A rank other than 0: ``os._exit`` called by test code in this process says so first
    (``fatal/<rank>``, with the code and the test), and counts this rank at the final meeting."""
    if rs.rank == 0:
        return
    real = os._exit

    def _exit(status: int) -> NoReturn:
        if os.getpid() == rs.pid and not rs.exiting:
            with contextlib.suppress(Exception):
                cur = current()
                where = cur.item.nodeid if cur is not None else "a pause between tests"
                payload: keys.Fatal = {
                    "message": f"launched rank {rs.rank} called os._exit({status}) in {where}",
                    "when": cur.when if cur is not None else "",
                    "reports": [rs.serialize(r) for r in list(cur.reports)] if cur else [],
                    "warnings": [],
                    **keys.identity(cur.index if cur else -1, cur.item.nodeid if cur else ""),
                }
                rs.channel.put(keys.fatal(rs.rank), payload)
                if cur is not None:
                    rs.channel.add(keys.early_count(cur.index), 1)
                rs.channel.add(keys.BYE, 1)
        real(status)

    os._exit = _exit
