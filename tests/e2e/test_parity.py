"""End-to-end: the checks across ranks and the one-process reference (issue #31, items 1, 2).

One inner session holds every case, each a test of its own in one inner file (a session start
costs seconds); each outer test reads its case's outcome from the junit report and its lines from
the report section. The session runs with ``--distrank-leftovers=fail``: the plugin's own group
for the checks must never count as something a test left behind. Pools: world sizes 2 and 4.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from ..helpers import SharedSession
from .test_faults import JUNIT, Session, Shared, line_of

CASES = """import time

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from pytest_distrank import (
    assert_close_across_ranks,
    assert_close_to_reference,
    assert_differs_across_ranks,
    assert_equal_across_ranks,
    rank_inputs,
    reference,
)


@pytest.mark.world_size(4)
def test_equal_passes(rank, pg):
    before = pg._get_sequence_number_for_group()
    assert_equal_across_ranks({"w": torch.arange(6.0).reshape(2, 3), "step": 3, "tag": "a"})
    assert_equal_across_ranks(torch.tensor([float("nan"), 1.0]), equal_nan=True)
    assert pg._get_sequence_number_for_group() == before  # the test's group did not move


@pytest.mark.world_size(4)
def test_equal_fails_on_one_rank(rank):
    t = torch.arange(12.0).reshape(3, 4)
    if rank == 2:
        t[1, 2] += 0.5  # one rank only
    start = time.monotonic()
    try:
        assert_equal_across_ranks({"w": t, "step": 3}, name="state")
    finally:
        print(f"verdict after {time.monotonic() - start:.3f} s")


@pytest.mark.world_size(4)
def test_equal_fails_on_nan(rank):
    assert_equal_across_ranks(torch.tensor([1.0, float("nan")]))


@pytest.mark.world_size(4)
def test_close_passes(rank):
    assert_close_across_ranks(torch.ones(3, 4) + rank * 1e-9, atol=1e-6)


@pytest.mark.world_size(4)
def test_close_fails(rank):
    t = torch.ones(3, 4)
    if rank == 3:
        t[2, 0] = 1.01
    assert_close_across_ranks(t)


@pytest.mark.world_size(2)
def test_close_fails_on_shapes(rank):
    assert_close_across_ranks(torch.zeros(rank + 1, dtype=torch.float16))


@pytest.mark.world_size(4)
def test_differs_passes(rank):
    assert_differs_across_ranks(rank_inputs(None, (8,)))


@pytest.mark.world_size(4)
def test_differs_fails(rank):
    torch.manual_seed(0)  # the same "random" input on every rank
    assert_differs_across_ranks(torch.randn(8), name="batch")


@pytest.mark.world_size(2)
def test_group_without_this_rank(rank):
    solo = dist.new_group([0])
    try:
        assert_equal_across_ranks(torch.ones(1), group=solo)  # rank 1 is not in it
    finally:
        if rank == 0:
            dist.destroy_process_group(solo)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def fsdp_step(net, x):
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    torch.optim.SGD(net.parameters(), lr=0.1).zero_grad()
    out = net(x)
    out.pow(2).mean().backward()
    torch.optim.SGD(net.parameters(), lr=0.1).step()
    return {"out": out.detach(), **{n: p.full_tensor() for n, p in net.named_parameters()}}


def ddp_step(net, x):
    ddp = DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    out = ddp(x)
    out.pow(2).mean().backward()
    opt.step()
    return {"out": out.detach(), **{n: p.detach().clone() for n, p in net.named_parameters()}}


def global_batch(world_size):
    return torch.cat([rank_inputs(None, (4, 16), rank=r) for r in range(world_size)])


@pytest.mark.world_size(2)
def test_reference_matches_ddp(rank, world_size):
    ref = reference(ddp_step, model(), global_batch(world_size))
    ref["out"] = ref["out"][rank * 4 : (rank + 1) * 4]  # this rank's part of the batch
    assert_close_to_reference(ddp_step(model(), rank_inputs(None, (4, 16))), ref)


