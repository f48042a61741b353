"""Which collective each rank is in, and who is out of step: a hang explained at that level.

Runs where a test's outcome is decided (the controller in pool mode, rank 0 of a launched
world), over what the ranks' flight recorders hold when a test hangs (PyTorch's flight-recorder
dump: per collective the op, the group, its sequence number, input shapes and dtypes, and whether
it completed; without the Python frames, whose symbolization takes seconds: the rank's stack says
where it entered). Pure logic over those records: stdlib only, no torch.

The records travel as JSON in both modes (:mod:`frjson`: :func:`dump` writes the fields read
here, :func:`load` reads them back as plain checked data, never unpickled).

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

A verdict (:class:`Verdict`) also says whom it blames (the root cause of the report:
:mod:`rootcause`) and whether the records prove the test can never finish (the early end of
:mod:`pool.deadlock`): never a guess, only records of the group's members, with the ranks that
finished the test or died.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from .frjson import dump as dump
from .frjson import load as load
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


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Who is out of step in a hung test, and whether the records prove it can never finish."""

    #: The line under the summary ("collectives: ..."); "" when nothing is found.
    text: str = ""
    #: The ranks it blames: the member that never came, the minority of a mismatch, both sides
    #: of a mismatch with no majority. () when it blames none.
    root: tuple[int, ...] = ()
    #: The root ranks in words ("rank 2/4", "ranks 0, 1 of 2").
    subject: str = ""
    #: What they did, following :attr:`subject`: "never entered all_reduce #2 on the default
    #: group (ranks 0, 1, 3 wait in it)".
    predicate: str = ""
    #: Per rank left waiting for the root: "waited in all_reduce #2 on the default group for
    #: rank 2" (collateral, not a failure of its own).
    waited: Mapping[int, str] = dataclasses.field(default_factory=dict)
    #: The records prove the state can never complete (never a guess: :func:`_missing`,
    #: :func:`_disagreement`), provided the ranks in :attr:`blocked` really are inside the
    #: collective (their stacks say so: the records alone cannot tell an async op left pending).
    proven: bool = False
    blocked: tuple[int, ...] = ()

    @property
    def cause(self) -> str:
        """The root cause in words ("rank 2/4 never entered ..."), "" when none is blamed."""
        return f"{self.subject} {self.predicate}" if self.root else ""


