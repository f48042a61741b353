"""Unit tests of launcher mode's plan (launch/plan.py): rank 0's decision for each test, made
once for every rank of a launched world (``decide``), and which test all ranks run next.

The launched worlds of ``tests/e2e/test_launch.py`` show some of these decisions in a real run
(a world size the world does not have); here every branch is checked without a world.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, TypeVar, cast

import pytest

from pytest_distrank.launch import keys
from pytest_distrank.launch.env import Launch
from pytest_distrank.launch.plan import Plan, Step, apply_on_rank0, decide, exchange, next_shared
from pytest_distrank.launch.session import RankSession
from pytest_distrank.planning.meshes import WS_PARAM, Simulated
from pytest_distrank.planning.spec import SPEC_ERROR
from pytest_distrank.settings import Settings, Value

T = TypeVar("T")


class _Item:
    """What ``decide`` reads of an item: its markers, stash, node id and callspec."""

    def __init__(
        self,
        *marks: pytest.MarkDecorator,
        simulated: Simulated | None = None,
        name: str = "test_x",
    ) -> None:
        self.own_markers = [m.mark for m in marks]
        self.stash = pytest.Stash()
        self.name = name
        self.nodeid = f"test_x.py::{name}"
        if simulated is not None:
            self.own_markers.append(pytest.mark.simulate(simulated.mode, simulated.size).mark)
            self.callspec = SimpleNamespace(marks=[], params={WS_PARAM: simulated})

    def iter_markers(self, name: str) -> list[pytest.Mark]:
        return [m for m in self.own_markers if m.name == name]

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return next(iter(self.iter_markers(name)), None)


def _rank_session(world_size: int, launcher: str = "torchrun", local: int | None = None) -> Any:
    launch = Launch(
        launcher=launcher,
        rank=0,
        world_size=world_size,
        local_rank=0,
        local_world_size=local,
        master_addr="127.0.0.1",
        master_port=29500,
        agent_store=launcher == "torchrun",
        restart=0,
        variables=("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    )
    return SimpleNamespace(world_size=world_size, launch=launch, rank=0)


def _settings(size: Value[int] | None, backend: str = "gloo") -> Any:
    return SimpleNamespace(
        world_size=size or Value(2, "default"),
        backend=Value(backend, "default"),
        timeout=Value(300.0, "default"),
    )


def _decide(
    item: _Item,
    world_size: int = 2,
    launcher: str = "torchrun",
    local: int | None = None,
    size: Value[int] | None = None,
) -> Step:
    rs = cast(RankSession, _rank_session(world_size, launcher, local))
    return decide(rs, cast(Settings, _settings(size)), cast(pytest.Item, item))


@pytest.fixture(autouse=True)
def _no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "0")
    monkeypatch.delenv("DISTRANK_FAKE_NCCL_VERSION", raising=False)


def test_an_ordinary_test_runs_on_rank_0_alone() -> None:
    assert _decide(_Item()) == Step("rank0")


def test_a_test_of_the_worlds_size_runs_on_every_rank_with_its_backend() -> None:
    assert _decide(_Item(pytest.mark.world_size(2))) == Step("all", backend="gloo")
    # A bare world_size() means the launched size...
    assert _decide(_Item(pytest.mark.world_size()), world_size=3) == Step("all", backend="gloo")


def test_a_bare_marker_takes_the_users_default_size_when_one_is_set() -> None:
    chosen = Value(4, "--distrank-world-size=4 (command line)")
    step = _decide(_Item(pytest.mark.world_size()), world_size=2, size=chosen)
    assert step == Step("skip", "needs world_size 4, this launched world has 2 ranks (torchrun)")


def test_a_larger_world_size_is_a_skip_naming_the_launched_world() -> None:
    # The skip test_launch.py's world of 2 shows, and a world of one.
    assert _decide(_Item(pytest.mark.world_size(4))) == Step(
        "skip", "needs world_size 4, this launched world has 2 ranks (torchrun)"
    )
    assert _decide(_Item(pytest.mark.world_size(2)), world_size=1) == Step(
        "skip", "needs world_size 2, this launched world has 1 rank (torchrun)"
    )


def test_a_smaller_world_size_runs_on_a_sub_world() -> None:
    # Where: rank 0's plan places it after every test is decided (test_subworld.py).
    step = _decide(_Item(pytest.mark.world_size(2)), world_size=4, launcher="slurm")
    assert step == Step("sub", backend="gloo", size=2)
    assert not step.runs_on(0)  # not placed yet


def test_init_process_group_false_runs_on_a_sub_world_even_at_the_launched_size() -> None:
    # Never the launcher's one store: env:// of its own per test (group.GroupKeeper).
    for size in (1, 2):
        step = _decide(_Item(pytest.mark.world_size(size, init_process_group=False)))
        assert step == Step("sub", backend="gloo", size=size, group="own")
        assert not step.home


class DistributedExec:
    """DeepSpeed's harness base, as ``_compat.ds_harness_base`` finds it (its methods named)."""

    is_dist_test = True

    def _launch_daemonic_procs(self) -> None: ...
    def _launch_non_daemonic_procs(self) -> None: ...
    def _dist_run(self) -> None: ...
    def _launch_with_file_store(self) -> None: ...


