"""Launcher mode's sub-worlds: which ranks run a test of world size k < W, and what runs at once.

Pure logic, no torch: rank 0 of a launched world calls :func:`placement` and :func:`schedule` while
it makes the plan (:mod:`plan`), and :func:`relabel` on the merged reports of a sub-world's test;
every rank reads the :class:`World` of its tests from the plan.

- **Placement**: the sub-worlds of size k are disjoint sets of k ranks, as many as fit
  (``W // k``). Ranks of one node go together where k fits in a node: collectives inside a
  node take its fastest links (NVLink, shared memory) rather than the network, a node that fails
  takes down fewer sub-worlds, and a test of 2 on a node of 8 GPUs sees what it sees on one
  machine. Ranks a node cannot fill a sub-world with (the rest of ``local_size // k``) make
  cross-node sub-worlds, used last. A sub-world larger than a node spans as few nodes as it can.
  Inside a sub-world the ranks keep their launched order; the launched rank 0's sub-world comes
  first (it runs a batch's first test, then reports the others), when it is in one (not when its
  node has fewer than k ranks and the rest cannot make k).
- **Schedule**: tests of one size (and backend) are packed together, in their collected order,
  into batches of up to ``W // k`` tests that run at once, one per sub-world; the run of
  batches of one size starts where its first test was collected, so the group of each sub-world
  is set up once for the whole run of batches (:attr:`World.init`) and not once per test.
- **Harness classes** (PyTorch's ``MultiProcessTestCase`` family, :mod:`harness`) run only on
  :func:`home_slots`: the sub-worlds whose rank i is its node's local rank i. Their code picks its
  GPU from its rank in the test (``set_device_index(rank)``, ``LOCAL_RANK=rank``) and meets its
  peers in a file (``file://``): on a home sub-world that rank is the GPU the launcher gave the
  process, and the file is on the members' own node.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Hashable, Mapping, Sequence

from pytest import TestReport

from .._compat import ExceptionChainRepr, ExceptionRepr, ReprEntryNative
from ..outcome.merge import merge_test
from ..outcome.reports import Location, check_failure, fill_passed


@dataclasses.dataclass(frozen=True)
class World:
    """Where one test of a sub-world runs, as rank 0's plan says."""

    #: The launched ranks of the sub-world; a rank's index here is its rank in the sub-world.
    members: tuple[int, ...]
    #: The batch of tests that run at once, and this test's sub-world in it.
    batch: int
    slot: int
    #: The first batch of the run of batches that share this sub-world's group: the group's id
    #: (its store prefix carries it, so that two sub-worlds never share keys).
    init: int

    @property
    def size(self) -> int:
        return len(self.members)

    def group_id(self) -> str:
        """The sub-world's id in the store prefix of its process group."""
        return f"sw{self.init}.{self.slot}"


def nodes_of(node_keys: Sequence[str]) -> list[int]:
    """Each rank's node as a number (0 for rank 0's node, then in order of first rank), from
    what every rank said its node is."""
    numbers: dict[str, int] = {}
    return [numbers.setdefault(key, len(numbers)) for key in node_keys]


def placement(nodes: Sequence[int], k: int) -> list[tuple[int, ...]]:
    """The disjoint sub-worlds of ``k`` ranks in a launched world whose rank ``r`` is on node
    ``nodes[r]``: node-local ones first, then the ones across nodes (see the module docstring)."""
    if k < 1 or k > len(nodes):
        return []
    by_node: dict[int, list[int]] = {}
    for rank, node in enumerate(nodes):
        by_node.setdefault(node, []).append(rank)
    if k > max(len(ranks) for ranks in by_node.values()):
        ordered = [rank for node in sorted(by_node) for rank in by_node[node]]
        return _chunks(ordered, k)
    local: list[tuple[int, ...]] = []
    rest: list[int] = []
    for node in sorted(by_node):
        ranks = by_node[node]
        full = len(ranks) - len(ranks) % k
        local.extend(_chunks(ranks[:full], k))
        rest.extend(ranks[full:])
    slots = sorted(local) + _chunks(rest, k)
    # The launched rank 0 runs its batch's first test itself, then logs the others as they
    # come: its sub-world goes first, or the batch would wait for it.
    return sorted(slots, key=lambda slot: 0 not in slot)


def home_slots(nodes: Sequence[int], local_ranks: Sequence[int], k: int) -> list[tuple[int, ...]]:
    """The sub-worlds of ``k`` ranks whose rank ``i`` is local rank ``i`` of one node (at most
    one per node; rank 0's node first): where a harness class's test runs (module docstring)."""
    by_node: dict[int, dict[int, int]] = {}
    for rank, (node, local) in enumerate(zip(nodes, local_ranks, strict=True)):
        by_node.setdefault(node, {}).setdefault(local, rank)
    slots = []
    for node in sorted(by_node):
        ranks = by_node[node]
        if all(i in ranks for i in range(k)) and k >= 1:
            slots.append(tuple(ranks[i] for i in range(k)))
    return sorted(slots, key=lambda slot: 0 not in slot)


def _chunks(ranks: Sequence[int], k: int) -> list[tuple[int, ...]]:
    return [tuple(ranks[i : i + k]) for i in range(0, len(ranks) - k + 1, k)]


