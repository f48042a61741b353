"""Launcher mode, after collection: do all ranks have the same tests, and what runs where.

Runs in every rank of a launched world, in :func:`pytest_collection_finish` of
:class:`plugin.LaunchPlugin`. Every rank sends its ordered node ids to rank 0; rank 0 compares
them and, when they agree, decides for every test (:func:`decide`) whether all ranks run it, rank
0 alone runs it (no ``world_size`` marker), or rank 0 reports it skipped or errored without
running it. Its decisions travel back as the plan, so that every rank makes the same ones
(a GPU count read on one node only, say, can never split the ranks). Both directions are
sealed (:mod:`auth`): a collection or a plan that does not verify stops the run, naming its key.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import time

import pytest

from .. import _compat
from ..fixtures import rank_fixtures_used
from ..outcome.expectations import MARKER as EXPECT_MARKER
from ..outcome.expectations import POOL_ONLY
from ..planning.capabilities import check_ordinary_test
from ..planning.crossize import launcher_step
from ..planning.gpuplan import LAUNCHED
from ..planning.plan import ItemPlan, Rules, plan_item
from ..planning.spec import DistSpec
from ..settings import Settings, Value, item_timeout
from . import keys
from .channel import ChannelError
from .report import collection_mismatch, missing_collection
from .session import RankSession
from .subworld import World, home_slots, nodes_of, placement, schedule
from .widefix import refusals, wide_group_fixtures

#: The groups (:attr:`Step.group`) whose tests run on home sub-worlds only.
HOME = ("harness", "deepspeed")
#: Bound on the other ranks' collection, counted from rank 0's.
COLLECT_TIMEOUT = 120.0


@dataclasses.dataclass(frozen=True)
class Step:
    """Rank 0's decision for one test: ``all`` ranks run it, a sub-world of them (``sub``, with
    its :class:`subworld.World`), ``rank0`` only, ``skip``, ``error``."""

    kind: str
    reason: str = ""
    backend: str = ""
    #: ``sub``: the test's world size (before the plan places it), then where it runs.
    size: int = 0
    world: World | None = None
    #: Who makes the test's process group: the plugin (``plugin``); the test itself
    #: (``own``: ``world_size(..., init_process_group=False)``); on a home sub-world, the class
    #: of a test of PyTorch's harness classes (``harness``, :mod:`harness`) or the child's part of
    #: DeepSpeed's ``DistributedTest`` (``deepspeed``).
    group: str = "plugin"

    @property
    def home(self) -> bool:
        """Runs on a home sub-world (:func:`subworld.home_slots`): its rank is its GPU index."""
        return self.group in HOME

    def runs_on(self, rank: int) -> bool:
        """Does launched rank ``rank`` run this test (with its peers)?"""
        if self.kind == "all":
            return True
        return self.kind == "sub" and self.world is not None and rank in self.world.members


@dataclasses.dataclass(frozen=True)
class Plan:
    """The plan every rank follows; ``error`` says why no test runs."""

    error: str | None
    steps: tuple[Step, ...]
    #: Process ids of the ranks, by rank (for junit's per-rank properties).
    pids: tuple[int, ...]
    #: Where each rank logs, ``host:path``, by rank.
    logs: dict[int, str]
    #: The order the tests run in (indices into the collected order).
    order: tuple[int, ...] = ()
    #: Each rank's node number (:func:`subworld.nodes_of`).
    nodes: tuple[int, ...] = ()


def exchange(rs: RankSession, settings: Settings, session: pytest.Session) -> Plan:
    """Send this rank's node ids to rank 0 and get the plan back (rank 0: make it)."""
    channel = rs.channel
    nodeids = [item.nodeid for item in session.items]
    mine: keys.Collected = {
        "nodeids": nodeids,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "log": rs.log_path,
        "node": node_key(),
        "local": rs.launch.local_rank,
    }
    try:
        channel.put(keys.collect(rs.rank), mine)
        if rs.rank == 0:
            data = _make(rs, settings, session, nodeids)
            # Every rank's collection verified: each holds the secret, its file can go.
            channel.auth.forget()
            channel.put(keys.PLAN, data)
        else:
            until = time.monotonic() + 2 * COLLECT_TIMEOUT
            if channel.wait_any([keys.PLAN], until, watch_rank0=True) is None:
                raise ChannelError(f"rank 0 sent no plan within {2 * COLLECT_TIMEOUT:.0f} s")
            data = channel.get(keys.PLAN, keys.read_plan)
    except ChannelError as exc:
        return Plan(f"pytest-distrank: {rs.launch.label()}: {exc}", (), (), {})
    return Plan(
        error=data["error"],
        steps=tuple(_step_of(s) for s in data["steps"]),
        pids=tuple(int(p) for p in data["pids"]),
        logs={int(r): str(p) for r, p in data["logs"].items()},
        order=tuple(data["order"]),
        nodes=tuple(data["nodes"]),
    )


