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
count. They are numbered and compared per group identity, the recorder's process-group name
(:mod:`frcalls`), never per member list: two groups of the same ranks have numberings of their
own. Completion is read from ``retired`` (on gloo ``state`` stays ``scheduled``). The verdict is
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
:mod:`pool.deadlock` and :mod:`launch.deadwatch`): never a guess, only records of the group's
members, with the ranks that finished the test or died. One member that finished or died
without entering proves it, whatever the others did; a waited collective whose group timeout
falls before the test's deadline proves nothing until well past that timeout (the test may
expect the error). The rules are properties in ``tests/unit/test_deadlock_properties.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from .frcalls import DTYPES as DTYPES
from .frcalls import Call as Call
from .frcalls import calls_of as calls_of
from .frcalls import group_of_ranks as group_of_ranks
from .frcalls import reaches_back, renumber
from .frjson import dump as dump
from .frjson import load as load
from .merge import ranks_words

#: How long past its group's timeout a rank must still be inside a collective before the
#: timeout no longer counts as a way out (ns): gloo raises within milliseconds of it.
TIMEOUT_MARGIN_NS = 2_000_000_000


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
    #: The ranks of :attr:`blocked` none of whose pending collectives can ever complete: one
    #: standing still in ``Work.wait()`` or in the autograd engine (which waits on one of them,
    #: no record says which) is stuck too.
    stuck: tuple[int, ...] = ()

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


def explain(
    dumps: Mapping[int, Mapping[str, Any] | None],
    since_ns: int | Mapping[int, int],
    where: Mapping[int, str] | None = None,
    *,
    finished: Collection[int] = (),
    lost: Collection[int] = (),
    world_size: int = 0,
    timeout_s: float | None = None,
) -> Story | None:
    """Each rank's collective and the verdict; None when no rank has records to read.

    ``since_ns``: when the test began (wall clock, ns), one for all ranks or per rank (ranks on
    other machines have clocks of their own). ``where``: per rank, where its stack says it is
    ("blocked in sleep at test_x.py:40, ..."), named for a rank that never entered the
    collective its peers wait in. ``finished``: the ranks whose last reports for the test
    arrived; ``lost``: the ranks that died. Only with them can a verdict be proven (a rank that
    finished without entering a collective never will). ``world_size`` labels the blamed ranks
    ("rank 2/4"); 0 leaves the size out. ``timeout_s``: the test's deadline from its start
    (None: none), which a group's own timeout may come before (:func:`_way_out`).
    """
    starts = since_ns if isinstance(since_ns, Mapping) else dict.fromkeys(dumps, since_ns)
    calls = renumber(
        {
            rank: calls_of(dump, starts.get(rank, 0))
            for rank, dump in dumps.items()
            if dump is not None
        }
    )
    partial = frozenset(
        rank
        for rank, dump in dumps.items()
        if dump is not None and not reaches_back(dump, starts.get(rank, 0))
    )
    if not calls:
        return None
    lines = {rank: _line(rank_calls) for rank, rank_calls in calls.items()}
    deadlines = (
        {}
        if timeout_s is None
        else {rank: starts.get(rank, 0) + int(timeout_s * 1e9) for rank in calls}
    )
    dumped = {rank: int(dump.get("dumped_ns") or 0) for rank, dump in dumps.items() if dump}
    facts = _Facts(
        calls,
        where or {},
        frozenset(finished),
        frozenset(lost),
        world_size,
        deadlines,
        dumped,
        partial,
    )
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
    return f"in {call.what()}{tensors}"


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
    #: Per rank, the test's deadline on its clock (ns); empty: the test has none.
    deadlines: Mapping[int, int] = dataclasses.field(default_factory=dict)
    #: Per rank, when its records were taken, on its clock (ns; 0: unknown).
    dumped: Mapping[int, int] = dataclasses.field(default_factory=dict)
    #: The ranks whose records no longer reach back to the test's start (the ring buffer
    #: overwrote its first records): a group none of whose calls there could be numbered says
    #: nothing of them.
    partial: frozenset[int] = frozenset()

    def words(self, ranks: Sequence[int]) -> str:
        """``rank 2/4``, ``ranks 0, 1 of 2`` (``rank 2`` without a world size)."""
        text = ranks_words(sorted(ranks))
        if not self.world_size:
            return text
        return f"{text}/{self.world_size}" if len(ranks) == 1 else f"{text} of {self.world_size}"

    def count(self, rank: int, key: str) -> int | None:
        """How many collectives ``rank`` issued on the group ``key`` in the test (its last
        one's number); None when unknown (its records were overwritten: :attr:`partial`)."""
        numbers = [c.number for c in self.calls.get(rank, ()) if c.key == key]
        if rank in self.partial and not any(n > 0 for n in numbers):
            return None
        return max(numbers, default=0)

    def gone_without(self, rank: int, key: str, number: int) -> bool:
        """``rank`` finished the test or died without entering collective ``#number`` of
        ``key``: it never will."""
        if rank in self.lost and rank not in self.calls:
            return True
        count = self.count(rank, key)
        left = rank in self.lost or (rank in self.finished and rank in self.calls)
        return left and count is not None and count < number


