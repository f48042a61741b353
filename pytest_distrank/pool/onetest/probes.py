"""Asking rank processes what they are doing, even while they are stuck inside C++.

Runs in the controller (pool mode). Two signals, each answered into a file beside the rank's log:
the stacks of all the rank's threads (faulthandler, registered on :data:`worker.main.DUMP_SIGNAL`,
written into the rank's log), and its flight recorder's records of the collectives it issued
(:mod:`worker.rankfr`, a thread of the rank waiting on :data:`rankfr.FR_SIGNAL`). Ask for stacks
first, records after (attempt.Attempt._unfinished says why). A rank that writes no stack when
asked is explained from /proc (:func:`why_silent`).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import TYPE_CHECKING, Any

from ...outcome.collectives import load
from ...outcome.endgame import DUMP_WAIT
from ...outcome.stacks import read_from
from ...rank.reaper import proc_stat
from ..worker.main import DUMP_SIGNAL
from ..worker.rankfr import FR_SIGNAL, fr_path

if TYPE_CHECKING:
    from .ranks import Rank

#: Bound on the ranks' flight-recorder answers once their stacks are in (a dump: tens of ms).
FR_WAIT = 1.0


def request_collectives(ranks: list[Rank]) -> None:
    """Ask each rank for its flight-recorder records (:mod:`worker.rankfr`; answered even while the
    rank is stuck in C++). Read them with :func:`read_collectives`."""
    for r in ranks:
        with contextlib.suppress(OSError):
            os.unlink(fr_path(r.log_path))
        with contextlib.suppress(OSError):
            os.kill(r.pid, FR_SIGNAL)


def read_collectives(ranks: list[Rank], wait: float) -> dict[int, bytes | None]:
    """The answers to :func:`request_collectives`, waiting up to ``wait`` seconds for them
    (None for a rank that did not answer)."""
    end = time.monotonic() + wait
    paths = {r.rank: fr_path(r.log_path) for r in ranks}
    while time.monotonic() < end and not all(os.path.exists(p) for p in paths.values()):
        time.sleep(0.02)
    answers: dict[int, bytes | None] = {}
    for rank, path in paths.items():
        try:
            with open(path, "rb") as f:
                answers[rank] = f.read()
        except OSError:
            answers[rank] = None
    return answers


def flight_records(ranks: list[Rank]) -> dict[int, dict[str, Any] | None]:
    """The flight records of ``ranks``, asked and read (None for a rank that did not answer
    within :data:`FR_WAIT`)."""
    request_collectives(ranks)
    return {r: load(raw) for r, raw in read_collectives(ranks, FR_WAIT).items()}


def dump_stacks(ranks: list[Rank]) -> dict[int, str]:
    """Ask each rank for the stacks of all its threads (faulthandler, works inside C++); wait
    until every log has grown and stopped growing, at most ``endgame.DUMP_WAIT`` seconds."""
    offsets = {}
    for r in ranks:
        try:
            offsets[r.rank] = os.stat(r.log_path).st_size
            os.kill(r.pid, DUMP_SIGNAL)
        except OSError:
            offsets[r.rank] = -1
    end = time.monotonic() + DUMP_WAIT
    sizes: dict[int, int] = {}
    while time.monotonic() < end:
        time.sleep(0.05)
        now = {r.rank: _size(r.log_path) for r in ranks}
        grew = all(now[k] > offsets[k] for k in now if offsets[k] >= 0)
        if grew and now == sizes:
            break
        sizes = now
    return {
        r.rank: read_from(r.log_path, offsets[r.rank]) if offsets[r.rank] >= 0 else ""
        for r in ranks
    }


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def why_silent(pid: int) -> str:
    """Why a rank wrote no stack when asked, where /proc knows ("" when it does not)."""
    stat = proc_stat(pid)
    if stat is None:
        return ""
    state = stat[0]
    if state in ("T", "t"):
        return (
            "no stack: the rank was stopped (SIGSTOP, SIGTSTP or a debugger) and could not "
            "answer the dump signal"
        )
    if state == "Z":
        return "no stack: the rank had exited"
    if state == "D":
        return "no stack: the rank was in uninterruptible sleep (disk or driver I/O)"
    return ""
