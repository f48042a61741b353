"""End-to-end: a launched world runs every world size up to its own, on sub-worlds (issue 42).

Runs two torchrun agents on loopback as two nodes of two ranks each (``--nnodes=2
--nproc-per-node=2``, c10d rendezvous on a free port), each agent a subprocess of this (outer)
pytest process; every run has a timeout and must leave no process behind on either agent
(``launch_env``'s check). One launched world serves every test here: a mix of world sizes 1, 2, 3
and 4, a batch of sleeping tests of 2 ranks, classes of PyTorch's harness (on each node's two
ranks), and last a sub-world that deadlocks beside one that passes (it ends the run after its
batch, so it is the last file). Placement and packing have
their properties in ``tests/unit/test_subworld.py``.
"""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from ..helpers import RunPytest, SharedSession, failure_section
from .test_deepspeed_suites import TESTS as DS_TESTS
from .test_deepspeed_suites import pool_outcomes, write_ds
from .test_existing_suites import CONTINUOUS
from .test_launch import HEADER, Run, by_hand, free_port, launch_env, pytest_args, start, write

__all__ = ["launch_env"]  # the fixture, used by the tests here

#: The sizes of the launched world: what runs on one rank, a node, more than a node, all.
MIX = (
    HEADER
    + """
@pytest.mark.world_size(1)
@pytest.mark.parametrize("i", range(2))
def test_one(i, rank, world_size, pg):
    t = torch.ones(1)
    dist.all_reduce(t)  # the default group is the sub-world's
    assert (rank, world_size, dist.get_world_size(), t.item()) == (0, 1, 1, 1.0)
    assert os.environ["WORLD_SIZE"] == "1" and os.environ["RANK"] == "0"

@pytest.mark.world_size(3)
def test_three(rank, world_size, device):
    t = torch.ones(1, device=device)
    dist.all_reduce(t)
    assert (world_size, t.item()) == (3, 3.0)

@pytest.mark.world_size(4)
def test_four(rank, world_size, pg):
    t = torch.ones(1)
    dist.all_reduce(t, group=pg)
    assert (world_size, t.item(), os.environ["WORLD_SIZE"]) == (4, 4.0, "4")

def test_plain():
    pass

@pytest.mark.world_size(2)
def test_two(rank, world_size, dist_store):
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    assert (world_size, t.item()) == (2, 3.0)
    dist_store.set(f"k{rank}", "v")
    assert dist_store.get(f"k{1 - rank}") == b"v"  # the test's own key space, its own peer

@pytest.mark.world_size(2)
def test_two_fails_on_its_rank_1(rank):
    assert rank == 0, f"rank {rank} of the pair disagrees"
"""
)

#: Four tests of 2 ranks that sleep: two at a time in a launched world of 4.
SLEEP = 3.0
SLEEPERS = (
    HEADER
    + f"""
@pytest.mark.world_size(2)
@pytest.mark.parametrize("i", range(4))
def test_sleep(i, rank):
    start = time.time()
    time.sleep({SLEEP})
    here = os.path.dirname(__file__)
    with open(os.path.join(here, f"sleep{{i}}-{{rank}}.times"), "w") as out:
        out.write(f"{{start}} {{time.time()}}")
"""
)

#: The session seed of the launched world (``--distrank-seed``).
SEED = 4242

#: Two pairs at once; the second runs on launched ranks 2 and 3 and draws what a pool's ranks 0
#: and 1 draw (the seed is the sub-world rank's: the printed rerun puts it on ranks 0 and 1).
#: Then two pairs at once re-initialise their default group from the environment (env://).
SEEDED = (
    f"{HEADER}from pytest_distrank.rank.seeding import seed_of\n"
    + f"""
@pytest.mark.parametrize("i", [0, 1])
@pytest.mark.world_size(2)
def test_seeded_as_in_a_pool(i, rank, request):
    got = torch.randint(0, 2**30, (1,)).item()
    mine = torch.Generator().manual_seed(seed_of({SEED}, request.node.nodeid, rank, "call"))
    assert got == torch.randint(0, 2**30, (1,), generator=mine).item(), "another rank's seed"

@pytest.mark.world_size(2)
@pytest.mark.parametrize("val", [10, 1000])
def test_reinit_from_the_environment(val, rank):
    dist.destroy_process_group()
    dist.init_process_group("gloo")  # env://: each pair meets its own ranks only
    t = torch.tensor([float(val)])
    dist.all_reduce(t)
    assert (dist.get_world_size(), t.item()) == (2, 2.0 * val)
    dist.destroy_process_group()
"""
)

