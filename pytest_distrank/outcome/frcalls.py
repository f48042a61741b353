"""A rank's flight records read as the collectives it issued in a test, numbered per group.

Runs where a test's outcome is decided (the controller in pool mode, rank 0 of a launched
world), over records :func:`frjson.load` checked. Pure logic: stdlib only, no torch.

A group is identified by the recorder's process-group name (the same on every member: torch
names a group by a counter every rank advances alike, or by a hash of its members and the
groups of those members made before it), never by its members: two groups of the same ranks
(a gradient group and a checkpoint group, a mesh dimension and the test's own group of those
ranks, the plugin's twin of a subgroup) are numbered and compared apart. The members only give
the words ("the group of ranks 0, 1").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from .merge import ranks_words

#: torch's scalar type names, as the flight recorder writes them, in the words users write.
DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
}
#: ``pg_config``'s ``owner`` of the plugin's twin groups (``rank.ownedgroups``), which only the
#: checks across ranks use.
CHECK_OWNER = "check"


@dataclasses.dataclass(frozen=True)
class Call:
    """One collective as one rank issued it."""

    op: str
    #: The group in words ("the default group", "the group of ranks 0, 1").
    group: str
    #: Its number on that group within the test (1 is the test's first).
    number: int
    done: bool
    tensors: str
    #: The group's members where the rank's dump lists them; () where it does not.
    members: tuple[int, ...] = ()
    #: The group's identity: the recorder's process-group name, the same on every member.
    key: str = ""
    #: When the rank issued it (its wall clock, ns) and its group's timeout (ms; 0: unknown).
    created_ns: int = 0
    timeout_ms: int = 0
    #: On one of the plugin's twin groups: part of a check across ranks, not the test's own.
    check: bool = False
    #: The recorder's ``collective_seq_id`` (the same on every member for the same collective;
    #: 0: not recorded).
    seq: int = 0

    def what(self) -> str:
        """The collective in words: ``all_reduce #2 on the default group``, or for a check's
        ``a check across ranks (assert_*_across_ranks; its all_gather #1 on ...)``."""
        if self.check:
            return f"a check across ranks ({CHECK_CALLS}; its {self._slot()})"
        return self._slot()

    def _slot(self) -> str:
        number = self.number if self.number > 0 else "?"
        return f"{self.op} #{number} on {self.group}"


#: The checks across ranks, in words.
CHECK_CALLS = "assert_*_across_ranks"


def reaches_back(dump: Mapping[str, Any], since_ns: int) -> bool:
    """The dump holds every record since the test started: the recorder's ring buffer
    (``TORCH_FR_BUFFER_SIZE`` entries, all groups together) drops its oldest records first, so
    it does while it still holds one from before the test, or none was ever dropped (its
    oldest record id is 0; unknown ids count as none dropped)."""
    entries = dump.get("entries") or []
    if not entries:
        return True
    oldest = min(int(e.get("record_id", -1)) for e in entries)
    return oldest <= 0 or any(int(e.get("time_created_ns") or 0) < since_ns for e in entries)


def calls_of(dump: Mapping[str, Any], since_ns: int) -> list[Call]:
    """The collectives (not point-to-point ops) a rank issued since the test started.

    Numbered per group by counting where :func:`reaches_back`; otherwise (the test's first
    records were overwritten) the number is 0, unknown, until :func:`renumber` gives it from
    the sequence ids of a rank whose dump reaches back."""
    complete = reaches_back(dump, since_ns)
    groups = _group_names(dump)
    configs = {
        str(name): config
        for name, config in (dump.get("pg_config") or {}).items()
        if isinstance(config, Mapping)
    }
    counts: dict[str, int] = {}
    out: list[Call] = []
    for entry in dump.get("entries", []):
        created = int(entry.get("time_created_ns") or 0)
        if entry.get("is_p2p") or created < since_ns:
            continue
        key = str((entry.get("process_group") or ("?",))[0])
        counts[key] = counts.get(key, 0) + 1
        config = configs.get(key, {})
        out.append(
            Call(
                op=str(entry.get("profiling_name", "?")).split(":")[-1],
                group=groups.get(key, f"group {key!r}"),
                number=counts[key] if complete else 0,
                done=bool(entry.get("retired")),
                tensors=_tensors(entry.get("input_dtypes"), entry.get("input_sizes")),
                members=tuple(_members(config.get("ranks")) or ()),
                key=key,
                created_ns=created,
                timeout_ms=int(entry.get("timeout_ms") or 0),
                check=config.get("owner") == CHECK_OWNER,
                seq=int(entry.get("collective_seq_id") or 0),
            )
        )
    return out


def renumber(calls: Mapping[int, list[Call]]) -> dict[int, list[Call]]:
    """Every rank's calls, those of unknown number (0: :func:`calls_of`) numbered by their
    sequence id relative to their group's value at the test's start, which a rank whose dump
    reaches back gives (its numbered calls: sequence id minus number). A group no such rank
    issued a call on in the test keeps its calls unknown (0): it proves nothing."""
    bases: dict[str, set[int]] = {}
    for rank_calls in calls.values():
        for c in rank_calls:
            if c.number > 0 and c.seq > 0:
                bases.setdefault(c.key, set()).add(c.seq - c.number)
    known = {key: next(iter(b)) for key, b in bases.items() if len(b) == 1}
    return {
        rank: [
            dataclasses.replace(c, number=c.seq - known[c.key])
            if c.number == 0 and c.key in known and c.seq > known[c.key]
            else c
            for c in rank_calls
        ]
        for rank, rank_calls in calls.items()
    }


def group_of_ranks(ranks: Sequence[int]) -> str:
    """A subgroup in words, by its members: ``the group of ranks 0, 1``."""
    return f"the group of {ranks_words(sorted(ranks))}"


def _group_names(dump: Mapping[str, Any]) -> dict[str, str]:
    """Group name -> words: "the default group" or "the group of ranks 0, 2" (its members, as
    the recorder's ``pg_config`` lists them: "[0, 2]"); a group the dump lists no members of
    keeps its name: "group '1'"."""
    names: dict[str, str] = {}
    for entry in dump.get("entries", []):
        name, desc = [*(entry.get("process_group") or ("?",)), ""][:2]
        if desc == "default_pg":
            names[str(name)] = "the default group"
    for name, config in (dump.get("pg_config") or {}).items():
        members = _members(config.get("ranks")) if isinstance(config, Mapping) else None
        if name and str(name) not in names and members:
            names[str(name)] = group_of_ranks(members)
    return names


def _members(raw: Any) -> list[int] | None:
    """The ranks of a ``pg_config`` entry ("[0, 1]", or a list), None where it lists none."""
    text = raw if isinstance(raw, str) else ",".join(str(r) for r in raw or ())
    try:
        members = [int(r) for r in text.strip("[] ").split(",") if r.strip()]
    except ValueError:
        return None
    return members or None


def _tensors(dtypes: Any, sizes: Any) -> str:
    pairs = zip(list(dtypes or []), list(sizes or []), strict=False)
    words = [f"{DTYPES.get(str(d), str(d))}{list(s)}" for d, s in pairs]
    return ", ".join(words)
