"""Launcher mode: the ranks that left because rank 0 gave no sign of life, and what rank 0 says.

Runs in every rank of a launched world, in the main thread. A rank other than 0 that waits on
rank 0 gives up when rank 0's heartbeat stands still for ``HEARTBEAT_STALE`` seconds (rank 0's
main thread holds the GIL, so its watchdog cannot bump it: a long C call in a test that rank 0
runs alone). Before it exits it writes why (:func:`note`); rank 0, should it wake up, reads the
notes at its next test that needs the other ranks (:func:`reason`) and reports that test and the
ones after it as not run, naming the test it was in when it went silent (:func:`silent_during`)
instead of waiting for reports that will never come.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from . import keys
from .channel import Channel, ChannelError, Rank0Silent


def note(
    channel: Channel, rank: int, exc: ChannelError, silent_s: float, absent: bool = False
) -> None:
    """A rank other than 0, leaving on ``exc``: tell rank 0 why, when rank 0 went silent;
    ``absent``: it will not come to the final meeting either (it is counted there now)."""
    if not isinstance(exc, Rank0Silent):
        return
    payload: keys.GaveUp = {"since_ns": int(exc.since * 1e9), "silent_s": round(silent_s)}
    with contextlib.suppress(Exception):  # best effort: the rank exits either way
        channel.put(keys.gave_up(rank), payload)
        channel.add(keys.GAVE_UP, 1)
        if absent:
            channel.add(keys.BYE, 1)


def silent_during(alone: Sequence[tuple[str, float]], since: float, until: float) -> str | None:
    """The test rank 0 ran alone that overlaps ``[since, until]`` the most (None: none does).

    ``alone``: the node ids and wall-clock start times of the tests rank 0 ran alone, in order;
    each lasted until the next one started, the last one until ``until``.
    """
    best, most = None, 0.0
    for i, (nodeid, start) in enumerate(alone):
        end = alone[i + 1][1] if i + 1 < len(alone) else until
        overlap = min(end, until) - max(start, since)
        if overlap > most:
            best, most = nodeid, overlap
    return best


def wording(ranks: Sequence[int], silent_s: float, during: str | None) -> str:
    """Why the run cannot go on: ``ranks`` left when rank 0 was silent ``during`` a test."""
    where = f"during {during} (which rank 0 ran alone)" if during else "between tests"
    names = ", ".join(str(r) for r in ranks)
    return (
        f"rank(s) {names} left the run: rank 0 gave no sign of life for {silent_s:.0f} s "
        f"{where}: its main thread held the GIL (a long C call, such as a sleep or a regex, "
        "stops its watchdog too); keep such calls shorter or release the GIL in them"
    )


def reason(
    channel: Channel, world_size: int, alone: Sequence[tuple[str, float]], now: float
) -> str | None:
    """Rank 0, before a test that needs the other ranks: why some of them left (None: none did).

    One store operation when no rank left.
    """
    if channel.add(keys.GAVE_UP, 0) == 0:
        return None
    ranks, since, silent_s = [], now, 0.0
    for rank in range(1, world_size):
        with contextlib.suppress(ChannelError):
            if channel.has(keys.gave_up(rank)):
                left = channel.get(keys.gave_up(rank), keys.read_gave_up)
                ranks.append(rank)
                since = min(since, left["since_ns"] / 1e9)
                silent_s = max(silent_s, left["silent_s"])
    if not ranks:
        return None
    return wording(ranks, silent_s, silent_during(alone, since, since + silent_s))
