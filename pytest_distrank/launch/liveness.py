"""Launcher mode: a rank whose process died (SIGKILL, a crash, ``os._exit``) is known in seconds.

Runs in every rank of a launched world: :func:`beat` in each watchdog thread (every second),
:class:`Liveness` in rank 0's, :func:`hook_exit` from the main thread at configure time (its
wrapper runs where test code calls ``os._exit``).

Under a launcher that lets the other ranks run on when one dies (``srun``, a hand-made env://
world; torchrun and mpirun stop them all), a dead rank said nothing: rank 0 waited for the test's
deadline, its failure grace and 30 s more, then reported it as silent. Now:

- a rank that calls ``os._exit`` in a test says so first, with its code (``fatal/<rank>``, as a
  rank whose pytest session ended does), and counts itself at the final meeting (``bye``);
- every rank's watchdog writes a sign of life every second (``alive/<rank>``: a count, the test
  and phase it is in, and its process as rank 0 can recognise it: :func:`proc_identity`). When
  one has not changed for :data:`GONE_AFTER` seconds, rank 0 looks at the process, but only where
  it can see it for certain (:func:`verdict`): the same boot of the same machine and the same PID
  namespace as its own, and, where the pid is there, the same start time. A process that is gone,
  or a zombie (its exit status or signal is then known), is reported gone: rank 0 writes
  ``fatal/<rank>`` for it, naming its last test and phase, and counts it at the final meeting. The
  test it was in fails at once, naming the rank in the sub-world's and the launched numbering,
  and the run ends after its batch (the tests after it are reported as not run): no later test
  can count on that rank. Anything else is no evidence: a process that runs holds the GIL (its
  watchdog cannot run) or is stopped; one on another host or in another PID namespace, or a pid
  that is another process's now, cannot be looked at. Silence alone never fails a test: rank 0
  says once that the rank is silent, and the test's deadline ends it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
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
        "proc": proc_identity(),
        **keys.identity(cur.index if cur is not None else -1, cur.item.nodeid if cur else ""),
    }
    rs.channel.put(keys.alive(rs.rank), payload)


def proc_identity() -> str:
    """This process as another one can recognise it for certain: ``<boot>:<PID namespace>:<start>``
    (the machine's boot id, the inode of ``/proc/self/ns/pid``, field 22 of ``/proc/self/stat``);
    "" where ``/proc`` does not show this process under its own pid (another namespace's ``/proc``)
    or cannot be read."""
    return _identity(os.getpid())


@functools.cache
def _identity(pid: int) -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return ""
    fields = stat.rsplit(b")", 1)[-1].split()
    if not stat.startswith(f"{pid} (".encode()) or len(fields) < 20:
        return ""
    return f"{boot}:{namespace}:{fields[19].decode()}"


def exit_words(status: int) -> str:
    """A wait status (``/proc/<pid>/stat``'s exit code) in words."""
    if status & 0x7F:
        number = status & 0x7F
        with contextlib.suppress(ValueError):
            return f"killed by signal {number} ({signal.Signals(number).name})"
        return f"killed by signal {number}"
    return f"exited with code {status >> 8}"


def read_stat(pid: int) -> bytes | None:
    """``/proc/<pid>/stat`` as this process sees it; None: there is no such process here."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return b""  # unreadable: no evidence


#: Why a silent rank is not judged from here (:func:`verdict` found no evidence).
UNSEEN = (
    "its process cannot be looked at from here (it runs on another host or in another PID "
    "namespace, or did not say which)"
)


def same_namespace(mine: str, theirs: str) -> bool:
    """Do two :func:`proc_identity` name the same boot and PID namespace (both known)?"""
    here = mine.rpartition(":")[0]
    return bool(here) and here == theirs.rpartition(":")[0]


def verdict(mine: str, theirs: str, stat: bytes | None) -> str | None:
    """How a silent rank's process ended, on positive evidence only; None while nothing is known.

    ``mine`` and ``theirs``: rank 0's and the rank's :func:`proc_identity`; ``stat``: what
    :func:`read_stat` read for the rank's pid. Only the same boot and PID namespace tell: there
    a missing pid is a process gone, and one with the rank's start time is the rank's process
    (a zombie: ended, its wait status known). Another host, another namespace, an unknown
    identity or a pid now another process's is no evidence, nor is a process that runs."""
    if not same_namespace(mine, theirs):
        return None
    if stat is None:
        return "its process is gone (its exit status went to the launcher)"
    fields = stat.rsplit(b")", 1)[-1].split()
    start = theirs.rpartition(":")[2].encode()
    if len(fields) < 20 or fields[19] != start or fields[0] not in (b"Z", b"X"):
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
        #: Silent ranks that cannot be looked at, said so (until their next sign of life).
        self.told: set[int] = set()
        self.mine = proc_identity()

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
                self.told.discard(rank)
            elif now - last[1] >= GONE_AFTER:
                self._judge(rank, now - last[1])

    def _judge(self, rank: int, silent: float) -> None:
        rs = self.rs
        if rs.channel.has(keys.fatal(rank)):  # its session ended, and it said so
            self.gone.add(rank)
            return
        pid = rs.pids[rank] if rank < len(rs.pids) else 0
        last = self.alive.get(rank)
        theirs = last["proc"] if last is not None and last["pid"] == pid else ""
        how = verdict(self.mine, theirs, read_stat(pid)) if pid > 0 else None
        if how is None:  # it runs (GIL held, stopped), or it cannot be seen: no evidence
            if rank not in self.told and not same_namespace(self.mine, theirs):
                self.told.add(rank)  # said once a silence (its next sign of life ends it)
                words = self._words(rank, pid, silent, f"{UNSEEN}: the test's deadline ends it")
                rs.log(f"distrank: {rs.launch.label()}: {words}")
            return
        self.gone.add(rank)
        message = self._words(rank, pid, silent, how)
        rs.log(f"distrank: {rs.launch.label()}: {message}")
        index, nodeid, when = -1, "", ""
        if last is not None:
            index, nodeid, when = last["index"], last["nodeid"], last["when"]
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

    def _words(self, rank: int, pid: int, silent: float, how: str) -> str:
        last = self.alive.get(rank)
        where = "between tests"
        if last is not None and last["index"] >= 0:
            where = f"in {last['when'] or 'call'} of {last['nodeid']}"
        host = self.rs.logs.get(rank, "?").split(":", 1)[0]
        return (
            f"launched rank {rank} (pid {pid} on {host}) sent no sign of life for {silent:.0f} s "
            f"{where}: {how}"
        )


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