def node_key() -> str:
    """This rank's node, as the launcher numbers it (with the host: two agents on one machine
    are two nodes), else its host name."""
    host = socket.gethostname()
    number = os.environ.get("GROUP_RANK") or os.environ.get("SLURM_NODEID") or ""
    return f"{number}@{host}" if number else host


def _make(
    rs: RankSession, settings: Settings, session: pytest.Session, nodeids: list[str]
) -> keys.PlanData:
    channel = rs.channel
    deadline = time.monotonic() + COLLECT_TIMEOUT
    collected: dict[int, list[str]] = {0: nodeids}
    pids = {0: os.getpid()}
    logs = {0: "(rank 0 prints the report)"}
    node_keys = {0: node_key()}
    local_ranks = {0: rs.launch.local_rank}
    missing = []
    for rank in range(1, rs.world_size):
        key = keys.collect(rank)
        if channel.wait_any([key], deadline) is None:
            missing.append(rank)
            continue
        data = channel.take(key, keys.read_collected)
        collected[rank] = list(data["nodeids"])
        pids[rank] = int(data["pid"])
        logs[rank] = f"{data['host']}:{data['log']}"
        node_keys[rank] = data["node"]
        local_ranks[rank] = data["local"]
    who = f"{rs.world_size} ranks, {rs.launch.launcher}"
    if missing:
        error: str | None = missing_collection(missing, COLLECT_TIMEOUT)
    else:
        error = collection_mismatch(collected, who)
    nodes = nodes_of([node_keys.get(r, "?") for r in range(rs.world_size)])
    steps: list[Step] = []
    if not error:
        steps = [decide(rs, settings, item) for item in session.items]
        for i, why in refused(steps, session.items, rs.world_size).items():
            steps[i] = Step("skip", why)
    steps, order = place(steps, nodes, [local_ranks.get(r, -1) for r in range(rs.world_size)])
    return {
        "error": error,
        "steps": [_step_data(step) for step in steps],
        "order": order,
        "nodes": nodes,
        "pids": [pids.get(r, 0) for r in range(rs.world_size)],
        "logs": {str(rank): log for rank, log in logs.items()},
    }


def refused(steps: list[Step], items: list[pytest.Item], ws: int) -> dict[int, str]:
    """The sub-world tests that do not run for a wider fixture on the group (:mod:`widefix`)."""
    sizes = [step.size if step.kind == "sub" else None for step in steps]
    modules = [item.nodeid.split("::")[0] for item in items]
    return refusals(sizes, [wide_group_fixtures(item) for item in items], modules, ws)