@dataclasses.dataclass
class Story:
    """What the flight recorders say about one hung test."""

    #: Per rank waiting in a collective: "in all_reduce #2 on the default group (float32[4])".
    lines: dict[int, str]
    #: The verdict (mismatch, shape mismatch, missing rank); its text is "" when none is found.
    verdict: Verdict


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
    *,
    finished: Collection[int] = (),
    lost: Collection[int] = (),
    world_size: int = 0,
) -> Story | None:
    """Each rank's collective and the verdict; None when no rank has records to read.

    ``since_ns``: when the test began (wall clock, ns), one for all ranks or per rank (ranks on
    other machines have clocks of their own). ``where``: per rank, where its stack says it is
    ("blocked in sleep at test_x.py:40, ..."), named for a rank that never entered the
    collective its peers wait in. ``finished``: the ranks whose last reports for the test
    arrived; ``lost``: the ranks that died. Only with them can a verdict be proven (a rank that
    finished without entering a collective never will). ``world_size`` labels the blamed ranks
    ("rank 2/4"); 0 leaves the size out.
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
    facts = _Facts(calls, where or {}, frozenset(finished), frozenset(lost), world_size)
    return Story({rank: line for rank, line in lines.items() if line}, _verdict(facts))


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
    for peer, records in dumps.items():
        calls = calls_of(records, since_ns) if records is not None and peer != rank else []
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


#: Ops whose every rank must pass tensors of the same shape and dtype: a difference between two
#: ranks in the same slot can never complete. Others legitimately differ by rank
#: (``all_to_all`` with splits, ``gather``/``scatter`` at the root, point-to-point), so their
#: shapes are never called a mismatch.
SAME_SHAPES = frozenset(
    {
        "all_reduce",
        "allreduce",
        "allreduce_coalesced",
        "all_reduce_coalesced",
        "broadcast",
        "reduce",
        "all_gather",
        "allgather",
        "_allgather_base",
        "all_gather_into_tensor",
        "allgather_into_tensor_coalesced",
        "reduce_scatter",
        "_reduce_scatter_base",
        "reduce_scatter_tensor",
        "reduce_scatter_tensor_coalesced",
    }
)


@dataclasses.dataclass(frozen=True)
class _Facts:
    calls: Mapping[int, list[Call]]
    where: Mapping[int, str]
    finished: frozenset[int]
    lost: frozenset[int]
    world_size: int

    def words(self, ranks: Sequence[int]) -> str:
        """``rank 2/4``, ``ranks 0, 1 of 2`` (``rank 2`` without a world size)."""
        text = ranks_words(sorted(ranks))
        if not self.world_size:
            return text
        return f"{text}/{self.world_size}" if len(ranks) == 1 else f"{text} of {self.world_size}"


def _verdict(facts: _Facts) -> Verdict:
    """Ranks that disagree in one slot first (an op mismatch), then members that never came
    (before shapes: uneven shapes are legal for some ops, and a missing rank is the story
    then), then shapes and dtypes where the op needs them equal. A slot's calls are every
    rank's, finished or not: on gloo the ranks with the same size can complete an
    ``all_reduce`` and finish the test, leaving the one with another size waiting alone.

    Ranks waiting in a collective that every other member completed prove nothing: a rank
    descheduled on a loaded machine is silent too, with its peers' data in its socket."""
    waiting = {rank: pending[-1] for rank, cs in facts.calls.items() if (pending := _pending(cs))}
    if not waiting:
        return Verdict()
    by_slot: dict[tuple[str, int], dict[int, Call]] = {}
    for rank, call in waiting.items():
        by_slot.setdefault((call.group, call.number), {})[rank] = call
    slots = {slot: {**_entered(facts, *slot), **waiters} for slot, waiters in by_slot.items()}
    for (group, number), at in sorted(slots.items()):
        ops = _ranks_by(at, lambda c: c.op)
        if len(ops) > 1:
            rest = "; ".join(f"{ranks_words(r)} entered {op} #{number}" for op, r in ops[1:])
            text = f"{rest} while {ranks_words(ops[0][1])} entered {ops[0][0]} #{number} ({group})"
            waiters = by_slot[group, number]
            return _disagreement(facts, waiters, ops, text, f"{{}} #{number}", f" on {group}")
    found = [_missing(facts, slot, at) for slot, at in by_slot.items()]
    missing = [v for v in found if v.text]
    if missing:  # a proven one first, then the one most ranks wait in
        return max(missing, key=lambda v: (v.proven, len(v.waited)))
    for (group, number), at in sorted(slots.items()):
        op = next(iter(at.values())).op
        shapes = _ranks_by(at, lambda c: c.tensors)
        if len(shapes) > 1 and op in SAME_SHAPES:
            text = f"{op} #{number} on {group}: " + ", ".join(
                f"{ranks_words(r)} {t}" for t, r in shapes
            )
            waiters = by_slot[group, number]
            what = f"{op} #{number} with {{}}"
            return _disagreement(facts, waiters, shapes, text, what, f" on {group}")
    return Verdict()


def _entered(facts: _Facts, group: str, number: int) -> dict[int, Call]:
    """Every rank's collective ``#number`` on ``group``, finished or not."""
    out = {}
    for rank, calls in facts.calls.items():
        on_group = [c for c in calls if c.group == group]
        if len(on_group) >= number:
            out[rank] = on_group[number - 1]
    return out


def _group_members(facts: _Facts, call: Call) -> tuple[int, ...]:
    """A group's members: as its records list them; every rank for the default group."""
    if call.members:
        return call.members
    if call.group == "the default group" and facts.world_size:
        return tuple(range(facts.world_size))
    return ()