@pytest.mark.world_size(2, 4)
def test_reference_matches_fsdp2(rank, world_size, pg):
    before = pg._get_sequence_number_for_group()
    ref = reference(fsdp_step, model(), global_batch(world_size))
    assert pg._get_sequence_number_for_group() == before  # the reference used no test group
    assert dist.get_world_size() == world_size and dist.get_rank() == rank
    ref["out"] = ref["out"][rank * 4 : (rank + 1) * 4]
    assert_close_to_reference(fsdp_step(model(), rank_inputs(None, (4, 16))), ref)


@pytest.mark.world_size(4)
def test_reference_differs_on_one_rank(rank, world_size):
    ref = reference(fsdp_step, model(), global_batch(world_size))
    ref["out"] = ref["out"][rank * 4 : (rank + 1) * 4]
    x = rank_inputs(None, (4, 16))
    if rank == 1:
        x[2, 5] += 1.0  # a bug on one rank
    assert_close_to_reference(fsdp_step(model(), x), ref)


@pytest.mark.world_size(2)
def test_vacuous_parity_caught_by_the_guard(rank):
    def dead(x):  # a model whose output is zeros whatever it is given
        return torch.zeros_like(x) * x

    x = rank_inputs(None, (4,))
    assert_close_to_reference(dead(x), reference(dead, x))


@pytest.mark.world_size(4)
def test_healthy_after_the_checks(rank, pg):
    t = torch.ones(1)
    dist.all_reduce(t, group=pg)
    assert t.item() == 4
