"""Flight records as JSON: the few fields the plugin reads, checked, in both directions.

Runs wherever flight records are read or written: in ranks (pool mode's records thread,
launcher mode's ranks: :func:`dump`) and wherever a test's outcome is decided (the controller,
launcher mode's rank 0: :func:`load`). Stdlib only. The records travel as JSON in both modes (a
file beside the rank's log in pool mode, the control store in launcher mode); :func:`load` reads
them back (or torch's own JSON dump) as plain checked data, every field of its type, anything
else dropped. Nothing here unpickles: in launcher mode the bytes come from the network.
(:mod:`collectives` re-exports both.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def load(raw: bytes | str | None) -> dict[str, Any] | None:
    """A rank's flight records from JSON (:func:`dump`'s, or torch's own JSON dump):
    ``entries`` and ``pg_config`` with the fields this module reads, each of its type, anything
    else dropped. None: no answer, the recorder off, or unreadable (never unpickled)."""
    if not raw:
        return None
    text = raw.encode() if isinstance(raw, str) else raw
    if text.startswith(b"no records"):
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    entries = data.get("entries")
    configs = data.get("pg_config")
    return {
        "entries": [_entry(e) for e in entries if isinstance(e, dict)]
        if isinstance(entries, list)
        else [],
        "pg_config": {
            str(name): _config(config)
            for name, config in configs.items()
            if isinstance(config, dict)
        }
        if isinstance(configs, dict)
        else {},
        "dumped_ns": _int(data.get("dumped_ns"), 0),
    }


def _config(config: Mapping[str, Any]) -> dict[str, str]:
    """A group's members (``"[0, 1]"``) and, for the plugin's own groups, their ``owner``."""
    out = {"ranks": str(config.get("ranks", "?"))}
    if isinstance(config.get("owner"), str):
        out["owner"] = config["owner"]
    return out


def dump(data: Mapping[str, Any]) -> bytes:
    """Flight records as :func:`load` reads them: the few fields the plugin reads (torch's dump
    has several times more), compact JSON."""
    return json.dumps(data, separators=(",", ":")).encode()


def _entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """One record with the fields the plugin reads, each of its type."""
    group = entry.get("process_group")
    sizes = entry.get("input_sizes")
    dtypes = entry.get("input_dtypes")
    return {
        "record_id": _int(entry.get("record_id"), -1),
        "collective_seq_id": _int(entry.get("collective_seq_id"), 0),
        "process_group": [str(g) for g in group[:2]]
        if isinstance(group, list) and group
        else ["?"],
        "profiling_name": str(entry.get("profiling_name", "?")),
        "time_created_ns": _int(entry.get("time_created_ns"), 0),
        "timeout_ms": _int(entry.get("timeout_ms"), 0),
        "is_p2p": entry.get("is_p2p") is True,
        "retired": entry.get("retired") is True,
        "input_dtypes": [str(d) for d in dtypes] if isinstance(dtypes, list) else [],
        "input_sizes": [[_int(n, 0) for n in size] for size in sizes if isinstance(size, list)]
        if isinstance(sizes, list)
        else [],
    }


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