def place(
    steps: list[Step], nodes: list[int], local_ranks: list[int] | None = None
) -> tuple[list[Step], list[int]]:
    """Where each sub-world test runs, and the order the tests run in (:mod:`subworld`); a
    harness class's test runs on a home sub-world (:func:`subworld.home_slots`, by each rank's
    ``local_ranks``; default: ranks numbered from 0 on each node), or is skipped where none
    has its size."""
    if local_ranks is None:
        local_ranks = [nodes[:r].count(node) for r, node in enumerate(nodes)]
    slots: dict[tuple[int, bool], list[tuple[int, ...]]] = {}
    steps = list(steps)
    for i, step in enumerate(steps):
        if step.kind != "sub":
            continue
        key = (step.size, step.home)  # an "own" test runs where the plugin's would
        if key not in slots:
            home = home_slots(nodes, local_ranks, step.size)
            slots[key] = home if step.home else placement(nodes, step.size)
        if not slots[key]:
            steps[i] = Step("skip", harness_does_not_fit(step.size, nodes, step.group))
    groups = [(s.size, s.home, s.backend, s.group) if s.kind == "sub" else None for s in steps]
    order, where = schedule(groups, lambda group: len(slots[group[:2]]))  # type: ignore[index]
    placed = list(steps)
    for i, (batch, slot, init) in where.items():
        world = World(slots[(steps[i].size, steps[i].home)][slot], batch, slot, init)
        placed[i] = dataclasses.replace(steps[i], world=world)
    return placed, order


def harness_does_not_fit(k: int, nodes: list[int], group: str = "harness") -> str:
    """Why a harness class's test of world size ``k`` is skipped: no node has ``k`` ranks."""
    most = max((nodes.count(node) for node in set(nodes)), default=0)
    what = "PyTorch's harness classes" if group == "harness" else "DeepSpeed's DistributedTest"
    return (
        f"a test of {what} of world size {k} runs on the ranks of one node "
        f"(its rank is its GPU index and its peers meet in a file); the nodes of this launched "
        f"world have at most {most} ranks. Run it with a launcher of {k} ranks per node, or "
        "without a launcher"
    )


def _step_data(step: Step) -> keys.StepData:
    world = step.world
    return {
        "kind": step.kind,
        "reason": step.reason,
        "backend": step.backend,
        "members": list(world.members) if world else [],
        "batch": world.batch if world else -1,
        "slot": world.slot if world else -1,
        "init": world.init if world else -1,
        "group": step.group,
    }


def _step_of(data: keys.StepData) -> Step:
    world = None
    if data["members"]:
        world = World(tuple(data["members"]), data["batch"], data["slot"], data["init"])
    size = len(data["members"])
    return Step(data["kind"], data["reason"], data["backend"], size, world, data["group"])


def decide(rs: RankSession, settings: Settings, item: pytest.Item) -> Step:
    """Rank 0's decision for one test (see :class:`Step`): planning's, with this mode's check."""
    ws = rs.world_size
    size = settings.world_size
    # A bare world_size() means the launched size, unless the user set a default size.
    default = ws if size.source == "default" else size.value
    rules = Rules(default, settings.backend.value, settings.timeout, LAUNCHED)
    world = functools.partial(_launched, ws, rs.launch.launcher)
    # GPUs are counted per node: a rank needs one on its own machine.
    got = plan_item(item, rules, rank_fixtures_used(item), world, rs.launch.local_world_size)
    if got.error or got.skip:
        return Step("error", got.error) if got.error else Step("skip", str(got.skip))
    if got.spec is not None:
        k = got.spec.world_size
        home = "harness" if harness_case(item) else "deepspeed" if deepspeed_case(item) else ""
        if home:  # on a home sub-world, even at the launched size (subworld.py)
            return Step("sub", backend=got.spec.backend, size=k, group=home)
        if not got.spec.init_process_group:  # a sub-world even at the launched size: env:// of
            # its own, never the launcher's one store (group.GroupKeeper.without_group)
            return Step("sub", backend=got.spec.backend, size=k, group="own")
        if k < ws:  # a sub-world of the launched one (subworld.py)
            return Step("sub", backend=got.spec.backend, size=k)
        return Step("all", backend=got.spec.backend)
    try:  # rank 0 runs an ordinary test itself, under its deadline
        item_timeout(item, settings.timeout)
    except ValueError as exc:
        return Step("error", f"{item.nodeid}: {exc}")
    crossize = launcher_step(item, ws, launcher=rs.launch.launcher)
    return Step(*crossize) if crossize is not None else Step("rank0")


