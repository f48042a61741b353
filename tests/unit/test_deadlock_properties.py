"""Properties of the deadlock proof (``outcome/collectives.py``), over generated programs.

A program: a world of 2-4 ranks, groups over them (several with the same members, the default
group among them), and per group one sequence of collectives that every member issues in that
order; each rank interleaves its groups' sequences in an order of its own, some ops async
(waited at the end of the rank's test). An execution runs the ranks one step at a time in an
order drawn by Hypothesis, one rank slow (it moves only when no other can). A collective
completes on a rank when every member entered it (a gloo broadcast: on its root at once, on the
others once the root entered). The records of a state are what the flight recorders would
hold: per rank, its collectives in issue order, each with its group's name and whether it
completed there; the ranks that finished the test; the stacks (inside a collective, or in
``Work.wait()`` at the end).

Rules:

1. No state reachable by an execution that completes is judged "can never finish" (the proof
   holds and every rank it says waits is accepted as waiting).
2. A state where a member finished the test without entering a collective a peer is blocked in
   is judged a hang, naming that member, the peer among the blocked.
3. Verdicts do not change when groups are renamed (groups of the same members included): only
   the recorder's names change, never the calls.
4. No state whose waited collectives are on groups with a timeout before the test's deadline
   ends early before that timeout (and its margin) passed: the timeout ends the collective
   with an error the test may catch.

Rule 1 also holds when each rank's recorder is a ring buffer of a generated size that dropped
its oldest records (before the test's or the test's own), its groups' sequence ids starting
anywhere: collectives are matched across ranks by sequence id, and a group no rank's records
reach back for proves nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from pytest_distrank.outcome.collectives import Verdict, explain

START = 1_000
STEP = 1_000  # ns between two steps of an execution
TIMEOUT_MS = 1_800_000  # torch's default: after the test's deadline


@dataclasses.dataclass(frozen=True)
class Event:
    """One collective of the program: its group (index), op, and the broadcast's root."""

    group: int
    op: str
    root: int


@dataclasses.dataclass
class Program:
    world: int
    groups: list[tuple[int, ...]]  # members; groups[0] is the default group
    events: list[Event]
    #: Per rank: (event index, async) in the rank's issue order.
    order: dict[int, list[tuple[int, bool]]]


@dataclasses.dataclass
class State:
    """Where an execution is: per rank, how far it got, what it entered, what completed."""

    program: Program
    pos: dict[int, int]
    entered: dict[int, list[tuple[int, int]]]  # rank -> [(event, step)] in issue order
    at_end: dict[int, bool] = dataclasses.field(default_factory=dict)

    def done(self, rank: int, event: int) -> bool:
        ev = self.program.events[event]
        members = self.program.groups[ev.group]
        came = {r for r in members if any(e == event for e, _ in self.entered[r])}
        if ev.op == "broadcast":
            return rank in came and ev.root in came  # the root: at once; the others: after it
        return came == set(members)

    def blocked(self, rank: int) -> bool:
        """The rank cannot move: in a sync collective not completed, or at its final wait."""
        steps = self.program.order[rank]
        if self.pos[rank] > 0:
            event, is_async = steps[self.pos[rank] - 1]
            if not is_async and not self.done(rank, event):
                return True
        if self.pos[rank] == len(steps):
            return not self.finished(rank)
        return False

    def finished(self, rank: int) -> bool:
        steps = self.program.order[rank]
        return self.pos[rank] == len(steps) and all(self.done(rank, e) for e, _ in steps)

    def runnable(self) -> list[int]:
        return [
            r
            for r in range(self.program.world)
            if not self.blocked(r) and self.pos[r] < len(self.program.order[r])
        ]

    def step(self, rank: int, now: int) -> None:
        event, _ = self.program.order[rank][self.pos[rank]]
        self.entered[rank].append((event, now))
        self.pos[rank] += 1

    def inside(self, rank: int) -> str:
        """What the rank's stack would say: "call" inside a sync collective, "wait" at its
        final ``Work.wait()``, "" running."""
        steps = self.program.order[rank]
        if self.pos[rank] > 0:
            event, is_async = steps[self.pos[rank] - 1]
            if not is_async and not self.done(rank, event):
                return "call"
        return "wait" if self.blocked(rank) else ""


def names_of(program: Program) -> list[str]:
    return [str(i) for i in range(len(program.groups))]