def test_a_deepspeed_test_taken_over_runs_on_a_home_sub_world() -> None:
    item = _Item(pytest.mark.world_size(2, init_process_group=False))
    item.cls = DistributedExec  # type: ignore[attr-defined]
    step = _decide(item, world_size=4)
    assert step == Step("sub", backend="gloo", size=2, group="deepspeed") and step.home
    # One the suites plugin did not take (--distrank-suites=own): DeepSpeed's own mark.
    item = _Item(pytest.mark.world_size(2))
    item.cls = DistributedExec  # type: ignore[attr-defined]
    step = _decide(item, world_size=4)
    assert step.kind == "skip" and "DeepSpeed DistributedTest not taken over" in step.reason


def test_a_simulated_world_runs_in_pool_mode_only() -> None:
    simulated = Simulated("fake", 8, 3)
    step = _decide(_Item(simulated=simulated), world_size=2, launcher="mpi")
    assert step == Step(
        "skip",
        "world size 8 simulated (fake, as rank 3) runs in pool mode only (pytest without a "
        "launcher); this is a launched world of 2 (mpi)",
    )


def test_a_bad_marker_or_timeout_is_an_error_naming_the_test() -> None:
    step = _decide(_Item(pytest.mark.world_size(0)))
    assert step.kind == "error"
    assert step.reason.startswith("test_x.py::test_x: @pytest.mark.world_size(0): world size 0")
    step = _decide(_Item(pytest.mark.world_size(2), pytest.mark.timeout("soon")))
    assert step.kind == "error"
    assert step.reason.startswith("test_x.py::test_x: @pytest.mark.timeout('soon'): ")
    item = _Item(pytest.mark.world_size(2))
    item.stash[SPEC_ERROR] = "a world_size marker on a class that spawns its own ranks"
    assert _decide(item) == Step(
        "error", "test_x.py::test_x: a world_size marker on a class that spawns its own ranks"
    )


def test_gpus_are_counted_on_the_ranks_own_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """nccl needs one GPU per rank of the node (the local world size), not of the world."""
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "2")
    monkeypatch.setenv("DISTRANK_FAKE_NCCL_VERSION", "2.21.5")
    nccl = pytest.mark.world_size(4, backend="nccl")
    assert _decide(_Item(nccl), world_size=4, local=2) == Step("all", backend="nccl")
    step = _decide(_Item(nccl), world_size=4, local=4)
    assert step.kind == "skip"
    assert "needs 4 GPUs (one per rank), 2 visible" in step.reason
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "0")
    step = _decide(_Item(pytest.mark.world_size(2), pytest.mark.requires_gpus(1)))
    assert step == Step("skip", "requires_gpus(1): needs 1 GPU, found 0")


def test_rank_0_applies_a_decision_for_a_test_the_others_do_not_run() -> None:
    item = cast(pytest.Item, _Item())
    with pytest.raises(pytest.fail.Exception, match=r"^bad marker$"):
        apply_on_rank0(item, Step("error", "bad marker"))
    with pytest.raises(pytest.skip.Exception, match=r"^not this world$"):
        apply_on_rank0(item, Step("skip", "not this world"))


