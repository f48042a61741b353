"""Unit: a hang explained from the ranks' flight-recorder records (collectives.py)."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

from pytest_distrank import _compat
from pytest_distrank.outcome import collectives
from pytest_distrank.outcome.collectives import crash_verdict, explain, load

START = 1_000


def entry(
    op: str,
    done: bool,
    at: int = START + 1,
    size: int = 4,
    dtype: str = "Float",
    group: tuple[str, str] = ("0", "default_pg"),
    p2p: bool = False,
) -> dict[str, Any]:
    return {
        "profiling_name": f"gloo:{op}",
        "retired": done,
        "time_created_ns": at,
        "input_sizes": [[size]],
        "input_dtypes": [dtype],
        "process_group": group,
        "is_p2p": p2p,
    }


def dump(*entries: dict[str, Any], groups: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"entries": list(entries), "pg_config": groups or {}}


#: A collective from before the test: not counted, not numbered.
EARLIER = entry("all_reduce", True, at=START - 5)


def test_a_missing_rank_is_named_with_where_it_is() -> None:
    waiting = dump(EARLIER, entry("all_reduce", True), entry("all_reduce", False))
    absent = dump(EARLIER, entry("all_reduce", True))
    story = explain(
        {0: waiting, 1: waiting, 2: absent}, START, {2: "blocked in sleep at test_x.py:9"}
    )
    assert story is not None
    assert story.verdict.text == (
        "ranks 0, 1 wait in all_reduce #2 on the default group; rank 2 never entered it: it is "
        "blocked in sleep at test_x.py:9 (after all_reduce #1)"
    )
    assert story.lines == {
        0: "in all_reduce #2 on the default group (float32[4])",
        1: "in all_reduce #2 on the default group (float32[4])",
    }  # rank 2 waits in no collective: its stack alone says where it is


def test_different_ops_in_the_same_slot_are_a_mismatch() -> None:
    story = explain(
        {
            0: dump(entry("all_reduce", False)),
            1: dump(entry("broadcast", False)),
            2: dump(entry("all_reduce", False)),
        },
        START,
    )
    assert story is not None
    assert story.verdict.text == (
        "rank 1 entered broadcast #1 while ranks 0, 2 entered all_reduce #1 (the default group)"
    )


def test_different_shapes_or_dtypes_are_named() -> None:
    story = explain(
        {0: dump(entry("all_reduce", False)), 1: dump(entry("all_reduce", False, size=8))},
        START,
    )
    assert story is not None
    assert story.verdict.text == (
        "all_reduce #1 on the default group: rank 0 float32[4], rank 1 float32[8]"
    )
    story = explain(
        {0: dump(entry("all_reduce", False)), 1: dump(entry("all_reduce", False, dtype="Double"))},
        START,
    )
    assert story is not None
    assert story.verdict.text.endswith("rank 0 float32[4], rank 1 float64[4]")


def test_a_subgroup_is_named_by_its_ranks() -> None:
    sub = ("1", "")
    groups = {"1": {"ranks": "[0, 2]"}}
    story = explain(
        {
            0: dump(entry("all_gather", False, group=sub), groups=groups),
            2: dump(groups=groups),
        },
        START,
    )
    assert story is not None
    assert story.lines[0] == "in all_gather #1 on the group of ranks 0, 2 (float32[4])"
    assert story.verdict.text == (
        "rank 0 waits in all_gather #1 on the group of ranks 0, 2; rank 2 never entered it"
    )


#: A gloo dump's ``pg_config``: one entry with an empty name, whatever groups the rank holds.
GLOO_CONFIG = {"": {"name": "", "desc": "", "ranks": "[]"}}


def test_a_subgroup_of_a_gloo_dump_is_named_by_the_members_the_rank_adds() -> None:
    """D17 and D8 (hostile review 3, row 16): ``new_group([0, 1])`` of 4 ranks, rank 0 waits in
    it, rank 1 never enters it, ranks 2 and 3 (not members) finished. gloo lists no members, so
    the rank adds them (``_compat.with_group_members``); the verdict named ``group '1'`` and
    called ranks 2 and 3 absent."""
    pair = {**GLOO_CONFIG, "1": {"name": "1", "desc": "undefined", "ranks": "[0, 1]"}}
    sub = ("1", "undefined")
    story = explain(
        {
            0: dump(entry("all_reduce", False, group=sub), groups=pair),
            1: dump(groups=pair),
            2: dump(entry("all_reduce", True), groups=GLOO_CONFIG),
            3: dump(entry("all_reduce", True), groups=GLOO_CONFIG),
        },
        START,
    )
    assert story is not None
    assert story.verdict.text == (
        "rank 0 waits in all_reduce #1 on the group of ranks 0, 1; rank 1 never entered it"
    )
    # Without the members (an older dump), the name is still the recorder's.
    bare = explain({0: dump(entry("all_reduce", False, group=sub), groups=GLOO_CONFIG)}, START)
    assert bare is not None and bare.lines[0] == "in all_reduce #1 on group '1' (float32[4])"


def test_the_rank_adds_the_members_of_its_groups_to_its_dump(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch.distributed import distributed_c10d as c10d

    world, pair, mesh_dim = object(), object(), type("Group", (), {"group_desc": "mesh_tp"})()
    fake = type("World", (), {})()
    fake.pg_names = {world: "0", pair: "1", mesh_dim: "3"}
    fake.pg_group_ranks = {
        world: {0: 0, 1: 1, 2: 2, 3: 3},
        pair: {1: 1, 0: 0},
        mesh_dim: {0: 0, 2: 1},
    }
    monkeypatch.setattr(c10d, "_world", fake)
    torch_json = {"pg_config": {**GLOO_CONFIG, "0": {"ranks": "[0, 1, 2, 3]"}}, "entries": []}
    data = load(_compat.with_group_members(json.dumps(torch_json).encode()))
    assert data is not None
    assert data["pg_config"] == {
        "": {"ranks": "[]"},
        "0": {"ranks": "[0, 1, 2, 3]"},
        "1": {"ranks": "[0, 1]"},
        "3": {"ranks": "[0, 2]"},
    }
    assert _compat.with_group_members(b"not json") == b"not json"  # as it was, never lost


def test_point_to_point_ops_are_left_out() -> None:
    story = explain({0: dump(entry("send", False, p2p=True))}, START)
    assert story is not None
    assert story.lines == {}
    assert story.verdict.text == ""


def test_no_records_no_story() -> None:
    assert explain({0: None, 1: None}, START) is None
    assert load(b"no records") is None
    assert load(b"not json") is None
    assert load(b"") is None and load(None) is None and load(b"[1, 2]") is None
    assert load(b'{"entries": []}') == {"entries": [], "pg_config": {}, "dumped_ns": 0}


#: Set by :func:`_ran` if a payload ever gets unpickled.
UNPICKLED: list[str] = []


def _ran(what: str) -> None:
    UNPICKLED.append(what)


class _Payload:
    """Runs :func:`_ran` when unpickled, as a planted payload would run anything."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _ran, ("payload",)