#: Tests that make their own group (``init_process_group=False``): no group of the plugin's, the
#: sub-world's RANK, WORLD_SIZE and MASTER_ADDR:MASTER_PORT (a port of its own per test: two pairs
#: at once, then a pair after a pair that left its group up), and at the launched size too.
OWN = (
    HEADER
    + """
def _own_world(rank, size):
    assert not dist.is_initialized()  # the plugin made no group
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == (str(rank), str(size))
    dist.init_process_group("gloo")  # env://
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    assert (dist.get_world_size(), t.item()) == (size, size * (size + 1) / 2)

@pytest.mark.world_size(2, init_process_group=False)
@pytest.mark.parametrize("i", range(2))
def test_own_pair(i, rank, world_size):
    _own_world(rank, world_size)
    dist.destroy_process_group()

@pytest.mark.world_size(2, init_process_group=False)
def test_own_left_up(rank):
    _own_world(rank, 2)  # the plugin destroys what the test left

@pytest.mark.world_size(2, init_process_group=False)
def test_own_fails_on_rank_1(rank):
    _own_world(rank, 2)
    assert rank == 0, f"rank {rank} of the own pair disagrees"

@pytest.mark.world_size(2, init_process_group=False)
def test_own_asks_for_pg(pg):
    pass

@pytest.mark.world_size(1, init_process_group=False)
def test_own_one(rank):
    _own_world(rank, 1)

@pytest.mark.world_size(4, init_process_group=False)
def test_own_four(rank):
    _own_world(rank, 4)
"""
)

#: A module fixture on the group whose teardown runs a collective keeps the module's sub-world
#: tests out (a sub-world would tear it down on some of its ranks only: a deadlock).
WIDE = (
    HEADER
    + """
@pytest.fixture(scope="module")
def modfix(rank):
    yield rank
    dist.barrier()

@pytest.mark.world_size(2)
def test_wide_two(modfix):
    pass
"""
)

#: A pair deadlocks (its rank 1 waits in a barrier its rank 0 never enters) beside a pair that
#: passes; the run ends after their batch: a rank stuck in its test cannot be taken out of it.
HANG = (
    HEADER
    + """
@pytest.mark.world_size(2)
@pytest.mark.timeout(60)
def test_z_deadlock(rank):
    if rank == 1:
        dist.barrier()

@pytest.mark.world_size(2)
def test_z_beside(rank):
    time.sleep(0.5)

@pytest.mark.world_size(4)
def test_z_after(rank):
    pass
"""
)


