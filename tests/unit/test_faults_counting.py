"""Properties of the fault kit's counting and words (api/faultplan.py), over generated sequences
of the ops a rank issues: the test's own, on the default group and on subgroups (two of them with
the same members), and the plugin's own (a check's twin group, ``reference()``'s world).

The rules:

- **Only the test's own calls count.** A fault armed at ``(op, nth)`` fires exactly once, at the
  first of the test's own calls that is the ``nth`` call of ``op`` on its group (counted on that
  group alone), and never where there is none; the plugin's calls, wherever they fall, change
  nothing (hostile-4 D9).
- **The words agree with the sequence.** The fired line names the op, the group's collective
  number (``#k``: the test's own collectives on that group up to it, point-to-point ops left
  out, as the verdicts number them), the group as the verdicts name it (``the group of ranks
  2, 3``, never a hash), its ordinal on that group and, where the rank issued the op on other
  groups too, its ordinal over all of them (hostile-4 D19).
- **Ordinals** read as English: ``1st 2nd 3rd 4th ... 11th 12th 13th ... 21st 22nd 23rd``.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.api.faultplan import P2P, Group, Plan, fired_line, make_fault, ordinal
from pytest_distrank.outcome.collectives import group_of_ranks

#: The groups a generated rank (rank 2 of 4) issues ops on.
DEFAULT = Group("0", (0, 1, 2, 3), default=True)
SUB = Group("1", (2, 3))
SAME_MEMBERS = Group("2", (2, 3))
TWIN = Group("4a2ad14e", (0, 1, 2, 3), plugin=True)
REFERENCE = Group("8a3f0c11", (0,), default=True, plugin=True)
GROUPS = (DEFAULT, SUB, SAME_MEMBERS, TWIN, REFERENCE)
OPS = ("all_reduce", "all_gather", "broadcast", "barrier", "send", "recv")

calls = st.lists(st.tuples(st.sampled_from(OPS), st.sampled_from(GROUPS)), max_size=40)


def expected_firing(sequence: list[tuple[str, Group]], op: str, nth: int) -> int | None:
    """The index of the call the fault must fire at, from the rule alone."""
    seen: dict[str, int] = {}
    for index, (call, group) in enumerate(sequence):
        if group.plugin or call != op:
            continue
        seen[group.key] = seen.get(group.key, 0) + 1
        if seen[group.key] == nth:
            return index
    return None


@given(calls, st.sampled_from(OPS), st.integers(1, 6))
def test_a_fault_fires_once_at_the_nth_of_the_tests_own_calls_on_a_group(
    sequence: list[tuple[str, Group]], op: str, nth: int
) -> None:
    plan = Plan()
    fault = make_fault("raise_in", 4, rank=2, at=op, nth=nth)
    plan.armed.append(fault)
    fired = [i for i, (call, group) in enumerate(sequence) if plan.see(call, group)[1]]
    expected = expected_firing(sequence, op, nth)
    assert fired == ([] if expected is None else [expected])
    assert plan.missed() == ([] if fired else [fault])


@given(calls, st.sampled_from(OPS), st.integers(1, 6))
def test_the_plugins_calls_change_nothing(
    sequence: list[tuple[str, Group]], op: str, nth: int
) -> None:
    own = [(call, group) for call, group in sequence if not group.plugin]
    slots = []
    for calls_seen in (sequence, own):
        plan = Plan(armed=[make_fault("raise_in", 4, rank=2, at=op, nth=nth)])
        seen = [plan.see(call, group) for call, group in calls_seen]
        slots.append([(slot, bool(due)) for slot, due in seen if slot is not None])
    assert slots[0] == slots[1]


@given(calls, st.sampled_from(OPS), st.integers(1, 6))
def test_the_fired_line_counts_and_names_as_the_sequence_says(
    sequence: list[tuple[str, Group]], op: str, nth: int
) -> None:
    expected = expected_firing(sequence, op, nth)
    if expected is None:
        return
    plan = Plan(armed=[make_fault("raise_in", 4, rank=2, at=op, nth=nth, call="C")])
    for call, group in sequence[:expected]:
        plan.see(call, group)
    at_group = sequence[expected][1]
    slot, due = plan.see(op, at_group)
    assert slot is not None and due
    line = fired_line(due[0], 2, slot, 0.5, "call")
    own = [(c, g) for c, g in sequence[: expected + 1] if not g.plugin]
    number = sum(1 for c, g in own if g.key == at_group.key and c not in P2P)
    overall = sum(1 for c, _ in own if c == op)
    assert at_group in (DEFAULT, SUB, SAME_MEMBERS)
    words = "the default group" if at_group is DEFAULT else group_of_ranks((2, 3))
    if any(g.key != at_group.key and g.words() == at_group.words() for _, g in own):
        words += f" named {at_group.key!r}"  # SUB and SAME_MEMBERS both issued on: told apart
    where = f"{op} #{number} on {words}" if op not in P2P else f"{op} on {words}"
    count = f"its {ordinal(nth)} {op}"
    if overall != nth:
        count += f" there, its {ordinal(overall)} in all"
    assert (
        line
        == f"injected: RuntimeError raised on rank 2 at {where} ({count}), 0.50 s into call (C)"
    )
    assert "4a2ad14e" not in line and "8a3f0c11" not in line


@given(st.integers(1, 130) | st.integers(1, 10**6))
def test_ordinals_read_as_english(n: int) -> None:
    last, tens = n % 10, n % 100 // 10
    suffix = "th" if tens == 1 else {1: "st", 2: "nd", 3: "rd"}.get(last, "th")
    assert ordinal(n) == f"{n}{suffix}"
