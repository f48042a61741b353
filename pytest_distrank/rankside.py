"""What a rank process of either mode does around a test, apart from talking to its reporter.

Runs in rank processes of both modes (:mod:`pool.worker` in a pool; :mod:`launch.plugin`,
:mod:`launch.session` and :mod:`launch.group` in a launched world): fixtures the previous test left
that this one does not need, cutting huge output sections, the process groups' sequence numbers and
flight-recorder collective counts compared after each test (:mod:`fitness`), and forks of the rank
that a test left running its code.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from typing import Any

import pytest

from . import _compat
from .collectives import dump, load
from .reaper import living_children

#: Captured output sections longer than this are cut to their head and tail before sending.
SECTION_LIMIT = 256 * 1024


def teardown_unneeded(item: pytest.Item) -> None:
    """Close modules and classes the previous test left set up that this one does not need.

    The controller names each test's successor in its pool, so pytest's own teardown normally
    did this already; when the order is not known in advance (pytest-xdist schedules tests as it
    goes) the prediction can be wrong, and pytest's SetupState would refuse the next setup.
    """
    needed = set(item.listchain())
    if all(node in needed for node in _compat.setup_stack(item.session)):
        return
    try:
        _compat.teardown_exact(item.session, item)
    except BaseException:
        print(
            f"pytest-distrank: error tearing down fixtures before {item.nodeid}:\n"
            + traceback.format_exc(),
            file=sys.stderr,
            flush=True,
        )


def cap_section(content: str) -> str:
    """Keep the head and tail of a huge captured section (tens of MB help nobody)."""
    if len(content) <= SECTION_LIMIT:
        return content
    half = SECTION_LIMIT // 2
    cut = len(content) - 2 * half
    return f"{content[:half]}\n[... pytest-distrank cut {cut} characters ...]\n{content[-half:]}"


def stray_forks(pid: int) -> tuple[int, ...]:
    """Children of this rank that still run its own code (forked, not exec'd, not managed).

    A child of ``os.fork()`` that returns into pytest runs the rest of the test a second time.
    Children that ``exec``'d (subprocess) have another command line; multiprocessing's own
    children (DataLoader workers with the fork start method) are known to it and left alone.
    """
    import multiprocessing

    def cmdline(p: int | str) -> bytes:
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                return f.read()
        except OSError:
            return b""

    own = cmdline(pid)
    managed = {p.pid for p in multiprocessing.active_children()}
    found = [c for c in living_children(pid) if c not in managed and cmdline(c) == own]
    return tuple(sorted(found))


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
    modes = _compat.dispatch_modes()
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
    if os.environ.get("TORCH_FR_BUFFER_SIZE", "").strip() == "0":
        return None
    try:
        raw = _compat.dump_flight_recorder()
    except Exception:
        return None
    return load(raw)


def flight_mark() -> int:
    """The flight recorder's last record id (launcher mode takes it when it creates a group)."""
    entries = flight_entries() or []
    return max((int(e.get("record_id", -1)) for e in entries), default=-1)


def collective_counts(mark: int = -1) -> dict[str, tuple[int, str]] | None:
    """Collectives issued per live group, from the flight recorder (tens of ms: only on request),
    counting the records after ``mark`` only (a group created anew gets the old one's name, and
    the old one's records stay in the recorder).

    Point-to-point ops count in a group's sequence number but not here, so this tells a
    send/recv between some ranks from a collective that only some ranks issued.
    """
    entries = flight_entries()
    if entries is None:
        return None
    last: dict[str, tuple[int, str]] = {}
    for entry in entries:
        if entry.get("is_p2p") or (mark >= 0 and int(entry.get("record_id", -1)) <= mark):
            continue
        name = str(entry.get("process_group", ("?",))[0])
        last[name] = (int(entry.get("collective_seq_id", 0)), str(entry.get("profiling_name")))
    return {group_words(pg): last.get(str(pg.group_name), (0, "")) for pg in live_groups()}