#: PyTorch's harness classes, unmodified: a MultiProcessTestCase, a MultiProcContinuousTest and a
#: DTensorTestBase of 2 ranks (each on one node's local ranks 0 and 1, two at a time), and one of
#: 4, which no node of 2 ranks can hold.
#: Collected first: the pairs of the other files, the deadlocked one among them, run as one run
#: of batches, after which the run ends.
HARNESS = (
    CONTINUOUS
    + """
import os
import unittest

from torch.distributed.tensor import Shard, distribute_tensor
from torch.testing._internal.common_distributed import MultiProcessTestCase
from torch.testing._internal.common_fsdp import FSDPTest
from torch.testing._internal.distributed._tensor.common_dtensor import DTensorTestBase, with_comms

LAUNCHER = ("RANK", "LOCAL_RANK", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK")


class Pairs(MultiProcessTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_sum(self):
        assert [name for name in LAUNCHER if name in os.environ] == []  # the harness's child's
        dist.init_process_group(
            "gloo", init_method=f"file://{self.file_name}", rank=self.rank, world_size=2
        )
        t = torch.ones(1) * (self.rank + 1)
        dist.all_reduce(t)
        dist.destroy_process_group()
        self.assertEqual(t.item(), 3.0)

    def test_fails_on_rank_1(self):
        self.assertEqual(self.rank, 0)

    def test_skips(self):
        raise unittest.SkipTest("not on this machine")


class Continuous(ContinuousBase):
    def test_a(self):
        t = torch.ones(1)
        dist.all_reduce(t)  # the class's own group, kept from its _init_pg
        self.assertEqual((t.item(), dist.get_world_size()), (2.0, 2))

    def test_b(self):
        dist.barrier()
        self.assertEqual(dist.get_rank(), self.rank)


class Mesh(DTensorTestBase):
    @property
    def world_size(self):
        return 2

    @with_comms
    def test_shard(self):
        t = distribute_tensor(torch.arange(4.0), self.build_device_mesh(), [Shard(0)])
        self.assertEqual((t.to_local().numel(), t.full_tensor().sum().item()), (2, 6.0))


class Sharded(FSDPTest):  # on CPU its _run exits with the "multi-gpu-2" skip code
    @property
    def world_size(self):
        return 2

    def test_fully_shard(self):
        from torch.distributed.fsdp import fully_shard

        fully_shard(torch.nn.Linear(4, 4))(torch.ones(2, 4)).sum().backward()


class Quads(MultiProcessTestCase):
    world_size = 4

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_four(self):
        pass
"""
)


def _two_agents(env: dict[str, str], folder: Path) -> Run:
    files = {"test_a_mix.py": MIX, "test_b_sleep.py": SLEEPERS, "test_0_harness.py": HARNESS}
    files.update({"test_c_seeded.py": SEEDED, "test_a0_wide.py": WIDE, "test_a00_own.py": OWN})
    write(folder, {**files, "test_z_hang.py": HANG})
    # Collected first: before the deadlock ends the run. Without TestSizes, whose harness runs
    # it on rank 0 alone (as in a pool's controller) in processes it starts: 11 s here.
    write_ds(folder, "test_0_ds.py", DS_TESTS.split("\n\nclass TestSizes")[0])
    endpoint, rdzv_id = f"127.0.0.1:{free_port()}", uuid.uuid4().hex[:8]
    cmds = [
        [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
            *pytest_args(
                folder, "--distrank-failure-grace=1", "--junitxml=j.xml", f"--distrank-seed={SEED}"
            ),
        ]
        for _ in range(2)
    ]  # fmt: skip
    return start(cmds, [env, env], folder)


_RUN: list[Run | str] = []


@pytest.fixture
def world(
    tmp_path_factory: pytest.TempPathFactory, launch_env: dict[str, str]
) -> Callable[[], Run]:
    """The launched world, run by the first test that asks (its leak check covers it), in a
    folder of its own (a test's own folder may hold a pool session's files)."""

    def get() -> Run:
        if not _RUN:
            try:
                _RUN.append(_two_agents(launch_env, tmp_path_factory.mktemp("world")))
            except (Exception, pytest.fail.Exception) as exc:
                _RUN.append(f"{type(exc).__name__}: {exc}")
        run = _RUN[0]
        if isinstance(run, str):
            pytest.fail(f"the launched world did not finish: {run}")
        return run

    return get


def _reporting(run: Run) -> int:
    reporting = [i for i, out in enumerate(run.outputs) if "test session starts" in out]
    assert len(reporting) == 1, run.outputs  # one report, on the node of rank 0
    return reporting[0]