def test_next_shared_is_the_next_test_every_rank_runs() -> None:
    items = [cast(pytest.Item, _Item()) for _ in range(4)]
    steps = (Step("all"), Step("rank0"), Step("skip", "no"), Step("all"))
    assert next_shared(steps, items, 0, 0) is items[3]
    assert next_shared(steps, items, 3, 0) is None


# -- the exchange: every rank's collection to rank 0, the plan back ------------------------------


class _Store:
    """The control store for the exchange (launch/channel.py), as a dict of JSON values; it
    never waits: a key that is not there was not sent."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        #: launch/auth.py's Auth: rank 0 removes the secret file once every rank's collection
        #: verified (counted here).
        self.forgotten = 0
        self.auth = SimpleNamespace(forget=self._forget)

    def _forget(self) -> None:
        self.forgotten += 1

    def put(self, key: str, value: object) -> None:
        self.values[key] = json.loads(json.dumps(value))

    def get(self, key: str, read: Callable[[object], T]) -> T:
        return read(self.values[key])

    def take(self, key: str, read: Callable[[object], T]) -> T:
        return read(self.values.pop(key))

    def wait_any(self, names: list[str], until: float | None, **_: object) -> str | None:
        return next((name for name in names if name in self.values), None)


def _exchange(store: _Store, rank: int, items: list[_Item]) -> Plan:
    rs = _rank_session(2)
    rs.channel, rs.rank, rs.log_path = store, rank, f"/run/rank{rank}.log"
    rs.launch = dataclasses.replace(rs.launch, rank=rank)
    session = SimpleNamespace(items=items)
    return exchange(
        cast(RankSession, rs), cast(Settings, _settings(None)), cast(pytest.Session, session)
    )


def _collected(store: _Store, items: list[_Item]) -> None:
    """Rank 1's collection, as it sends it."""
    nodeids = [item.nodeid for item in items]
    sent = {
        "nodeids": nodeids,
        "pid": 77,
        "host": "node1",
        "log": "/r1.log",
        "node": "1@node1",
        "local": 1,
    }
    store.put(keys.collect(1), sent)


def test_rank_0_plans_every_test_when_the_ranks_collected_the_same() -> None:
    items = [_Item(pytest.mark.world_size(2), name="test_a"), _Item(name="test_b")]
    store = _Store()
    _collected(store, items)
    plan = _exchange(store, 0, items)
    assert plan == Plan(
        None,
        (Step("all", backend="gloo"), Step("rank0")),
        (os.getpid(), 77),
        {0: "(rank 0 prints the report)", 1: "node1:/r1.log"},
        order=(0, 1),
        nodes=(0, 1),  # rank 1 said it is on another node
    )
    assert _exchange(store, 1, items) == plan  # what the other ranks read: the same plan
    assert store.forgotten == 1  # rank 0 removed the secret file: every rank has the secret


def test_a_collection_mismatch_is_an_error_and_no_test_is_planned() -> None:
    """test_launch.py's mismatch world shows it end to end: an error, not a hang."""
    items = [_Item(pytest.mark.world_size(2), name=n) for n in ("test_a", "test_b")]
    store = _Store()
    _collected(store, items[:1])
    plan = _exchange(store, 0, items)
    assert plan.steps == ()
    assert plan.error is not None
    assert plan.error.splitlines()[:3] == [
        "pytest-distrank: the ranks of this launched world (2 ranks, torchrun) collected "
        "different tests, so they cannot run them in lock-step; no test was run.",
        "Rank 0 collected 2 tests; rank(s) 1 collected others:",
        "  rank 1: 1 test; not 1 of rank 0's: test_x.py::test_b",
    ]


def test_a_rank_that_never_sends_its_collection_is_named() -> None:
    plan = _exchange(_Store(), 0, [_Item(name="test_a")])
    assert plan.error == (
        "pytest-distrank: rank(s) 1 did not report their collected tests within 120 s, so no test "
        "was run. They may have failed before collecting (a conftest.py or plugin that fails "
        "only there, an import error): see their output in the launcher's log."
    )


def test_a_rank_that_gets_no_plan_says_so_instead_of_running() -> None:
    plan = _exchange(_Store(), 1, [_Item(name="test_a")])
    assert plan.error == "pytest-distrank: rank 1/2 (torchrun): rank 0 sent no plan within 240 s"
    assert plan.steps == ()
