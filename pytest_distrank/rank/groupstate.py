"""A rank's process groups after a test, in either mode: sequence numbers, flight records.

Runs in rank processes of both modes (:mod:`pool.worker.main` and :mod:`pool.worker.rankfr` in a
pool; :mod:`launch.plugin`, :mod:`launch.group` and :mod:`launch.gather` in a launched world). The
groups' sequence numbers and the flight recorder's collective counts are compared between ranks
after each test (:mod:`outcome.checks`); the dispatch modes a test left entered make the rank
unfit. torch is imported only when a function is called.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from .. import _compat
from ..outcome.collectives import dump, load
from ..outcome.frcalls import CHECK_OWNER
from .ownedgroups import is_owned

#: The ``faults`` fixture's dispatch mode (:mod:`api.faults`): left out of the modes-left check.
FAULTS_MODE = "FaultInjectionMode"


def group_words(pg: Any) -> str:
    import torch.distributed as dist

    if pg is dist.group.WORLD:
        return "the default group"
    try:
        ranks = ", ".join(str(r) for r in dist.get_process_group_ranks(pg))
    except Exception:
        ranks = "?"
    return f"group {pg.group_name!r} (ranks {ranks})"


def live_groups() -> list[Any]:
    """The process groups this rank is a member of, the default one first."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return []
    groups = [dist.group.WORLD]
    groups += [pg for pg in _compat.process_groups() if pg is not dist.group.WORLD]
    return groups


def left_modes() -> str:
    """After a test: the torch dispatch modes it left entered ("" when none). Every later test
    of the rank would run under them (a FakeTensorMode makes every tensor fake), so the pool is
    not fit to serve another test."""
    modes = [m for m in _compat.dispatch_modes() if m != FAULTS_MODE]  # the faults fixture's
    if not modes:
        return ""
    return f"left torch dispatch mode{'s' if len(modes) > 1 else ''} entered: {', '.join(modes)}"


def sequence_numbers() -> dict[str, int]:
    """Each live group's sequence number: compared between ranks after every test (~30 us)."""
    out: dict[str, int] = {}
    for pg in live_groups():
        with contextlib.suppress(Exception):  # a backend without sequence numbers
            out[group_words(pg)] = _compat.sequence_number(pg)
    return out


def flight_records() -> bytes | None:
    """This rank's flight records as the JSON both modes send (:func:`collectives.dump`: the
    fields the plugin reads; tens of ms), or None when the recorder is off
    (``TORCH_FR_BUFFER_SIZE=0``: no records then does not mean no collectives) or fails."""
    data = _flight_data()
    return None if data is None else dump(data)


def flight_entries() -> list[dict[str, Any]] | None:
    """The flight recorder's entries, oldest first; None when there are none to trust."""
    data = _flight_data()
    return None if data is None else list(data["entries"])


def _flight_data() -> dict[str, Any] | None:
    """The records as :func:`collectives.load` reads them, with when they were taken (this
    rank's clock: how long a collective has waited past its group's timeout) and the plugin's
    own groups marked (a check across ranks is named as such, not as the test's collective)."""
    if os.environ.get("TORCH_FR_BUFFER_SIZE", "").strip() == "0":
        return None
    now = time.time_ns()
    try:
        raw = _compat.dump_flight_recorder()
    except Exception:
        return None
    data = load(raw)
    if data is not None:
        data["dumped_ns"] = now
        with contextlib.suppress(Exception):
            for pg in live_groups():
                config = data["pg_config"].get(str(pg.group_name))
                if config is not None and is_owned(pg):
                    config["owner"] = CHECK_OWNER
    return data


def flight_mark() -> int:
    """The flight recorder's last record id (launcher mode takes it when it creates a group)."""
    entries = flight_entries() or []
    return max((int(e.get("record_id", -1)) for e in entries), default=-1)


def collective_counts(mark: int = -1) -> dict[str, tuple[int, str]] | None:
    """Collectives issued per live group, from the flight recorder (tens of ms: only on request),
    counting the records after ``mark`` only (a group created anew gets the old one's name, and
    the old one's records stay in the recorder).

    Point-to-point ops count in a group's sequence number but not here, so this tells a
    send/recv between some ranks from a collective that only some ranks issued. The last op's
    words say when it is over on this rank (:data:`OVER_ALONE`): reported only where the rank
    issued more than its peers, which then never entered it.
    """
    entries = flight_entries()
    if entries is None:
        return None
    last: dict[str, tuple[int, str]] = {}
    for entry in entries:
        if entry.get("is_p2p") or (mark >= 0 and int(entry.get("record_id", -1)) <= mark):
            continue
        name = str(entry.get("process_group", ("?",))[0])
        op = str(entry.get("profiling_name"))
        if entry.get("retired"):
            op += f", over on this rank ({OVER_ALONE})"
        last[name] = (int(entry.get("collective_seq_id", 0)), op)
    return {group_words(pg): last.get(str(pg.group_name), (0, "")) for pg in live_groups()}


#: After an unmatched collective's op when the rank saw it end: no peer entered it, so it ended
#: in an error the test caught (most often its group's own timeout; a broadcast's root on gloo
#: may also end its part alone).
OVER_ALONE = (
    "no peer entered it: an error the test caught, such as its group's timeout? a test of that "
    "timeout destroys the group in the test, see docs/failure-reports.md"
)