#: A collective's place: its group's identity (the recorder's name) and its number there.
Slot = tuple[str, int]


def _verdict(facts: _Facts) -> Verdict:
    """Ranks that disagree in one slot first (an op mismatch), then members that never came
    (before shapes: uneven shapes are legal for some ops, and a missing rank is the story
    then), then shapes and dtypes where the op needs them equal. A slot's calls are every
    rank's, finished or not: on gloo the ranks with the same size can complete an
    ``all_reduce`` and finish the test, leaving the one with another size waiting alone.

    Ranks waiting in a collective that every other member completed prove nothing: a rank
    descheduled on a loaded machine is silent too, with its peers' data in its socket. Slots are
    looked at in an order that does not depend on the groups' names (their words, numbers and
    ranks), so that renaming groups never changes a verdict."""
    waiting = {
        rank: pending[-1]
        for rank, cs in facts.calls.items()
        if (pending := _pending(cs)) and pending[-1].number > 0  # 0: unknown, proves nothing
    }
    if not waiting:
        return Verdict()
    by_slot: dict[Slot, dict[int, Call]] = {}
    for rank, call in waiting.items():
        by_slot.setdefault((call.key, call.number), {})[rank] = call
    slots = {slot: {**_entered(facts, *slot), **waiters} for slot, waiters in by_slot.items()}
    order = sorted(slots, key=lambda slot: _slot_order(slots[slot]))
    return _settled(facts, _first_found(facts, order, slots, by_slot))


def _first_found(
    facts: _Facts,
    order: list[Slot],
    slots: Mapping[Slot, Mapping[int, Call]],
    by_slot: Mapping[Slot, Mapping[int, Call]],
) -> Verdict:
    for slot in order:
        at = slots[slot]
        ops = _ranks_by(at, lambda c: c.op)
        if len(ops) > 1:
            number, group = slot[1], next(iter(at.values())).group
            rest = "; ".join(f"{ranks_words(r)} entered {op} #{number}" for op, r in ops[1:])
            text = f"{rest} while {ranks_words(ops[0][1])} entered {ops[0][0]} #{number} ({group})"
            return _disagreement(facts, by_slot[slot], ops, text, f"{{}} #{number}", f" on {group}")
    found = [_missing(facts, slot, by_slot[slot]) for slot in order]
    missing = [v for v in found if v.text]
    if missing:  # a proven one first, then the one most ranks wait in
        return max(missing, key=lambda v: (v.proven, len(v.waited)))
    for slot in order:
        at = slots[slot]
        call = next(iter(at.values()))
        shapes = _ranks_by(at, lambda c: c.tensors)
        if len(shapes) > 1 and call.op in SAME_SHAPES:
            on = f"{call.op} #{call.number} on {call.group}"
            text = f"{on}: " + ", ".join(f"{ranks_words(r)} {t}" for t, r in shapes)
            what = f"{call.op} #{call.number} with {{}}"
            return _disagreement(facts, by_slot[slot], shapes, text, what, f" on {call.group}")
    return Verdict()


def _slot_order(at: Mapping[int, Call]) -> tuple[object, ...]:
    """A slot's place among the slots, from what it holds, never from its group's name."""
    call = next(iter(at.values()))
    held = tuple((rank, at[rank].op, at[rank].tensors) for rank in sorted(at))
    return (call.group, call.number, call.members, held)


def _settled(facts: _Facts, verdict: Verdict) -> Verdict:
    """A verdict with its proof weighed against the groups' timeouts: a blocked rank whose
    collective may yet time out (an error the test may catch: a test of that timeout) before
    the test's deadline proves nothing until it is still inside well past it. And which blocked
    ranks are stuck whatever they wait on (every collective they left pending is hopeless)."""
    if not verdict.text:
        return verdict
    pending = {rank: _pending(facts.calls.get(rank, [])) for rank in verdict.blocked}
    out = any(_way_out(facts, rank, calls[-1]) for rank, calls in pending.items() if calls)
    stuck = tuple(
        rank
        for rank, calls in pending.items()
        if calls and all(_hopeless(facts, rank, call) for call in calls)
    )
    return dataclasses.replace(verdict, proven=verdict.proven and not out, stuck=stuck)