@pytest.mark.timeout(300)
def test_every_size_runs_in_a_launched_world_of_four(world: Callable[[], Run]) -> None:
    run = world()
    assert run.codes == [1, 1], run.outputs
    assert run.outcomes("test_a_mix", "j.xml") == {
        "test_one[0]": "passed", "test_one[1]": "passed", "test_three": "passed",
        "test_four": "passed", "test_plain": "passed", "test_two": "passed",
        "test_two_fails_on_its_rank_1": "failure",
    }  # fmt: skip
    assert set(run.outcomes("test_b_sleep", "j.xml").values()) == {"passed"}
    out = _reporting(run)
    run.match(out, ["distrank: * world size 4 on 2 nodes, backend gloo, *"])
    # The pair's second sub-world is the second node's two ranks: named in both numberings.
    run.match(
        out,
        [
            "distrank: 1 of 2 ranks failed; root cause: rank 1/2 (launched rank 3, node 1)",
            "  rank 0/2 (launched rank 2, node 1)  passed",
            "  rank 1/2 (launched rank 3, node 1)  failed in call: AssertionError: rank 1 of the "
            "pair disagrees*",
            "FAILED test_a_mix.py::test_two_fails_on_its_rank_1 - [[]rank 1/2 (launched rank 3, "
            "node 1)[]] *",
        ],
    )
    # Its rank table once (brief A46 item 7: a replayed sub-world's was shown twice, the second
    # time in the sub-world's numbering only, under the root cause's traceback title).
    section = failure_section(run.outputs[out].splitlines(), "test_two_fails_on_its_rank_1")
    assert [line for line in section.lines if line.startswith("distrank: ")] == [
        "distrank: 1 of 2 ranks failed; root cause: rank 1/2 (launched rank 3, node 1)"
    ]
    run.match(1 - out, ["distrank: rank ?/4 (torchrun): report on rank 0; log in *"])
    # The rerun command says where it puts the test (issue 42 hostile pass 6).
    run.match(
        out,
        [
            "*torchrun --nnodes=2 --nproc-per-node=2 * test_a_mix.py::test_two_fails_on_its_rank*",
            "(it runs on launched ranks 0-1 there; here it ran on launched ranks 2, 3: the same "
            "ranks of its sub-world, seeded alike, but other local devices)",
        ],
    )


@pytest.mark.timeout(300)
def test_a_sub_worlds_ranks_draw_what_a_pools_ranks_draw(world: Callable[[], Run]) -> None:
    """Issue 42 hostile pass (D): the test on launched ranks 2, 3 drew other numbers than the
    printed rerun, which runs it on ranks 0, 1: ranks are seeded by their sub-world rank."""
    outcomes = world().outcomes("test_c_seeded", "j.xml")
    assert outcomes["test_seeded_as_in_a_pool[0]"] == "passed"
    assert outcomes["test_seeded_as_in_a_pool[1]"] == "passed"


@pytest.mark.timeout(300)
def test_two_pairs_reinitialise_from_the_environment_at_once(world: Callable[[], Run]) -> None:
    """Issue 42 hostile pass (P): both pairs destroyed their group and called
    init_process_group("gloo") (env://) at once; MASTER_ADDR:MASTER_PORT was the launcher's one
    store, so their keys met (gloo connection reset, a rank stuck). Each sub-world has its own."""
    outcomes = world().outcomes("test_c_seeded", "j.xml")
    assert outcomes["test_reinit_from_the_environment[10]"] == "passed"
    assert outcomes["test_reinit_from_the_environment[1000]"] == "passed"


@pytest.mark.timeout(300)
def test_a_module_fixture_on_the_group_keeps_its_sub_world_tests_out(
    world: Callable[[], Run],
) -> None:
    """Issue 42 hostile pass (B): a module fixture with a barrier in its teardown, used by a
    pair: the pair is skipped, saying why (its file comes first: test_z_hang's deadlock, packed
    with the pairs, ends the run before the tests after the pairs)."""
    run = world()
    assert run.outcomes("test_a0_wide", "j.xml") == {"test_wide_two": "skipped"}
    run.match(
        _reporting(run),
        [
            "SKIPPED [[]1[]] test_a0_wide.py:*: fixture modfix (wider than a test, used in "
            "test_a0_wide.py) requests the process group or a rank fixture: *world size 2 in a "
            "launched world of 4 runs on a sub-world, so it does not run here: run it in pool "
            "mode (pytest without a launcher), or give the fixture function scope",
        ],
    )


