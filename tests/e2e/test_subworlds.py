"""End-to-end: a launched world runs every world size up to its own, on sub-worlds (issue 42).

Runs two torchrun agents on loopback as two nodes of two ranks each (``--nnodes=2
--nproc-per-node=2``, c10d rendezvous on a free port), each agent a subprocess of this (outer)
pytest process; every run has a timeout and must leave no process behind on either agent
(``launch_env``'s check). One launched world serves every test here: a mix of world sizes 1, 2, 3
and 4, a batch of sleeping tests of 2 ranks, tests that make their own group, classes of PyTorch's
harness and DeepSpeed's (on each node's two ranks), and last a sub-world that deadlocks beside one
that passes (it ends the run after its batch, so it is the last file). The files' texts are in
``subworld_files.py``; a world whose ranks die is ``test_subworld_deaths.py``'s. Placement and
packing have their properties in ``tests/unit/test_subworld.py``.
"""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from ..helpers import RunPytest, SharedSession, failure_section
from .subworld_files import HANG, HARNESS, MIX, OWN, SEED, SEEDED, SLEEP, SLEEPERS, WIDE
from .test_deepspeed_suites import TESTS as DS_TESTS
from .test_deepspeed_suites import pool_outcomes, write_ds
from .test_launch import Run, free_port, launch_env, pytest_args, start, write

__all__ = ["launch_env"]  # the fixture, used by the tests here


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
        "test_plain_after_three": "passed", "test_four": "passed", "test_plain": "passed",
        "test_two": "passed",
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
    result.assert_outcomes(passed=6, failed=1, errors=1)
    assert launched == Run([], [], pytester.path, 0.0).outcomes("test_a00_own", "own.xml")
    assert launched["test_own_pair[1]"] == "passed" and launched["test_own_four"] == "passed"
    assert launched["test_plain_after_own"] == "passed"  # M1: not the groups they left up
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