"""

PARITY = Session(
    "test_parity.PARITY",
    {"test_cases.py": CASES},
    ("-ra", "--distrank-leftovers=fail", "--distrank-timeout=60"),
)


@pytest.fixture
def parity(shared_session: SharedSession) -> Shared:
    return PARITY.run(shared_session)


def seconds(shared: Shared, test: str) -> float:
    """The junit time of ``test`` (the controller's wall time for it)."""
    root = ET.parse(shared.folder / JUNIT).getroot()
    return next(float(c.get("time", "0")) for c in root.iter("testcase") if c.get("name") == test)


def test_passing_checks_pass_and_leave_the_tests_groups_alone(parity: Shared) -> None:
    passing = (
        "test_equal_passes",
        "test_close_passes",
        "test_differs_passes",
        "test_healthy_after_the_checks",
    )
    assert parity.outcomes(*passing) == ["passed"] * 4
    assert "leftovers:" not in parity.text  # the checks' own group is no leftover
    assert parity.leftover == []


def test_a_difference_on_one_rank_fails_every_rank_with_the_table(parity: Shared) -> None:
    test = "test_equal_fails_on_one_rank"
    assert parity.outcome(test) == "failed"
    assert seconds(parity, test) < 10  # every rank got the verdict: nobody waited for a deadline
    line = line_of(CASES, '{"w": t, "step": 3}')
    parity.section(test).fnmatch_lines(
        [
            "distrank: all 4 ranks failed the same way (AssertionError at "
            f"test_cases.py:{line}); shown: rank 0/4",
            "*assert_equal_across_ranks failed in test_cases.py::test_equal_fails_on_one_rank: "
            "state differs between ranks: ranks 0, 1, 3 agree; rank 2 alone. Each rank is "
            "compared with rank 0 (of the largest group of agreeing ranks).",
            "*state[[]'w'] differs on rank 2 at (1, 2): 6.5 there, 6 on rank 0",
            "*state[[]'w']:",
            "*rank  shape, dtype    max abs err  max rel err  differing  first at  value  "
            "value on rank 0",
            "*0     (3, 4) float32  -  * reference",
            "*1     (3, 4) float32  0  * agrees",
            "*2     (3, 4) float32  0.5          0.0833       1/12       (1, 2)    6.5    6  "
            "* differs",
            "*3     (3, 4) float32  0  * agrees",
            "*What to do: find why rank 2 computed something else*",
        ]
    )
    parity.section(test).fnmatch_lines(["verdict after * s"])  # printed by each rank


def test_nan_is_unequal_unless_equal_nan(parity: Shared) -> None:
    assert parity.outcome("test_equal_fails_on_nan") == "failed"
    parity.section("test_equal_fails_on_nan").fnmatch_lines(
        [
            "*value holds NaN on ranks 0-3, and NaN equals nothing (torch.equal); pass "
            "equal_nan=True to count NaN as equal to NaN.",
            "*0     (2,) float32*reference; holds NaN (never equal)",
        ]
    )


def test_closeness_names_the_rank_and_element_out_of_tolerance(parity: Shared) -> None:
    assert parity.outcome("test_close_fails") == "failed"
    parity.section("test_close_fails").fnmatch_lines(
        [
            "*assert_close_across_ranks failed in test_cases.py::test_close_fails: value is not "
            "close to rank 0's on rank 3.",
            "*value differs on rank 3 at (2, 0): 1.01 there, 1 on rank 0",
            "*3     (3, 4) float32  0.01 * 1/12       (2, 0)    1.01   1  * differs",
        ]
    )


def test_differing_shapes_are_reported_as_such(parity: Shared) -> None:
    assert parity.outcome("test_close_fails_on_shapes") == "failed"
    parity.section("test_close_fails_on_shapes").fnmatch_lines(
        [
            "*value on rank 1: shape differs, (2,) float16; (1,) float16 on rank 0",
            "*0     (1,) float16  reference",
            "*1     (2,) float16  shape differs",
        ]
    )


def test_the_same_input_on_every_rank_is_caught(parity: Shared) -> None:
    assert parity.outcome("test_differs_fails") == "failed"
    parity.section("test_differs_fails").fnmatch_lines(
        [
            "*assert_differs_across_ranks failed in test_cases.py::test_differs_fails: batch is "
            "the same on ranks 0-3: a check that ranks agree would pass on such values whatever "
            "the code does.",
            "*1     (8,) float32  equal to ranks 0, 2, 3",
            "*Give each rank its own input: pytest_distrank.rank_inputs(seed, shape)*",
        ]
    )


def test_a_group_without_this_rank_is_that_tests_error(parity: Shared) -> None:
    test = "test_group_without_this_rank"
    assert parity.outcomes(test, "test_reference_matches_ddp") == ["failed", "passed"]
    parity.section(test).fnmatch_lines(
        [
            "distrank: 1 of 2 ranks failed; root cause: rank 1/2",
            "  rank 0/2  passed",
            "  rank 1/2  failed in call: ParityUsageError: assert_equal_across_ranks(group=...) "
            "on rank 1 in test_cases.py::test_group_without_this_rank: this rank is not a "
            "member of that group*",
        ]
    )


def test_the_reference_matches_ddp_and_fsdp2(parity: Shared) -> None:
    tests = (
        "test_reference_matches_ddp",
        "test_reference_matches_fsdp2[ws2]",
        "test_reference_matches_fsdp2[ws4]",
    )
    assert parity.outcomes(*tests) == ["passed"] * 3


def test_a_bug_on_one_rank_is_named_against_the_reference(parity: Shared) -> None:
    test = "test_reference_differs_on_one_rank"
    assert parity.outcome(test) == "failed"
    parity.section(test).fnmatch_lines(
        [
            "*assert_close_to_reference failed in test_cases.py::"
            "test_reference_differs_on_one_rank: output is not close to the reference on "
            "ranks 0-3.",
            "*output[[]'out'] differs on rank 1 at (2, *): * there, * on the reference",
            "*output[[]'out']:",
            "*0     (4, 4) float32  0 * agrees",
            "*1     (4, 4) float32 * differs",
            "*2     (4, 4) float32  0 * agrees",
        ]
    )


def test_a_vacuous_parity_is_caught_by_the_guard(parity: Shared) -> None:
    test = "test_vacuous_parity_caught_by_the_guard"
    assert parity.outcome(test) == "failed"
    parity.section(test).fnmatch_lines(
        [
            "*output matches the reference on ranks 0, 1 only vacuously: both sides are all "
            "zeros (guard 'zeros'). Such a pair would match whatever the code computes.",
            "*0     (4,) float32 * both sides are all zeros (guard 'zeros')",
        ]
    )