def schedule(
    groups: Sequence[Hashable | None], capacity: Callable[[Hashable], int]
) -> tuple[list[int], dict[int, tuple[int, int, int]]]:
    """The order the tests run in and, for each sub-world test, ``(batch, slot, init)``.

    ``groups[i]`` is what test ``i`` must share its batch with (its size and backend), or None
    for a test that is not a sub-world's; ``capacity(group)`` is how many such tests run at once.
    """
    order: list[int] = []
    where: dict[int, tuple[int, int, int]] = {}
    batch = 0
    for i, group in enumerate(groups):
        if i in where:
            continue
        if group is None:
            order.append(i)
            continue
        same = [j for j in range(i, len(groups)) if groups[j] == group and j not in where]
        size = max(1, capacity(group))
        init = batch
        for start in range(0, len(same), size):
            for slot, j in enumerate(same[start : start + size]):
                order.append(j)
                where[j] = (batch, slot, init)
            batch += 1
    return order, where


def lost_result(
    nodeid: str, location: Location, size: int, crash: str, more: str, now: float
) -> dict[int, list[TestReport]]:
    """The reports of a sub-world's test whose result the launched rank 0 could not use
    (``crash``: what is known): a failure of the sub-world's rank 0 in call, after the passed
    setup that the merge shows a call after (without it the merge shows nothing at all)."""
    reports = [check_failure(nodeid, location, 0, size, crash, more, now)]
    fill_passed(reports, nodeid, location, "call")
    return {0: reports}


def unaccounted(per_rank: Mapping[int, Sequence[TestReport]], size: int) -> str | None:
    """Why the launched rank 0 cannot account for a sub-world's test from the reports its rank 0
    sent (None: it can): a rank of the sub-world with no report, or reports whose merge shows
    no setup (the test would vanish from the report and from junit)."""
    missing = [rank for rank in range(size) if not per_rank.get(rank)]
    if missing:
        return f"its sub-world's result held no report of rank(s) {missing} (of {size})"
    if not any(report.when == "setup" for report in merge_test(per_rank, size)):
        return "its sub-world's result held no report of its setup"
    return None


def rank_label(rank: int, size: int, launched: int, node: int) -> str:
    """A rank of a sub-world in both numberings: ``rank 1/2 (launched rank 3, node 1)``."""
    return f"rank {rank}/{size} (launched rank {launched}, node {node})"


def rerun_note(world: World) -> str:
    """Under a sub-world test's rerun command: where the rerun puts it, and where it ran."""
    ran = ", ".join(map(str, world.members))
    return (
        f"\n(it runs on launched ranks 0-{world.size - 1} there; here it ran on launched ranks "
        f"{ran}: the same ranks of its sub-world, seeded alike, but other local devices)"
    )


def relabel(
    merged: Sequence[TestReport], size: int, members: Sequence[int], nodes: Sequence[int]
) -> None:
    """Every ``rank i/k`` label the merge wrote names the launched rank and node too; the test's
    own text (its output, its assertion messages) is left as it is: section titles, the first
    line of a section (the merge's ``[rank i/k]``), junit property names, a crash message's
    leading tag, in the rank table the ``distrank:`` head line and each line's leading label
    (``  rank i/k  failed in call: <the test's message>``, ``---- traceback of rank i/k``), and
    the leading label of the shown rank's own traceback that the plugin wrote (a timeout's)."""
    pattern = re.compile(rf"\brank (\d+)/{size}(?![\d(])(?! \(launched)")
    label = rf"rank \d+/{size}(?![\d(])(?! \(launched)"
    tag = re.compile(rf"^\[{label}")  # the merge's [rank i/k] before a message or output
    lead = re.compile(rf"^(\s*|-+ traceback of ){label}")  # the rank table's

    def sub(text: str) -> str:
        def one(match: re.Match[str]) -> str:
            rank = int(match.group(1))
            if rank >= len(members):
                return match.group(0)
            launched = members[rank]
            node = nodes[launched] if launched < len(nodes) else 0
            return rank_label(rank, size, launched, node)

        return pattern.sub(one, text)

    def head(text: str, start: re.Pattern[str] = tag) -> str:
        """Only the label ``start`` finds at the start of ``text``."""
        found = start.match(text)
        return text if found is None else sub(text[: found.end()]) + text[found.end() :]

    def first_line(text: str) -> str:
        line, sep, rest = text.partition("\n")
        return head(line) + sep + rest

    def table(line: str) -> str:
        return sub(line) if line.startswith("distrank: ") else head(line, lead)

    for report in merged:
        report.sections = [(sub(title), first_line(content)) for title, content in report.sections]
        report.user_properties = [
            (sub(key) if isinstance(key, str) else key, value)
            for key, value in report.user_properties
        ]
        longrepr = report.longrepr
        if not isinstance(longrepr, ExceptionRepr):
            continue
        crash = longrepr.reprcrash
        if crash is not None:
            crash.message = head(crash.message)
        chain = longrepr.chain if isinstance(longrepr, ExceptionChainRepr) else None
        first_tb = chain[0][0] if chain else longrepr.reprtraceback
        entries = first_tb.reprentries
        if entries and isinstance(entries[0], ReprEntryNative):  # the merge's rank table
            # Then the shown rank's own, when the plugin wrote it (``rank i/k: Timeout: ...``).
            own = [
                ReprEntryNative([head(e.lines[0], lead), *e.lines[1:]])
                if isinstance(e, ReprEntryNative) and e.lines
                else e
                for e in entries[1:]
            ]
            first_tb.reprentries = [ReprEntryNative([table(x) for x in entries[0].lines]), *own]
        longrepr.sections[:] = [(sub(t), c, sep) for t, c, sep in longrepr.sections]