def test_records_are_json_and_a_pickle_is_never_unpickled() -> None:
    """Flight records travel as JSON in both modes; launcher mode reads them off its control
    store, which anyone who reaches it can write (hostile review 3, D15)."""
    planted = pickle.dumps({"entries": [_Payload()]})
    assert load(planted) is None
    assert load(planted.decode("latin-1")) is None
    assert UNPICKLED == []
    # torch's own JSON dump (torch 2.13, gloo): what load keeps of it.
    torch_json = {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "entries": [
            {
                **entry("all_reduce", False),
                "process_group": ["0", "default_pg"],
                "record_id": 3,
                "collective_seq_id": 2,
                "thread_name": "python",
                "output_sizes": [[4]],
                "timeout_ms": 6000,
            }
        ],
    }
    data = load(json.dumps(torch_json).encode())
    assert data is not None
    assert data["pg_config"] == {"0": {"ranks": "[0, 1]"}}
    (kept,) = data["entries"]
    assert kept == {
        "record_id": 3,
        "collective_seq_id": 2,
        "process_group": ["0", "default_pg"],
        "profiling_name": "gloo:all_reduce",
        "time_created_ns": START + 1,
        "timeout_ms": 6000,
        "is_p2p": False,
        "retired": False,
        "input_dtypes": ["Float"],
        "input_sizes": [[4]],
    }
    assert (
        load(collectives.dump(data)) == data == load(collectives.dump(data).decode())
    )  # one format in both modes
    story = explain({0: data}, START)
    assert story is not None and story.lines == {  # records 0-2 were overwritten: no number
        0: "in all_reduce #? on the default group (float32[4])"
    }
    story = explain({0: {**data, "entries": [{**kept, "record_id": 0}]}}, START)
    assert story is not None and story.lines == {
        0: "in all_reduce #1 on the default group (float32[4])"
    }