@pytest.mark.timeout(300)
def test_tests_that_make_their_own_group_run_as_in_a_pool(
    world: Callable[[], Run], run_pytest: RunPytest, pytester: pytest.Pytester
) -> None:
    """Brief A46 item 1: ``world_size(k, init_process_group=False)`` tests ran nowhere under a
    launcher (skipped); on sub-worlds with an env:// of their own, they have pool mode's
    outcomes for the same file."""
    launched = world().outcomes("test_a00_own", "j.xml")
    (pytester.path / "test_a00_own.py").write_text(OWN)
    result = run_pytest("test_a00_own.py", "--junitxml=own.xml", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5, failed=1, errors=1)
    assert launched == Run([], [], pytester.path, 0.0).outcomes("test_a00_own", "own.xml")
    assert launched["test_own_pair[1]"] == "passed" and launched["test_own_four"] == "passed"
    run = world()
    run.match(
        _reporting(run),
        ["  rank 1/2 (launched rank ?, node ?)  failed in call: AssertionError: rank 1 of the own "
         "pair disagrees*"],
    )  # fmt: skip


@pytest.mark.timeout(300)
def test_deepspeed_tests_run_on_home_sub_worlds_as_in_a_pool(
    world: Callable[[], Run], shared_session: SharedSession
) -> None:
    """Brief A46 item 2: DeepSpeed's ``DistributedTest`` (the look-alike harness of
    test_deepspeed_suites.py) ran nowhere under a launcher (skipped); on home sub-worlds its
    outcomes are those of the shared pool session of the same file."""
    run = world()
    classes = ("TestWarm", "TestFixtures", "TestUnpicklable")
    launched = {
        f"{cls}.{name}": outcome
        for cls in classes
        for name, outcome in run.outcomes(f"test_0_ds.{cls}", "j.xml").items()
    }
    pooled = pool_outcomes(shared_session)
    assert launched == {name: got for name, got in pooled.items() if "TestSizes" not in name}
    assert launched["TestWarm.test_all_reduce"] == "passed"
    assert launched["TestFixtures.test_fails_on_rank_1[7]"] == "failure"
    run.match(
        _reporting(run),
        ["  rank 1/2 (launched rank ?, node ?)  failed in call: AssertionError: rank 1 disagrees*"],
    )


@pytest.mark.timeout(300)
def test_a_batch_of_pairs_runs_two_at_a_time(world: Callable[[], Run]) -> None:
    run = world()
    spans = []
    for path in sorted(run.folder.glob("sleep*-*.times")):
        start_s, end_s = (float(x) for x in path.read_text().split())
        spans.append((start_s, end_s))
    assert len(spans) == 8, spans  # four tests, two ranks each
    wall = max(end for _, end in spans) - min(begin for begin, _ in spans)
    longest = max(end - begin for begin, end in spans)
    print(f"4 sleeping pairs: {wall:.2f} s from first start to last end; one: {longest:.2f} s")
    # Two batches of two: about 2 x 3 s (6.06 s measured on a loaded 2-core machine); one at a
    # time, as with every sub-world of one rank set, is 4 x 3 s (12.02 s measured).
    assert wall < 3.5 * SLEEP, f"4 sleeping pairs took {wall:.1f} s"