def _way_out(facts: _Facts, rank: int, call: Call) -> bool:
    """``call``'s group timeout may still end it on ``rank`` before the test's deadline: it
    falls before the deadline (or the test has none), and the rank's records were taken before
    the timeout and :data:`TIMEOUT_MARGIN_NS` had passed. Unknown timeouts count as none."""
    if call.timeout_ms <= 0:
        return False
    ends = call.created_ns + call.timeout_ms * 1_000_000
    deadline = facts.deadlines.get(rank)
    if deadline is not None and ends >= deadline:
        return False
    return facts.dumped.get(rank, 0) < ends + TIMEOUT_MARGIN_NS


def _hopeless(facts: _Facts, rank: int, call: Call) -> bool:
    """``call`` can never complete on ``rank``: its slot holds other ops (or other tensors
    where the op needs them equal), or a member finished or died without entering it; and no
    timeout of its group may end it first."""
    if _way_out(facts, rank, call):
        return False
    at = _entered(facts, call.key, call.number)
    if len({c.op for c in at.values()}) > 1:
        return True
    if call.op in SAME_SHAPES and len({c.tensors for c in at.values()}) > 1:
        return True
    members = _group_members(facts, call)
    return any(r not in at and facts.gone_without(r, call.key, call.number) for r in members)


def _entered(facts: _Facts, key: str, number: int) -> dict[int, Call]:
    """Every rank's collective ``#number`` on the group ``key``, finished or not."""
    out = {}
    for rank, calls in facts.calls.items():
        for call in calls:
            if call.key == key and call.number == number:
                out[rank] = call
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
        waited = {r: f"waited in {call.what()} for {ranks_words(root)}" for r in largest}
        return Verdict(text, tuple(root), facts.words(root), predicate, waited, True, blocked)
    root = sorted(r for _, ranks in sides for r in ranks)
    parts = "; ".join(f"{ranks_words(r)} entered {what.format(k)}" for k, r in sides)
    predicate = f"disagree with no majority to tell which side is wrong: {parts}{on}"
    return Verdict(text, tuple(root), facts.words(root), predicate, {}, True, blocked)


def _missing(facts: _Facts, slot: Slot, at: Mapping[int, Call]) -> Verdict:
    """Ranks wait in a collective that members never entered. Proven when one such member
    finished the test (its records say it never entered it) or died: it never will, whatever
    the other members did (on gloo some complete their part of a broadcast and leave)."""
    key, number = slot
    call = next(iter(at.values()))
    members = _group_members(facts, call)
    candidates = members or tuple(sorted(facts.calls))  # not listed: whoever has records
    absent, gone, said = [], [], []
    for rank in sorted(candidates):
        if rank in at or (rank not in facts.calls and rank not in facts.lost):
            continue  # waiting in it, or no records: nothing known of it
        count = facts.count(rank, key) if rank in facts.calls else 0
        if count is None or count >= number:
            continue  # entered it, or its records no longer say
        on_group = [c for c in facts.calls.get(rank, []) if c.key == key]
        last = on_group[-1] if on_group else None
        after = f" (after {last.op} #{last.number})" if last else ""
        if rank in facts.finished:
            at_line = ": it left the test"
        elif rank in facts.lost:
            at_line = ": it died"
        else:
            at_line = f": it is {facts.where[rank]}" if facts.where.get(rank) else ""
        absent.append(rank)
        if members and facts.gone_without(rank, key, number):
            gone.append(rank)
        said.append(f"{ranks_words([rank])} never entered it{at_line}{after}")
    if not absent:
        return Verdict()
    root = gone or absent  # the members that never will come, where any is known
    waiting = ranks_words(sorted(at))
    verb = "waits" if len(at) == 1 else "wait"
    text = f"{waiting} {verb} in {call.what()}; " + "; ".join(said)
    blocked = tuple(sorted(r for r in at if r not in facts.finished))
    predicate = f"never entered {call.what()} ({waiting} {verb} in it)"
    waited = {r: f"waited in {call.what()} for {ranks_words(root)}" for r in at}
    proven = bool(gone) and bool(blocked)
    return Verdict(text, tuple(root), facts.words(root), predicate, waited, proven, blocked)


def _ranks_by(at: Mapping[int, Call], key: Callable[[Call], str]) -> list[tuple[str, list[int]]]:
    """``at`` grouped by ``key(call)``, the largest group first."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(at):
        groups.setdefault(key(at[rank]), []).append(rank)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1]))