def test_malformed_records_are_dropped_not_raised() -> None:
    hostile = {
        "entries": [
            "not a record",
            {"process_group": "0", "time_created_ns": "soon", "input_sizes": [["x"], 3]},
            [1, 2],
        ],
        "pg_config": {"1": "not a config", "2": {"ranks": [0, 2]}},
    }
    data = load(json.dumps(hostile))
    assert data is not None
    assert data["pg_config"] == {"2": {"ranks": "[0, 2]"}}
    (kept,) = data["entries"]
    assert kept["process_group"] == ["?"] and kept["time_created_ns"] == 0
    assert kept["input_sizes"] == [[0]]
    assert explain({0: data}, 0) is not None  # readable, whatever was sent
    assert load(b"[" * 100_000) is None  # too deep for the parser: unreadable, not an error


def test_a_rank_without_records_gets_no_line() -> None:
    barrier = entry("barrier", False)
    barrier["input_sizes"], barrier["input_dtypes"] = [], []
    story = explain({0: dump(barrier), 1: None}, START)
    assert story is not None
    assert story.lines == {0: "in barrier #1 on the default group"}


def test_a_crash_inside_a_collective_names_what_the_peers_were_in() -> None:
    peer = dump(EARLIER, entry("all_reduce", True), entry("all_reduce", False, size=8))
    other = dump(EARLIER, entry("barrier", False))
    entered = "all_reduce, called from test_x at test_x.py:10"
    verdict = crash_verdict(0, "SIGABRT", entered, {1: peer, 2: peer, 3: other}, START, True)
    assert verdict == (
        "rank 0 crashed (SIGABRT) inside all_reduce, called from test_x at test_x.py:10; "
        "ranks 1, 2 were in all_reduce #2 on the default group (float32[8]); rank 3 was in "
        "barrier #1 on the default group (float32[4]): gloo aborts a rank that receives a "
        "different size than it passed, so compare the tensors (shape, dtype) each rank passes "
        "to this all_reduce"
    )


def test_a_crash_without_peer_records_names_only_the_crash() -> None:
    verdict = crash_verdict(1, "SIGSEGV", "broadcast", {0: None}, START, False)
    assert verdict == "rank 1 crashed (SIGSEGV) inside broadcast"


def test_uneven_all_to_all_is_no_mismatch_and_the_missing_rank_is_named() -> None:
    """D8 (hostile review 3, row 17): ``all_to_all_single`` with splits passes different sizes
    on every rank, legally; rank 2 never came."""
    story = explain(
        {
            0: dump(entry("all_to_all", False, size=3)),
            1: dump(entry("all_to_all", False, size=6)),
            2: dump(),
        },
        START,
        {2: "blocked in sleep at test_x.py:9"},
        world_size=3,
    )
    assert story is not None
    verdict = story.verdict
    assert verdict.text == (
        "ranks 0, 1 wait in all_to_all #1 on the default group; rank 2 never entered it: it is "
        "blocked in sleep at test_x.py:9"
    )
    assert verdict.root == (2,)
    assert verdict.cause == (
        "rank 2/3 never entered all_to_all #1 on the default group (ranks 0, 1 wait in it)"
    )
    assert verdict.waited == {
        0: "waited in all_to_all #1 on the default group for rank 2",
        1: "waited in all_to_all #1 on the default group for rank 2",
    }
    assert not verdict.proven  # rank 2 still runs its test: it may come yet


