"""Unit tests of launcher mode's sub-worlds (launch/subworld.py, plan.place, subrun's batch
arithmetic): where a test of world size k < W runs, what runs at once, and how its ranks are named.

Placement and packing judge where every test runs, so they get properties over random launched
worlds (nodes of any sizes) and random mixes of sizes; the e2e of tests/e2e/test_subworlds.py
runs them for real on two torchrun agents.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pytest import TestReport

from pytest_distrank.launch.plan import Step, next_shared, place
from pytest_distrank.launch.subrun import batch_start, latest_sub
from pytest_distrank.launch.subworld import (
    World,
    lost_result,
    nodes_of,
    placement,
    rank_label,
    relabel,
    rerun_note,
    schedule,
    unaccounted,
)
from pytest_distrank.outcome.merge import merge_test

#: A launched world: each rank's node, numbered as nodes_of numbers them (node by node).
worlds = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(
    lambda sizes: [node for node, size in enumerate(sizes) for _ in range(size)]
)


def test_rank_label_names_both_numberings() -> None:
    assert rank_label(1, 2, 3, 1) == "rank 1/2 (launched rank 3, node 1)"


def test_nodes_are_numbered_from_rank_0s() -> None:
    assert nodes_of(["1@h", "1@h", "0@h", "0@h"]) == [0, 0, 1, 1]


def test_two_nodes_of_two_place_pairs_on_one_node_each() -> None:
    nodes = [0, 0, 1, 1]
    assert placement(nodes, 1) == [(0,), (1,), (2,), (3,)]
    assert placement(nodes, 2) == [(0, 1), (2, 3)]
    assert placement(nodes, 3) == [(0, 1, 2)]
    assert placement(nodes, 4) == [(0, 1, 2, 3)]
    assert placement(nodes, 5) == []


def test_the_rest_of_each_node_makes_cross_node_sub_worlds_last() -> None:
    # Two nodes of three: a pair on each, and the two left over together across the nodes.
    assert placement([0, 0, 0, 1, 1, 1], 2) == [(0, 1), (3, 4), (2, 5)]


@given(worlds, st.integers(1, 20))
def test_placement_fills_the_world_with_disjoint_sub_worlds(nodes: list[int], k: int) -> None:
    slots = placement(nodes, k)
    taken = [rank for slot in slots for rank in slot]
    assert len(slots) == (len(nodes) // k if k <= len(nodes) else 0)
    assert all(len(slot) == k and list(slot) == sorted(slot) for slot in slots)
    assert len(taken) == len(set(taken))
    if 0 in taken:  # the launched rank 0 leads the first sub-world, when it is in one
        assert slots[0][0] == 0


@given(worlds, st.integers(1, 6))
def test_placement_keeps_as_many_sub_worlds_inside_one_node_as_fit(
    nodes: list[int], k: int
) -> None:
    slots = placement(nodes, k)
    local = [slot for slot in slots if len({nodes[r] for r in slot}) == 1]
    fit = sum(nodes.count(node) // k for node in set(nodes))
    assert len(local) == fit
    # the launched rank 0's first, then node-local ones (a short batch uses them), then across
    others = [len({nodes[r] for r in slot}) == 1 for slot in slots if 0 not in slot]
    assert others == sorted(others, reverse=True)
    assert not slots or 0 in slots[0] or 0 not in {r for slot in slots for r in slot}
    if k > max(nodes.count(node) for node in set(nodes)) and slots:
        # larger than any node: each spans as few nodes as ranks in node order allow
        assert all(list(slot) == list(range(slot[0], slot[0] + k)) for slot in slots)


groups = st.lists(st.one_of(st.none(), st.sampled_from([1, 2, 3])), max_size=30)


@given(groups, st.integers(1, 4))
def test_schedule_packs_each_size_into_batches_in_collected_order(
    sizes: list[int | None], capacity: int
) -> None:
    def cap(group: Hashable) -> int:
        return capacity if group != 3 else 1

    order, where = schedule(sizes, cap)
    assert sorted(order) == list(range(len(sizes)))
    assert set(where) == {i for i, g in enumerate(sizes) if g is not None}
    # tests that are not a sub-world's, and each size's tests, keep their collected order
    plain = [i for i in order if sizes[i] is None]
    assert plain == sorted(plain)
    for size in (1, 2, 3):
        mine = [i for i in order if sizes[i] == size]
        assert mine == sorted(mine)
    # a batch: one size, at most its capacity, slots 0.. in a row of the order
    batches: dict[int, list[int]] = {}
    for i in order:
        if i in where:
            batches.setdefault(where[i][0], []).append(i)
    for members in batches.values():
        assert len({sizes[i] for i in members}) == 1
        assert len(members) <= cap(sizes[members[0]])
        assert [where[i][1] for i in members] == list(range(len(members)))
        positions = [order.index(i) for i in members]
        assert positions == list(range(positions[0], positions[0] + len(members)))
    # a full batch but the last of its size; one group id per run of batches of a size
    for size in (1, 2, 3):
        runs = sorted({where[i][0] for i in where if sizes[i] == size})
        assert len({where[i][2] for i in where if sizes[i] == size}) <= 1
        for b in runs[:-1]:
            assert len(batches[b]) == cap(size)


def test_place_gives_each_test_of_a_batch_its_own_ranks() -> None:
    steps = [
        Step("sub", size=2, backend="gloo"),
        Step("all", backend="gloo"),
        Step("sub", size=2, backend="gloo"),
        Step("sub", size=1, backend="gloo"),
        Step("sub", size=2, backend="gloo"),
        Step("rank0"),
    ]
    placed, order = place(steps, [0, 0, 1, 1])
    assert order == [0, 2, 4, 1, 3, 5]
    worlds = [placed[i].world for i in order]
    assert worlds[0] == World((0, 1), 0, 0, 0)
    assert worlds[1] == World((2, 3), 0, 1, 0)
    assert worlds[2] == World((0, 1), 1, 0, 0)  # the next batch of pairs keeps the groups
    assert worlds[4] == World((0,), 2, 0, 2)
    assert [placed[i].runs_on(3) for i in order] == [False, True, False, True, False, False]
    run = tuple(placed[i] for i in order)
    assert [batch_start(run, i) for i in range(6)] == [0, 0, 2, 3, 4, 5]
    assert [latest_sub(run, i) for i in range(6)] == [None, 0, 1, 2, 2, 4]
    items = [cast(pytest.Item, name) for name in "abcdef"]
    # a rank's next test is the next one it runs itself (module fixtures stay up for it)
    assert next_shared(run, items, 1, 3) is items[3]
    assert next_shared(run, items, 3, 3) is None
    assert next_shared(run, items, 0, 2) is items[1]
    assert next_shared(run, items, 0, 0) is items[2]


def _report(sections: list[tuple[str, str]], props: list[tuple[str, object]]) -> TestReport:
    return TestReport(
        "t.py::t", ("t.py", 1, "t"), {}, "failed", "boom", "call", sections, user_properties=props
    )


def test_relabel_names_both_numberings_once() -> None:
    report = _report(
        [("Captured stdout call (rank 1/2)", "[rank 1/2]\nrank 1/20 is not a label here")],
        [("distrank rank 0/2", "passed")],
    )
    relabel([report], 2, (2, 3), [0, 0, 1, 1])
    relabel([report], 2, (2, 3), [0, 0, 1, 1])  # a second pass changes nothing
    assert report.sections == [
        (
            "Captured stdout call (rank 1/2 (launched rank 3, node 1))",
            "[rank 1/2 (launched rank 3, node 1)]\nrank 1/20 is not a label here",
        )
    ]
    assert report.user_properties == [("distrank rank 0/2 (launched rank 2, node 1)", "passed")]


@given(st.integers(1, 6), st.data())
def test_relabel_maps_every_rank_to_its_launched_rank(k: int, data: st.DataObject) -> None:
    members = tuple(sorted(data.draw(st.sets(st.integers(0, 15), min_size=k, max_size=k))))
    nodes = [r // 4 for r in range(16)]
    text = " ".join(f"rank {r}/{k}" for r in range(k))
    report = _report([(text, f"[rank {k - 1}/{k}]\n{text}")], [])
    relabel([report], k, members, nodes)
    expected = " ".join(rank_label(r, k, members[r], members[r] // 4) for r in range(k))
    header = f"[{rank_label(k - 1, k, members[-1], members[-1] // 4)}]"
    # The test's own output below the merge's header stays as the test wrote it.
    assert report.sections == [(expected, f"{header}\n{text}")]


def test_relabel_leaves_the_tests_own_text() -> None:
    """Issue 42 hostile pass (A): print("... rank 0/2 here") and assertion messages were shown
    as "rank 0/2 (launched rank 2, node 0) here"."""
    from pytest_distrank._compat import (
        ExceptionChainRepr,
        ReprEntryNative,
        ReprFileLocation,
        ReprTracebackNative,
    )

    lines = [
        "distrank: 1 of 2 ranks failed; root cause: rank 1/2\n",
        "  rank 0/2  passed\n",
        "  rank 1/2  failed in call: AssertionError: rank 1/2 disagrees\n",
        "---------- traceback of rank 1/2 ----------\n",
        "E   AssertionError: rank 1/2 disagrees\n",
    ]
    crash = ReprFileLocation("t.py", 2, "[rank 1/2] AssertionError: rank 1/2 disagrees")
    report = _report([("Captured stdout call (rank 0/2)", "[rank 0/2]\nsays rank 0/2 here")], [])
    report.longrepr = ExceptionChainRepr([(ReprTracebackNative(lines), crash, None)])
    relabel([report], 2, (2, 3), [0, 0, 0, 0])
    one, zero = "rank 1/2 (launched rank 3, node 0)", "rank 0/2 (launched rank 2, node 0)"
    assert report.sections == [(f"Captured stdout call ({zero})", f"[{zero}]\nsays rank 0/2 here")]
    assert crash.message == f"[{one}] AssertionError: rank 1/2 disagrees"
    table = report.longrepr.chain[0][0].reprentries[0]
    assert isinstance(table, ReprEntryNative)
    assert table.lines == [
        f"distrank: 1 of 2 ranks failed; root cause: {one}\n",
        f"  {zero}  passed\n",
        f"  {one}  failed in call: AssertionError: rank 1/2 disagrees\n",
        f"---------- traceback of {one} ----------\n",
        "E   AssertionError: rank 1/2 disagrees\n",
    ]


LOC = ("test_x.py", 3, "test_x")


def _phase(when: str, outcome: str) -> TestReport:
    longrepr = None if outcome == "passed" else ("test_x.py", 4, "boom")
    return TestReport("test_x.py::test_x", LOC, {}, outcome, longrepr, when)  # type: ignore[arg-type]


def test_a_lost_sub_world_result_fails_the_test_and_never_vanishes() -> None:
    """Issue 42 hostile pass (I2, S, T): a result the launched rank 0 cannot use was a call
    report alone, which the merge drops: the test vanished and the run passed."""
    lost = lost_result("test_x.py::test_x", LOC, 2, "control store tampered with", "", 1.0)
    merged = merge_test(lost, 2)
    assert [(r.when, r.outcome) for r in merged] == [("setup", "passed"), ("call", "failed")]
    assert "control store tampered with" in str(merged[1].longrepr)
    assert unaccounted(lost, 1) is None


phases = st.lists(
    st.tuples(
        st.sampled_from(["setup", "call", "teardown"]), st.sampled_from(["passed", "failed"])
    ),
    max_size=3,
)


@given(st.integers(1, 4), st.lists(phases, min_size=0, max_size=5))
def test_a_result_rank_0_accepts_shows_the_test_for_every_rank(
    size: int, stories: list[list[tuple[str, str]]]
) -> None:
    """Whatever a (forged or broken) result holds, rank 0 accepts it only when every rank of the
    sub-world sent a report and the merge shows the test (a setup); otherwise it says why."""
    per_rank = {rank: [_phase(w, o) for w, o in story] for rank, story in enumerate(stories)}
    why = unaccounted(per_rank, size)
    shown = any(r.when == "setup" for r in merge_test(per_rank, size))
    complete = all(per_rank.get(rank) for rank in range(size))
    assert (why is None) == (shown and complete), (why, per_rank)
    if not complete:
        assert why is not None and "no report of rank(s)" in why


def test_a_result_with_a_call_but_no_setup_is_not_accepted() -> None:
    per_rank = {0: [_phase("call", "failed")], 1: [_phase("call", "failed")]}
    assert merge_test(per_rank, 2) == []  # what made the test vanish
    assert unaccounted(per_rank, 2) == "its sub-world's result held no report of its setup"


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_every_rank_takes_pytest_timeouts_timer_for_every_distributed_test(rank: int) -> None:
    """Issue 42 hostile pass (I, J): rank 0 waits for another sub-world's result inside the
    test's protocol; pytest-timeout's timer, armed there, interrupted the wait (INTERNALERROR).
    The watchdog owns the deadline of a test of several ranks wherever it runs; pytest-timeout
    keeps the tests rank 0 runs alone."""
    from pytest_distrank.launch.plugin import LaunchPlugin

    plugin = LaunchPlugin.__new__(LaunchPlugin)
    items = [cast(pytest.Item, object()) for _ in range(3)]
    other = World(members=(2, 3), batch=0, slot=1, init=0)
    plugin.steps = (
        Step("sub", world=World((0, 1), 0, 0, 0)),
        Step("sub", world=other),
        Step("rank0"),
    )
    plugin.index_of = {id(item): i for i, item in enumerate(items)}
    plugin.rank = rank
    assert plugin.pytest_timeout_set_timer(items[1]) is True  # rank 0 waits for it: ours
    assert plugin.pytest_timeout_cancel_timer(items[1]) is True
    assert plugin.pytest_timeout_set_timer(items[0]) is True
    assert plugin.pytest_timeout_set_timer(items[2]) is None  # rank 0's own: pytest-timeout's


@pytest.mark.parametrize("stop", ["", "stopping after 1 failures"])
def test_x_reports_the_rest_of_the_batch_that_ran_at_once(
    stop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42 hostile pass (C): under -x rank 0 stopped after the batch's first test and never
    reported the others, which had run (and failed) on their own sub-worlds."""
    from types import SimpleNamespace

    from pytest_distrank.launch import subrun

    replayed: list[int] = []
    monkeypatch.setattr(subrun, "replay", lambda plugin, item, index: replayed.append(index))
    pair, other = World((0, 1), 0, 0, 0), World((2, 3), 0, 1, 0)
    steps = (
        Step("sub", world=pair),
        Step("sub", world=other),
        Step("sub", world=World((0, 1), 1, 0, 0)),
    )
    plugin = SimpleNamespace(
        session=SimpleNamespace(shouldfail=stop, shouldstop=False),
        steps=steps,
        items=[0, 1, 2],
        index=0,
    )
    subrun.stopping(cast(subrun.LaunchPlugin, plugin), 0)
    assert replayed == ([1] if stop else [])  # the batch's other test; not the next batch's