@dataclasses.dataclass(frozen=True)
class Ring:
    """The recorder of every rank: ``before[rank]`` collectives before the test (on a group of an
    earlier test: ranks hold different numbers of records), each group's sequence ids starting
    after ``bases[g]``, only the last ``size`` records kept (0: all)."""

    size: int = 0
    before: tuple[int, ...] = ()
    bases: tuple[int, ...] = ()


def records(
    state: State, names: list[str], now: int, timeout_ms: int = TIMEOUT_MS, ring: Ring = Ring()
) -> dict[int, dict[str, Any]]:
    program = state.program
    out = {}
    for rank in range(program.world):
        config = {
            names[g]: {"ranks": str(list(members))}
            for g, members in enumerate(program.groups)
            if rank in members
        }
        entries: list[dict[str, Any]] = [
            {
                "profiling_name": "gloo:barrier",
                "process_group": ["earlier", ""],
                "retired": True,
                "time_created_ns": START - 1,
                "collective_seq_id": n + 1,
                "input_sizes": [],
                "input_dtypes": [],
            }
            for n in range(ring.before[rank] if rank < len(ring.before) else 0)
        ]
        seqs = [ring.bases[g] if g < len(ring.bases) else 0 for g in range(len(program.groups))]
        for event, at in state.entered[rank]:
            ev = program.events[event]
            seqs[ev.group] += 1
            entries.append(
                {
                    "collective_seq_id": seqs[ev.group],
                    "profiling_name": f"gloo:{ev.op}",
                    "process_group": [names[ev.group], "default_pg" if ev.group == 0 else ""],
                    "retired": state.done(rank, event),
                    "time_created_ns": at,
                    "timeout_ms": timeout_ms,
                    "input_sizes": [[4]],
                    "input_dtypes": ["Float"],
                }
            )
        for n, record in enumerate(entries):
            record["record_id"] = n
        kept = entries[-ring.size :] if ring.size else entries
        out[rank] = {"entries": kept, "pg_config": config, "dumped_ns": now}
    return out


def judge(
    state: State, names: list[str], now: int, timeout_ms: int = TIMEOUT_MS, ring: Ring = Ring()
) -> Verdict:
    world = state.program.world
    finished = {r for r in range(world) if state.finished(r)}
    dumps = records(state, names, now, timeout_ms, ring)
    story = explain(dumps, START, finished=finished, world_size=world, timeout_s=60.0)
    return Verdict() if story is None else story.verdict


def ends_early(state: State, verdict: Verdict) -> bool:
    """The watch's decision: proven, and every rank said to wait is accepted as waiting."""

    def accepted(rank: int) -> bool:
        inside = state.inside(rank)
        return inside == "call" or (inside == "wait" and rank in verdict.stuck)

    return verdict.proven and bool(verdict.blocked) and all(accepted(r) for r in verdict.blocked)


@st.composite
def programs(draw: st.DrawFn) -> Program:
    world = draw(st.integers(2, 4))
    everyone = tuple(range(world))
    subsets = st.lists(st.sampled_from(everyone), min_size=2, unique=True).map(
        lambda rs: tuple(sorted(rs))
    )
    extra: list[tuple[int, ...]] = draw(st.lists(subsets, max_size=3))
    twice: bool = draw(st.booleans())
    if extra and twice:
        extra.append(extra[0])  # a second group of the same members
    groups = [everyone, *extra]
    events = []
    for _ in range(draw(st.integers(1, 7))):
        g = draw(st.integers(0, len(groups) - 1))
        op = draw(st.sampled_from(["all_reduce", "all_gather", "broadcast", "barrier"]))
        events.append(Event(g, op, draw(st.sampled_from(groups[g]))))
    order = {}
    for rank in everyone:
        mine = [i for i, ev in enumerate(events) if rank in groups[ev.group]]
        # An interleaving of its groups' sequences of its own (each group's order kept).
        keys = draw(st.lists(st.integers(0, 9), min_size=len(mine), max_size=len(mine)))
        shuffled = [i for _, i in sorted(zip(keys, mine, strict=True))]
        per_group = {g: [i for i in mine if events[i].group == g] for g in range(len(groups))}
        fixed = [per_group[events[i].group].pop(0) for i in shuffled]
        order[rank] = [(i, draw(st.booleans())) for i in fixed]
    return Program(world, groups, events, order)