WORLD4 = {"0": {"ranks": "[0, 1, 2, 3]"}}


def test_a_member_that_finished_without_entering_proves_a_deadlock() -> None:
    waiting = dump(entry("all_reduce", True), entry("all_reduce", False), groups=WORLD4)
    gone = dump(entry("all_reduce", True), groups=WORLD4)
    dumps = {0: waiting, 1: waiting, 2: gone, 3: waiting}
    story = explain(dumps, START, finished={2}, world_size=4)
    assert story is not None and story.verdict.proven
    assert story.verdict.blocked == (0, 1, 3)
    left = "rank 2 never entered it: it left the test (after all_reduce #1)"
    assert left in story.verdict.text
    # Still running (sleeping, slow): it may come yet, so nothing is proven.
    running = explain(dumps, START, world_size=4)
    assert running is not None and running.verdict.root == (2,) and not running.verdict.proven
    # A member that died never comes; one whose records are unknown might.
    died = explain({0: waiting, 1: waiting, 3: waiting}, START, lost={2}, world_size=4)
    assert died is not None and died.verdict.proven and died.verdict.root == (2,)
    unknown = explain({0: waiting, 1: waiting, 3: waiting, 2: None}, START, world_size=4)
    assert unknown is not None and not unknown.verdict.proven
    # It finished after entering the collective: the waiting ranks are only slow.
    entered = dump(entry("all_reduce", True), entry("all_reduce", True), groups=WORLD4)
    late = explain({**dumps, 2: entered}, START, finished={2}, world_size=4)
    assert late is not None and not late.verdict.proven


def test_a_mismatch_blames_the_minority_or_says_there_is_no_majority() -> None:
    minority = explain(
        {
            0: dump(entry("all_gather", False)),
            1: dump(entry("broadcast", False)),
            2: dump(entry("all_gather", False)),
            3: dump(entry("all_gather", False)),
        },
        START,
        world_size=4,
    )
    assert minority is not None and minority.verdict.proven
    assert minority.verdict.root == (1,)
    assert minority.verdict.cause == (
        "rank 1/4 entered broadcast #1 while ranks 0, 2, 3 entered all_gather #1 on the "
        "default group"
    )
    assert minority.verdict.waited[0] == "waited in all_gather #1 on the default group for rank 1"
    halves = explain(
        {0: dump(entry("broadcast", False)), 1: dump(entry("all_gather", False))},
        START,
        world_size=2,
    )
    assert halves is not None and halves.verdict.root == (0, 1)
    assert halves.verdict.cause == (
        "ranks 0, 1 of 2 disagree with no majority to tell which side is wrong: rank 0 entered "
        "broadcast #1; rank 1 entered all_gather #1 on the default group"
    )
    assert halves.verdict.waited == {}


def test_shapes_are_compared_only_where_the_op_needs_them_equal() -> None:
    for op, mismatch in (("all_reduce", True), ("gather", False), ("all_to_all", False)):
        story = explain(
            {0: dump(entry(op, False)), 1: dump(entry(op, False, size=8))}, START, world_size=2
        )
        assert story is not None
        assert bool(story.verdict.text) is mismatch, op
        assert story.verdict.proven is mismatch, op


def test_a_rank_left_alone_with_another_size_is_the_mismatch() -> None:
    """On gloo, three ranks with float32[4] complete an all_reduce and finish the test; the one
    with float32[8] waits alone. The finished ranks' calls count in the comparison."""
    done = dump(entry("all_reduce", True), groups=WORLD4)
    alone = dump(entry("all_reduce", False, size=8), groups=WORLD4)
    story = explain({0: done, 1: alone, 2: done, 3: done}, START, finished={0, 2, 3}, world_size=4)
    assert story is not None
    assert story.verdict.text == (
        "all_reduce #1 on the default group: ranks 0, 2, 3 float32[4], rank 1 float32[8]"
    )
    assert story.verdict.cause == (
        "rank 1/4 entered all_reduce #1 with float32[8] while ranks 0, 2, 3 entered all_reduce #1 "
        "with float32[4] on the default group"
    )
    assert story.verdict.proven and story.verdict.blocked == (1,)