def test_the_run_ends_naming_the_launched_rank_that_stopped_serving() -> None:
    """Issue 42 hostile pass (E2): launched rank 3 (rank 1 of its pair) was named "rank 1" in
    why the run ended and in every later test's "not run" reason."""
    from types import SimpleNamespace

    from pytest_distrank.launch.current import Current
    from pytest_distrank.launch.gather import stopped_serving
    from pytest_distrank.launch.session import RankSession
    from pytest_distrank.settings import Value

    item = cast(pytest.Item, SimpleNamespace(nodeid="t.py::t", location=LOC))
    cur = Current.begin(0, item, 2, Value(60.0, "default"), 0.2)
    cur.stopped[1] = cast(Any, {"message": "KeyboardInterrupt was raised in t.py::t"})
    assert stopped_serving(cur).startswith("rank 1 stopped serving: KeyboardInterrupt")
    cur.view = cast(RankSession, SimpleNamespace(launched_rank=lambda rank: (2, 3)[rank]))
    assert stopped_serving(cur).startswith("rank 3 stopped serving: KeyboardInterrupt was raised")


def test_relabel_names_the_shown_ranks_own_timeout_in_both_numberings() -> None:
    """Issue 42 hostile pass (E1): the shown rank's own traceback, which the plugin writes for
    a timeout, began "rank 0/2: Timeout: ..." while every other label named the launched rank."""
    from pytest_distrank.outcome.reports import passed_report, synthesized_failure

    def timed_out(rank: int) -> list[TestReport]:
        text = f"rank {rank}/2: Timeout: still in call after 6 s\nblocked in test_x at x.py:9"
        late = synthesized_failure(LOC[0], LOC, "call", "Timeout", text, note="timed out")
        return [passed_report(LOC[0], LOC, "setup"), late]

    merged = merge_test({0: timed_out(0), 1: timed_out(1)}, 2)
    relabel(merged, 2, (2, 3), [0, 0, 0, 0])
    entries = merged[1].longrepr.chain[0][0].reprentries  # type: ignore[union-attr]
    assert [e.lines[0] for e in entries] == [
        "distrank: 2 of 2 ranks failed; root cause: rank 0/2 (launched rank 2, node 0)\n",
        "rank 0/2 (launched rank 2, node 0): Timeout: still in call after 6 s\n",
    ]
    assert entries[1].lines[1] == "blocked in test_x at x.py:9\n"


def test_a_sub_world_gets_its_own_rendezvous_for_env_init(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 42 hostile pass (P): env:// in two sub-worlds at once met in the launcher's one
    store. Its rank 0 picks a free port and tells its members; torchrun's agent store is off."""
    import socket

    from pytest_distrank.launch.group import sub_world_master

    class Store(dict[str, bytes]):
        def set(self, key: str, value: str) -> None:
            self[key] = value.encode()

    store = Store()
    leader = sub_world_master(store, 0)
    assert sub_world_master(store, 1) == leader  # a member on rank 0's host: loopback
    assert leader["MASTER_ADDR"] == "127.0.0.1" and int(leader["MASTER_PORT"]) > 0
    assert leader["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    monkeypatch.setattr(socket, "gethostname", lambda: "other-node")
    assert sub_world_master(store, 1)["MASTER_ADDR"] != "127.0.0.1"  # rank 0's host by name


def test_the_rerun_note_says_where_the_rerun_puts_the_test_and_where_it_ran() -> None:
    assert rerun_note(World((2, 3), 0, 1, 0)) == (
        "\n(it runs on launched ranks 0-1 there; here it ran on launched ranks 2, 3: the same "
        "ranks of its sub-world, seeded alike, but other local devices)"
    )