@pytest.mark.timeout(300)
def test_a_sub_world_that_deadlocks_ends_early_and_only_its_own_test(
    world: Callable[[], Run],
) -> None:
    run = world()
    assert run.outcomes("test_z_hang", "j.xml") == {
        "test_z_deadlock": "failure", "test_z_beside": "passed", "test_z_after": "skipped",
    }  # fmt: skip
    out = _reporting(run)
    # The root cause pool mode gives the same test, in both numberings, well before its deadline.
    run.match(
        out,
        [
            "distrank: 1 of 2 ranks failed; root cause: rank 0/2 (launched rank 0, node 0) never "
            "entered barrier #1 on the default group (rank 1 waits in it)",
            "*",
            "  rank 1/2 (launched rank 1, node 0)  waited in barrier #1 on the default group for "
            "rank 0; ended in call after * s: a deadlock (deadline was 60 s)",
        ],
    )
    run.match(
        out,
        [
            "SKIPPED [[]1[]] test_z_hang.py:*: not run: test_z_hang.py::test_z_deadlock left "
            "rank(s) 1 stuck (a proven deadlock): rank 1 in barrier #1 on the default group "
            "(blocked in barrier at *); a rank still inside its test cannot be taken out of it *",
        ],
    )


@pytest.mark.timeout(300)
def test_the_deadlock_has_the_root_cause_pool_mode_gives(
    world: Callable[[], Run], run_pytest: RunPytest, pytester: pytest.Pytester
) -> None:
    """Issue 42 item 3: the early verdict in a launched world's sub-world names the root cause
    that pool mode names for the same test, in the same words (and the launched numbering)."""
    launched = _root_cause(world().outputs[_reporting(world())], "test_z_deadlock")
    (pytester.path / "test_pool_hang.py").write_text(HANG)
    result = run_pytest("test_pool_hang.py::test_z_deadlock", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    pooled = _root_cause("\n".join(result.outlines), "test_z_deadlock")
    assert re.sub(r" \(launched rank \d+, node \d+\)", "", launched) == pooled
    assert pooled == (
        "distrank: 1 of 2 ranks failed; root cause: rank 0/2 never entered barrier #1 on the "
        "default group (rank 1 waits in it)"
    )


def _root_cause(output: str, test: str) -> str:
    """The head line of ``test``'s failure in a report."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("_") and f" {test} " in line)
    return next(line for line in lines[start:] if line.startswith("distrank: ") and "root" in line)


@pytest.mark.timeout(300)
def test_harness_classes_run_on_each_nodes_ranks_as_in_a_pool(
    world: Callable[[], Run], run_pytest: RunPytest, pytester: pytest.Pytester
) -> None:
    """Issue 42 item 2: PyTorch's harness classes in a launched world of two nodes, with the
    outcomes a pool session of the same file gives (its class of 4 aside: no node holds it)."""
    run = world()
    launched = {
        f"{cls}.{name}": outcome
        for cls in ("Pairs", "Continuous", "Mesh", "Sharded", "Quads")
        for name, outcome in run.outcomes(f"test_0_harness.{cls}", "j.xml").items()
    }
    assert launched.pop("Quads.test_four") == "skipped"
    (pytester.path / "test_0_harness.py").write_text(HARNESS)
    result = run_pytest("test_0_harness.py", "-k", "not Quads", "--junitxml=pool.xml", "-rs")
    result.assert_outcomes(passed=4, failed=1, skipped=2, deselected=1)
    pooled = Run([], [], pytester.path, 0.0)
    assert launched == {
        f"{cls}.{name}": outcome
        for cls in ("Pairs", "Continuous", "Mesh", "Sharded")
        for name, outcome in pooled.outcomes(f"test_0_harness.{cls}", "pool.xml").items()
    }
    assert launched == {
        "Pairs.test_sum": "passed", "Pairs.test_fails_on_rank_1": "failure",
        "Pairs.test_skips": "skipped", "Continuous.test_a": "passed", "Continuous.test_b": "passed",
        "Mesh.test_shard": "passed", "Sharded.test_fully_shard": "skipped",
    }  # fmt: skip
    out = _reporting(run)
    run.match(
        out,
        [
            "distrank: 1 of 2 ranks failed; root cause: rank 1/2 (launched rank *, node *)",
            "*",
            "  rank 1/2 (launched rank *, node *)  failed in call: AssertionError: Scalars are not "
            "equal!*",
        ],
    )
    run.match(
        out,
        [
            "SKIPPED [[]1[]] test_0_harness.py:*: a test of PyTorch's harness classes of world "
            "size 4 runs on the ranks of one node *; the nodes of this launched world have at "
            "most 2 ranks. *",
        ],
    )
    # FSDPTest on CPU: its _run's skip exit code, with the reason pool mode gives.
    fsdp_skip = "SKIPPED [[]1[]] test_0_harness.py:*: Need at least 2 CUDA devices"
    run.match(out, [fsdp_skip])
    result.stdout.fnmatch_lines([fsdp_skip])


#: Four sub-worlds of one rank at once in a world of four: launched rank 1 sleeps past its
#: deadline (in no collective), on rank 2 the process is killed (SIGKILL), on rank 3 it calls
#: os._exit(3); then a test of all four.
DIES = (
    HEADER
    + """import signal

SLEEPS = pytest.param("sleeps", marks=pytest.mark.timeout(3))

@pytest.mark.world_size(1)
@pytest.mark.parametrize("how", ["beside", SLEEPS, "killed", "exits"])
def test_dies(how, rank):
    time.sleep(0.2)  # its watchdog says it is in call (every 50 ms)
    if how == "sleeps":
        time.sleep(60)
    if how == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "exits":
        os._exit(3)
    time.sleep(0.5)

@pytest.mark.world_size(4)
def test_after(rank):
    pass
"""
)


@pytest.mark.timeout(300)
def test_a_sub_world_whose_rank_dies_fails_in_seconds(
    launch_env: dict[str, str], tmp_path: Path
) -> None:
    """Brief A46 item 4: a sub-world whose rank 0 died (a launcher that lets the others run on:
    srun, or this hand-made env:// world) failed only after the test's deadline (300 s), its
    failure grace and 30 s; now in seconds, naming the rank in both numberings and how its
    process ended, and the session ends with its report and exit code. Item 5: the rank left
    asleep in Python was said to be "stuck in a collective"."""
    write(tmp_path, {"test_dies.py": DIES})
    ranks = [
        {"RANK": str(r), "WORLD_SIZE": "4", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "4"}
        for r in range(4)
    ]
    run = by_hand(launch_env, tmp_path, ranks, "--junitxml=j.xml", "--distrank-failure-grace=1")
    assert run.codes == [1, 1, -9, 3], run.outputs
    assert run.outcomes("test_dies", "j.xml") == {
        "test_dies[beside]": "passed", "test_dies[sleeps]": "failure",
        "test_dies[killed]": "failure", "test_dies[exits]": "failure", "test_after": "skipped",
    }  # fmt: skip
    run.match(
        0,
        [
            "  rank 0/1 (launched rank 2, node 0)  stopped serving in call: launched rank 2 "
            "(pid * on *) sent no sign of life for ? s in call of test_dies.py::test_dies[[]killed"
            "[]]: its process killed by signal 9 (SIGKILL)*",
        ],
    )
    run.match(
        0,
        [
            "  rank 0/1 (launched rank 3, node 0)  stopped serving in call: launched rank 3 "
            "called os._exit(3) in test_dies.py::test_dies[[]exits[]]*",
        ],
    )
    run.match(
        0,
        [
            "SKIPPED [[]1[]] test_dies.py:*: not run: test_dies.py::test_dies[[]sleeps[]] left "
            "rank(s) 1 stuck (timeout): rank 1 in no collective (blocked in test_dies at "
            "test_dies.py:*); a rank still inside its test cannot be taken out of it *",
        ],
    )
    # Rank 0's session, from collection to its summary (the ranks' start is the machine's load).
    seconds = float(re.findall(r" in ([\d.]+)s", run.outputs[0])[-1])
    print(f"the launched world took {run.seconds:.1f} s, rank 0's session {seconds:.1f} s")
    assert seconds < 60, run.outputs  # deadline 300 s: it did not wait for it