def run(program: Program, data: st.DataObject, slow: int) -> tuple[list[State], State]:
    """One execution: every state it passes through (copies), and where it stops."""
    state = State(
        program,
        dict.fromkeys(range(program.world), 0),
        {r: [] for r in range(program.world)},
    )
    seen: list[State] = []
    now = START
    while True:
        runnable = state.runnable()
        if not runnable:
            return seen, state
        others = [r for r in runnable if r != slow] or runnable
        rank = others[data.draw(st.integers(0, len(others) - 1), label="rank")]
        now += STEP
        state.step(rank, now)
        seen.append(State(program, dict(state.pos), {r: list(e) for r, e in state.entered.items()}))


def completes(state: State) -> bool:
    return all(state.finished(r) for r in range(state.program.world))


@given(programs(), st.data())
def test_no_state_of_an_execution_that_completes_ends_early(
    program: Program, data: st.DataObject
) -> None:
    """Rule 1, with each rank's recorder a ring buffer of a generated size."""
    slow = data.draw(st.integers(0, program.world - 1), label="slow rank")
    seen, last = run(program, data, slow)
    assume(completes(last))
    names = names_of(program)
    ring = Ring(
        data.draw(st.integers(0, 8), label="ring size"),
        tuple(data.draw(st.lists(st.integers(0, 3), max_size=4), label="records before")),
        tuple(data.draw(st.lists(st.integers(0, 5), max_size=4), label="sequence bases")),
    )
    for state in seen:
        verdict = judge(state, names, START + 10**9, ring=ring)
        assert not ends_early(state, verdict), verdict


@given(programs(), st.data())
def test_a_member_that_finished_without_entering_is_named(
    program: Program, data: st.DataObject
) -> None:
    """Rule 2: one rank skips its last collective on one group."""
    rank = data.draw(st.integers(0, program.world - 1), label="skipping rank")
    steps = program.order[rank]
    assume(steps)
    skipped = steps[data.draw(st.integers(0, len(steps) - 1), label="skipped")][0]
    group = program.events[skipped].group
    assume(all(program.events[e].group != group for e, _ in steps if e > skipped))
    program.order[rank] = [s for s in steps if s[0] != skipped]
    slow = data.draw(st.integers(0, program.world - 1), label="slow rank")
    _, last = run(program, data, slow)
    assume(last.finished(rank))
    peers = [
        p
        for p in range(program.world)
        if last.inside(p) == "call" and last.program.order[p][last.pos[p] - 1][0] == skipped
    ]
    assume(peers)
    verdict = judge(last, names_of(program), START + 10**9)
    assert verdict.proven, verdict
    assert rank in verdict.root, verdict
    assert f"rank {rank}" in verdict.cause


@given(programs(), st.data())
def test_verdicts_do_not_depend_on_the_groups_names(program: Program, data: st.DataObject) -> None:
    """Rule 3: any state, failing or not, judged under other names for the groups."""
    if data.draw(st.booleans(), label="skip one"):
        rank = data.draw(st.integers(0, program.world - 1))
        program.order[rank] = program.order[rank][1:]
    _, last = run(program, data, data.draw(st.integers(0, program.world - 1)))
    fresh = data.draw(
        st.lists(
            st.text("abcdef0123456789", min_size=1, max_size=6),
            min_size=len(program.groups) - 1,
            max_size=len(program.groups) - 1,
            unique=True,
        ).filter(lambda names: "0" not in names),
        label="new names",
    )
    now = START + 10**9
    before = judge(last, names_of(program), now)
    after = judge(last, ["0", *fresh], now)
    assert after == before


@given(programs(), st.data())
def test_a_group_timeout_before_the_deadline_is_waited_for(
    program: Program, data: st.DataObject
) -> None:
    """Rule 4: states of failing and completing executions alike (one rank may skip a
    collective), every group with a 6 s timeout, the records taken before it passed (and its
    2 s margin): none ends early; long after, the same states are judged as without timeouts."""
    if data.draw(st.booleans(), label="skip one"):
        rank = data.draw(st.integers(0, program.world - 1))
        steps = program.order[rank]
        if steps:
            del steps[data.draw(st.integers(0, len(steps) - 1))]
    _, last = run(program, data, data.draw(st.integers(0, program.world - 1)))
    names = names_of(program)
    early = START + data.draw(st.integers(0, 7), label="seconds in") * 10**9
    assert not ends_early(last, judge(last, names, early, timeout_ms=6_000))
    late = START + 20 * 10**9
    assert judge(last, names, late, timeout_ms=6_000) == judge(last, names, late)