def _launched(
    ws: int, launcher: str, item: pytest.Item, spec: DistSpec, timeout: Value[float]
) -> ItemPlan | None:
    """Launcher mode's own check of a distributed test (planning.plan.ModeCheck): what cannot run
    in this launched world of ``ws`` ranks."""
    crossize = launcher_step(item, ws, launcher)  # a fixture at another world size
    if crossize is not None:
        kind, why = crossize
        return ItemPlan(None, error=why) if kind == "error" else ItemPlan(spec, skip=why)
    if spec.simulated is not None:
        why = (
            f"{spec.simulated.describe()} runs in pool mode only (pytest without a launcher); "
            f"this is a launched world of {ws} ({launcher})"
        )
    elif item.get_closest_marker(EXPECT_MARKER) is not None:
        why = f"{EXPECT_MARKER} is pool mode only: {POOL_ONLY} ({launcher})"
    elif spec.world_size > ws:
        ranks = "rank" if ws == 1 else "ranks"
        # A mesh's size is the product of its dimensions: say which shape does not fit.
        shape = f"mesh {spec.mesh.id} " if spec.mesh is not None else ""
        why = (
            f"{shape}needs world_size {spec.world_size}, this launched world has {ws} {ranks} "
            f"({launcher})"
        )
    elif _compat.ds_harness_base(getattr(item, "cls", None)) and not deepspeed_case(item):
        why = (
            f"a DeepSpeed DistributedTest not taken over (--distrank-suites=own, or a "
            f"world_size marker of the plugin's with a group on it) runs in pool mode only "
            f"({launcher})"
        )
    else:
        return None
    return ItemPlan(spec, skip=why)


def harness_case(item: pytest.Item) -> bool:
    """Is ``item`` a test of PyTorch's harness classes (taken over by the pool's suites plugin,
    which the plugin's gate registers in launcher mode too: it has a ``world_size`` marker)?"""
    module = _compat.harness_module()
    cls = getattr(item, "cls", None)
    return (
        module is not None
        and isinstance(cls, type)
        and _compat.harness_kind(cls, module) is not None
    )


def deepspeed_case(item: pytest.Item) -> bool:
    """Is ``item`` a test of DeepSpeed's ``DistributedTest`` that the pool's suites plugin took
    over (one world size: it marked it ``world_size(k, init_process_group=False)``)?"""
    marker = item.get_closest_marker("world_size")
    return (
        _compat.ds_harness_base(getattr(item, "cls", None)) is not None
        and marker is not None
        and marker.kwargs.get("init_process_group") is False
    )


def apply_on_rank0(item: pytest.Item, step: Step) -> None:
    """Rank 0, in ``pytest_runtest_setup`` of a test the other ranks do not run."""
    if step.kind == "error":
        pytest.fail(step.reason, pytrace=False)
    if step.kind == "skip":
        raise _compat.skip_exception(step.reason)
    check_ordinary_test(item, rank_fixtures_used(item))


def next_shared(
    steps: tuple[Step, ...], items: list[pytest.Item], index: int, rank: int
) -> pytest.Item | None:
    """The next test that launched rank ``rank`` runs with its peers (``items`` and ``steps`` in
    the order they run): module and class fixtures stay set up for it. With no sub-worlds it is
    the next test that all ranks run, so fixtures are torn down the same way on every rank."""
    for later in range(index + 1, len(items)):
        if steps[later].runs_on(rank):
            return items[later]
    return None
