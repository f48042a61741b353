"""Which collective each rank is in, and who is out of step: a hang explained at that level.

Runs where a test's outcome is decided (the controller in pool mode), over what the ranks' flight
recorders hold when a test hangs (PyTorch's flight-recorder dump: per collective the op, the group,
its sequence number, input shapes and dtypes, and whether it completed; without the Python frames,
whose symbolization takes seconds: the rank's stack says where it entered). Pure logic over those
records: stdlib only, no torch.

The records travel as JSON in both modes (a file beside the rank's log in pool mode, the control
store in launcher mode): :func:`dump` writes the fields read here, :func:`load` reads them back
(or torch's own JSON dump) as plain checked data. Nothing here unpickles: in launcher mode the
bytes come from the network.

Collectives are numbered from the test's start (``#1`` is the first the test issued on that
group), since a warm pool's groups outlive tests: only records created after the test was sent
count. Completion is read from ``retired`` (on gloo ``state`` stays ``scheduled``). The verdict is
one line a person reads first:

- mismatch: ``rank 1 entered broadcast #2 while rank 0 entered all_reduce #2 (the default group)``;
- shape or dtype mismatch: ``all_reduce #2 on the default group: rank 0 float32[4], rank 1
  float32[8]``;
- missing rank: ``ranks 0, 1 wait in all_reduce #2 on the default group; rank 2 never entered it
  (after all_reduce #1)``;
- a crash inside a collective (:func:`crash_verdict`; gloo aborts a rank whose peer sends another
  size, with no message): ``rank 0 crashed (SIGABRT) inside all_reduce, called from test_x at
  test_x.py:10; rank 1 was in all_reduce #2 on the default group (float32[8]): ...``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
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


@dataclasses.dataclass(frozen=True)
class Call:
    """One collective as one rank issued it."""

    op: str
    group: str
    #: Its number on that group within the test (1 is the test's first).
    number: int
    done: bool
    tensors: str
    #: The group's members where the rank's dump lists them; () where it does not.
    members: tuple[int, ...] = ()


@dataclasses.dataclass
class Story:
    """What the flight recorders say about one hung test."""

    #: Per rank waiting in a collective: "in all_reduce #2 on the default group (float32[4])".
    lines: dict[int, str]
    #: The verdict (mismatch, shape mismatch, missing rank), or "" when none is found.
    verdict: str


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
            str(name): {"ranks": str(config.get("ranks", "?"))}
            for name, config in configs.items()
            if isinstance(config, dict)
        }
        if isinstance(configs, dict)
        else {},
    }


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
        "is_p2p": entry.get("is_p2p") is True,
        "retired": entry.get("retired") is True,
        "input_dtypes": [str(d) for d in dtypes] if isinstance(dtypes, list) else [],
        "input_sizes": [[_int(n, 0) for n in size] for size in sizes if isinstance(size, list)]
        if isinstance(sizes, list)
        else [],
    }


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def calls_of(dump: Mapping[str, Any], since_ns: int) -> list[Call]:
    """The collectives (not point-to-point ops) a rank issued since the test started."""
    groups = _group_names(dump)
    members = {
        str(name): tuple(_members(config.get("ranks")) or ())
        for name, config in (dump.get("pg_config") or {}).items()
        if isinstance(config, Mapping)
    }
    counts: dict[str, int] = {}
    out: list[Call] = []
    for entry in dump.get("entries", []):
        if entry.get("is_p2p") or int(entry.get("time_created_ns") or 0) < since_ns:
            continue
        key = str((entry.get("process_group") or ("?",))[0])
        counts[key] = counts.get(key, 0) + 1
        out.append(
            Call(
                op=str(entry.get("profiling_name", "?")).split(":")[-1],
                group=groups.get(key, f"group {key!r}"),
                number=counts[key],
                done=bool(entry.get("retired")),
                tensors=_tensors(entry.get("input_dtypes"), entry.get("input_sizes")),
                members=members.get(key, ()),
            )
        )
    return out


def explain(
    dumps: Mapping[int, Mapping[str, Any] | None],
    since_ns: int | Mapping[int, int],
    where: Mapping[int, str] | None = None,
) -> Story | None:
    """Each rank's collective and the verdict; None when no rank has records to read.

    ``since_ns``: when the test began (wall clock, ns), one for all ranks or per rank (ranks on
    other machines have clocks of their own). ``where``: per rank, where its stack says it is
    ("blocked in sleep at test_x.py:40, ..."), named for a rank that never entered the
    collective its peers wait in.
    """
    starts = since_ns if isinstance(since_ns, Mapping) else dict.fromkeys(dumps, since_ns)
    calls = {
        rank: calls_of(dump, starts.get(rank, 0))
        for rank, dump in dumps.items()
        if dump is not None
    }
    if not calls:
        return None
    lines = {rank: _line(rank_calls) for rank, rank_calls in calls.items()}
    return Story({rank: line for rank, line in lines.items() if line}, _verdict(calls, where or {}))


def crash_verdict(
    rank: int,
    status: str,
    entered: str,
    dumps: Mapping[int, Mapping[str, Any] | None],
    since_ns: int,
    gloo: bool,
) -> str:
    """A rank died inside a collective (``entered``: "all_reduce, called from test_x at
    test_x.py:10"): what its peers' recorders say they were in, as one verdict line.

    The dead rank's own records died with it; its stack names the collective. On gloo a rank
    that receives a different size than it passed aborts (SIGABRT) without a message, so the
    line says so: comparing what each rank passed is the next step.
    """
    op = entered.split(",")[0]
    peers: dict[int, Call] = {}
    for peer, dump in dumps.items():
        calls = calls_of(dump, since_ns) if dump is not None and peer != rank else []
        same = [c for c in calls if c.op == op] or calls
        if same:
            peers[peer] = same[-1]
    text = f"rank {rank} crashed ({status}) inside {entered}"
    if peers:
        described = _ranks_by(
            peers,
            lambda c: f"{c.op} #{c.number} on {c.group}" + (f" ({c.tensors})" if c.tensors else ""),
        )
        text += "; " + "; ".join(
            f"{ranks_words(ranks)} {'was' if len(ranks) == 1 else 'were'} in {what}"
            for what, ranks in described
        )
    if gloo:
        text += (
            f": gloo aborts a rank that receives a different size than it passed, so compare "
            f"the tensors (shape, dtype) each rank passes to this {op}"
        )
    return text


def _line(calls: list[Call]) -> str:
    """The collective a rank waits in, or "" (its stack alone then says where it is)."""
    pending = [c for c in calls if not c.done]
    if not pending:
        return ""
    call = pending[-1]
    tensors = f" ({call.tensors})" if call.tensors else ""
    return f"in {call.op} #{call.number} on {call.group}{tensors}"


def _verdict(calls: Mapping[int, list[Call]], where: Mapping[int, str]) -> str:
    pending = {rank: [c for c in cs if not c.done] for rank, cs in calls.items()}
    waiting = {rank: cs[-1] for rank, cs in pending.items() if cs}
    if not waiting:
        return ""
    # Ranks inside the same group's n-th collective must agree on its op and tensors.
    by_slot: dict[tuple[str, int], dict[int, Call]] = {}
    for rank, call in waiting.items():
        by_slot.setdefault((call.group, call.number), {})[rank] = call
    for (group, number), at in sorted(by_slot.items()):
        ops = _ranks_by(at, lambda c: c.op)
        if len(ops) > 1:
            (first_op, first), *others = ops
            rest = "; ".join(f"{ranks_words(r)} entered {op} #{number}" for op, r in others)
            return f"{rest} while {ranks_words(first)} entered {first_op} #{number} ({group})"
        shapes = _ranks_by(at, lambda c: c.tensors)
        if len(shapes) > 1:
            parts = ", ".join(f"{ranks_words(r)} {t}" for t, r in shapes)
            return f"{ops[0][0]} #{number} on {group}: {parts}"
    # Ranks waiting in a collective that a member never entered.
    (group, number), at = max(by_slot.items(), key=lambda kv: len(kv[1]))
    call = next(iter(at.values()))
    absent = []
    for rank in sorted(calls):
        if rank in at or (call.members and rank not in call.members):
            continue  # waiting, or not a member: a rank outside the group never enters it
        on_group = [c for c in calls[rank] if c.group == group]
        if len(on_group) < number:
            last = on_group[-1] if on_group else None
            after = f" (after {last.op} #{last.number})" if last else ""
            at_line = f": it is {where[rank]}" if where.get(rank) else ""
            absent.append(f"{ranks_words([rank])} never entered it{at_line}{after}")
    if absent:
        verb = "waits" if len(at) == 1 else "wait"
        waiting_ranks = ranks_words(sorted(at))
        return f"{waiting_ranks} {verb} in {call.op} #{number} on {group}; " + "; ".join(absent)
    return ""


def _ranks_by(at: Mapping[int, Call], key: Callable[[Call], str]) -> list[tuple[str, list[int]]]:
    """``at`` grouped by ``key(call)``, the largest group first."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(at):
        groups.setdefault(key(at[rank]), []).append(rank)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1]))


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