def _pending(calls: list[Call]) -> list[Call]:
    return [c for c in calls if not c.done]


def _disagreement(
    facts: _Facts,
    waiters: Mapping[int, Call],
    sides: list[tuple[str, list[int]]],
    text: str,
    what: str,
    on: str,
) -> Verdict:
    """Ranks in one slot that entered different ops (or tensors): it can never complete. The
    minority is blamed; with no majority, every side. ``what``: a side's key in words, as a
    format string ("{} #2"); ``on``: the group (" on the default group")."""
    call = next(iter(waiters.values()))
    (key, largest), rest = sides[0], sides[1:]
    blocked = tuple(sorted(r for r in waiters if r not in facts.finished))
    if len(largest) > len(rest[0][1]):
        root = sorted(r for _, ranks in rest for r in ranks)
        majority = f"{ranks_words(largest)} entered {what.format(key)}"
        others = "; ".join(f"{ranks_words(r)} entered {what.format(k)}" for k, r in rest)
        predicate = (
            f"entered {what.format(rest[0][0])} while {majority}{on}"
            if len(rest) == 1
            else f"disagree with the majority ({majority}{on}): {others}"
        )
        waited = {
            r: f"waited in {call.op} #{call.number} on {call.group} for {ranks_words(root)}"
            for r in largest
        }
        return Verdict(text, tuple(root), facts.words(root), predicate, waited, True, blocked)
    root = sorted(r for _, ranks in sides for r in ranks)
    parts = "; ".join(f"{ranks_words(r)} entered {what.format(k)}" for k, r in sides)
    predicate = f"disagree with no majority to tell which side is wrong: {parts}{on}"
    return Verdict(text, tuple(root), facts.words(root), predicate, {}, True, blocked)


def _missing(facts: _Facts, slot: tuple[str, int], at: Mapping[int, Call]) -> Verdict:
    """Ranks wait in a collective that members never entered. Proven when every such member
    finished the test (its records say it never entered it) or died: it never will."""
    group, number = slot
    call = next(iter(at.values()))
    members = _group_members(facts, call)
    candidates = members or tuple(sorted(facts.calls))  # not listed: whoever has records
    absent, said = [], []
    for rank in sorted(candidates):
        if rank in at:
            continue
        if rank in facts.lost and rank not in facts.calls:
            absent.append(rank)
            said.append(f"{ranks_words([rank])} never entered it: it died")
            continue
        if rank not in facts.calls:
            continue  # no records: nothing known of it
        on_group = [c for c in facts.calls[rank] if c.group == group]
        if len(on_group) >= number:
            continue
        last = on_group[-1] if on_group else None
        after = f" (after {last.op} #{last.number})" if last else ""
        if rank in facts.finished:
            at_line = ": it left the test"
        elif rank in facts.lost:
            at_line = ": it died"
        else:
            at_line = f": it is {facts.where[rank]}" if facts.where.get(rank) else ""
        absent.append(rank)
        said.append(f"{ranks_words([rank])} never entered it{at_line}{after}")
    if not absent:
        return Verdict()
    waiting = ranks_words(sorted(at))
    verb = "waits" if len(at) == 1 else "wait"
    text = f"{waiting} {verb} in {call.op} #{number} on {group}; " + "; ".join(said)
    # Every member that is not waiting must be accounted for, and each of them gone for good.
    others = [r for r in members if r not in at]
    proven = bool(members) and all(
        r in facts.lost or (r in facts.finished and r in absent) for r in others
    )
    blocked = tuple(sorted(r for r in at if r not in facts.finished))
    predicate = f"never entered {call.op} #{number} on {group} ({waiting} {verb} in it)"
    waited = {r: f"waited in {call.op} #{number} on {group} for {ranks_words(absent)}" for r in at}
    return Verdict(
        text,
        tuple(absent),
        facts.words(absent),
        predicate,
        waited,
        proven and bool(blocked),
        blocked,
    )


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
