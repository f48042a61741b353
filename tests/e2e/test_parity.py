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

CASES = """import dataclasses
import time

import numpy as np

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from pytest_distrank.rank import ownedgroups
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
    assert_close_across_ranks(torch.ones(3, 4) + rank * 1e-9, rtol=0, atol=1e-6)


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


@pytest.mark.world_size(2)
def test_int_masks_differ(rank):  # hostile-4 D1: a linear checksum passed these
    mask = torch.tensor([0, 1, 1, 0]) if rank == 0 else torch.tensor([1, 0, 0, 1])
    assert_differs_across_ranks(mask, name="ids")
    assert_equal_across_ranks(mask, name="mask")


@dataclasses.dataclass
class Step:
    loss: torch.Tensor
    step: int


@pytest.mark.world_size(2)
@pytest.mark.parametrize("what", ["numpy", "module", "dataclass"])
def test_non_containers_differ(rank, what):  # hostile-4 D2: compared by repr, they passed
    if what == "numpy":
        arr = np.full(5000, 0.5)
        arr[2500] += 6.5 * rank
        assert_equal_across_ranks({"arr": arr}, name="state")
    elif what == "module":
        torch.manual_seed(rank)
        assert_equal_across_ranks(torch.nn.Linear(4, 4), name="model")
    else:
        loss = torch.tensor(0.123456 + 1e-6 * rank)
        assert_close_across_ranks(Step(loss, 3), name="step", rtol=0, atol=0)


@pytest.mark.world_size(2)
def test_a_generator_on_one_rank_fails_both(rank):  # D2 and D11: refused, no peer left waiting
    torch.manual_seed(0)
    params = torch.nn.Linear(2, 2).parameters()
    assert_equal_across_ranks(params if rank == 1 else list(params), name="params")


@pytest.mark.world_size(2)
def test_conjugate_views(rank):  # hostile-4 D11: crashed on rank 0, rank 1 left in a broadcast
    x = torch.tensor([1 + 2j, 3 - 1j])
    v = x.conj() if rank == 0 else x.conj().resolve_conj()
    assert_close_across_ranks(v, name="conjsame")
    assert_equal_across_ranks(-v if rank else torch.neg(v).resolve_neg(), name="neg")


@pytest.mark.world_size(2)
def test_empty_compares_nothing(rank):  # hostile-4 D5
    assert_equal_across_ranks({}, name="state", allow_empty=True)
    assert_equal_across_ranks({"a": []}, name="state")


@pytest.mark.world_size(2)
def test_empty_against_the_reference(rank):
    assert_close_to_reference({}, reference(lambda: {}))


@pytest.mark.world_size(1)
def test_one_rank_differs_is_refused(rank):
    assert_differs_across_ranks(torch.zeros(3), name="one")


@pytest.mark.world_size(1)
def test_one_rank_tolerance_alone_is_refused(rank):  # attack-c 6: atol without rtol
    assert_close_across_ranks(torch.ones(2), atol=1e-3)


@pytest.mark.world_size(1)
def test_one_rank_equal_passes_and_says_so(rank):
    assert_equal_across_ranks(torch.zeros(3), name="one")


@pytest.mark.world_size(3)  # its pool's first check (no other test runs at world size 3)
@pytest.mark.timeout(40)
def test_rank_skips_the_check(rank):  # hostile-4 D14: the others waited for the deadline
    if rank != 2:
        assert_equal_across_ranks(torch.ones(2), name="w")


@pytest.mark.world_size(4)
@pytest.mark.timeout(40)
def test_rank_skips_a_subgroup_check(rank):  # D14: a subgroup's twin is made by its first check
    ownedgroups.MEET_WAIT = 2.0
    sub = dist.new_group([0, 1, 2])
    # Every member's side of the group connected before rank 1 destroys its own: without it,
    # rank 0 could still be connecting to rank 1 (gloo: "Connection closed by peer").
    dist.barrier()
    try:
        if rank in (0, 2):
            assert_equal_across_ranks(torch.ones(2), group=sub, name="w")
    finally:
        if rank != 3:
            dist.destroy_process_group(sub)


@pytest.mark.world_size(4)
@pytest.mark.timeout(40)
def test_members_hold_different_groups(rank):  # attack-c r1: the twin's hashed name differed
    g01 = dist.new_group([0, 1])
    g12 = dist.new_group([1, 2])
    try:
        if rank in (0, 1):
            assert_equal_across_ranks(torch.ones(2), group=g01)
        if rank in (1, 2):
            assert_equal_across_ranks(torch.ones(2), group=g12)
    finally:
        for g, members in ((g01, (0, 1)), (g12, (1, 2))):
            if rank in members:
                dist.destroy_process_group(g)


@pytest.mark.world_size(2)
@pytest.mark.parametrize("how", ["order", "check", "reference", "argument"])
def test_ranks_make_other_calls(rank, how):  # attack-c r12, r8, r7: paired by call order
    t = torch.ones(2)
    if how == "order":
        for n in (["w1", "w2"] if rank == 0 else ["w2", "w1"]):
            assert_equal_across_ranks(t, name=n)
    elif how == "check":
        (assert_equal_across_ranks if rank == 0 else assert_close_across_ranks)(t)
    elif how == "reference":
        if rank == 0:
            assert_equal_across_ranks(t)
        else:
            assert_close_to_reference(t, t + 1)
    else:
        assert_equal_across_ranks(t, equal_nan=rank == 0)


@pytest.mark.world_size(2)
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "uint16", "complex32", "subclass"])
def test_unpicklable_values_differ(rank, dtype):  # attack-c r3, blame: the table's gather crashed
    class Mine(torch.Tensor):  # local: pickle cannot find it
        pass

    if dtype == "subclass":
        t = torch.ones(2).as_subclass(Mine) * (1 + rank)
    else:
        t = torch.tensor([1 + rank, 2], dtype=torch.int32).to(getattr(torch, dtype))
    assert_equal_across_ranks(t, name="x")


@pytest.mark.world_size(2)
def test_empty_kinds_differ(rank):  # attack-c r4: {} equalled [], or nothing was compared
    assert_equal_across_ranks({"a": {}} if rank == 0 else {"a": []}, name="state")


@pytest.mark.world_size(2)
def test_nested_reference(rank):  # hostile-4 D19
    def inner():
        return torch.ones(2)

    def outer():
        return reference(inner) * 2

    reference(outer)


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


def failed_with(shared: Shared, test: str, *lines: str) -> pytest.LineMatcher:
    """``test`` failed, and its report shows ``lines`` (fnmatch patterns, in order)."""
    assert shared.outcome(test) == "failed"
    section = shared.section(test)
    section.fnmatch_lines(list(lines))
    return section


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
    leftovers = [line for line in parity.text.splitlines() if line.startswith("leftovers:")]
    # the checks' own groups are no leftover (a reference() of FSDP2 leaves a gloo socket
    # listening: the one-rank world's, another matter, named in the report of issue 37)
    assert not [line for line in leftovers if "group" in line or "test_reference" not in line]
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


def test_equality_is_exact_for_small_integers(parity: Shared) -> None:
    """hostile-4 D1: [0, 1, 1, 0] and [1, 0, 0, 1] passed a linear checksum; differs failed."""
    section = failed_with(
        parity,
        "test_int_masks_differ",
        "*assert_equal_across_ranks failed in test_cases.py::test_int_masks_differ: mask "
        "differs between ranks: no two ranks agree.*",
        "*mask differs on rank 1 at (0,): 1 there, 0 on rank 0",
    )
    section.no_fnmatch_line("*assert_differs_across_ranks failed*")  # ids do differ


@pytest.mark.parametrize(
    ("case", "lines"),
    [
        ("numpy", ["*state[[]'arr'] differs on rank 1 at (2500,): 7 there, 0.5 on rank 0"]),
        ("module", ["*model[[]'weight'] differs on rank 1 at (0, 0)*", "*model[[]'bias']:"]),
        ("dataclass", ["*step.loss differs on rank 1 at (): 0.123457 there, 0.123456 on rank 0"]),
    ],
)
def test_numpy_modules_and_dataclasses_are_compared_by_value(
    parity: Shared, case: str, lines: list[str]
) -> None:
    """hostile-4 D2: compared by repr, a numpy array differing in its middle, a module of other
    weights and a dataclass holding a tensor passed."""
    failed_with(parity, f"test_non_containers_differ[{case}]", *lines)


def test_a_value_one_rank_cannot_compare_fails_every_rank_at_once(parity: Shared) -> None:
    """hostile-4 D2 (generators refused) and D11's class: an error in one rank's part of a
    check fails every rank in it, naming that rank, and leaves no peer in a collective."""
    test = "test_a_generator_on_one_rank_fails_both"
    failed_with(
        parity,
        test,
        "  rank 0/2  failed in call: ParityUsageError: assert_equal_across_ranks failed in "
        "test_cases.py::test_a_generator_on_one_rank_fails_both: rank 1 could not take part*",
        "  rank 1/2  failed in call: ParityUsageError: params (generator) is an iterator: it "
        "can be read once*",
        "*pass a list (list(params)) or, for a model's parameters, "
        "dict(model.named_parameters()) or model.state_dict().",
    )
    assert seconds(parity, test) < 10
    assert "killed" not in "\n".join(parity.section(test).lines)


def test_conjugate_and_negative_views_are_compared_by_value(parity: Shared) -> None:
    """hostile-4 D11: a conjugate view crashed closeness on one rank."""
    assert parity.outcome("test_conjugate_views") == "passed"


def test_checks_that_compare_nothing_fail(parity: Shared) -> None:
    """hostile-4 D5: an empty value, an empty reference, differs on one rank all passed."""
    failed_with(
        parity,
        "test_empty_compares_nothing",
        "*assert_equal_across_ranks failed in test_cases.py::test_empty_compares_nothing: "
        "state compares nothing: it holds no tensor or value on any rank*allow_empty=True*",
    )
    failed_with(
        parity,
        "test_empty_against_the_reference",
        "*output compares nothing on ranks 0, 1: neither dist_out nor ref_out holds*",
    )
    failed_with(
        parity,
        "test_one_rank_differs_is_refused",
        "*ParityUsageError: assert_differs_across_ranks in test_cases.py::"
        "test_one_rank_differs_is_refused on a one-rank group (rank 0): one rank cannot "
        "show that ranks differ.*",
    )


def test_equality_on_one_rank_passes_with_a_warning(parity: Shared) -> None:
    assert parity.outcome("test_one_rank_equal_passes_and_says_so") == "passed"
    parity.result.stdout.fnmatch_lines(
        [
            "*UserWarning: assert_equal_across_ranks in test_cases.py::"
            "test_one_rank_equal_passes_and_says_so ran on a one-rank group (rank 0): there is "
            "no other rank to compare one with, so it compared nothing and passed.*"
        ]
    )


def test_a_rank_that_skips_the_pools_first_check_is_named_at_once(parity: Shared) -> None:
    """hostile-4 D14: the twin was made by the first check, in a rendezvous no verdict sees:
    the others waited for the deadline (40 s) and the blame went to a rank that called it."""
    test = "test_rank_skips_the_check"
    failed_with(
        parity, test, "distrank: * root cause: rank 2/3 never entered a check across ranks*"
    )
    assert seconds(parity, test) < 20


def test_a_rank_that_skips_a_subgroup_check_is_named(parity: Shared) -> None:
    """hostile-4 D14: a subgroup's twin is made by its first check; its members meet on the
    store first, and one that does not come is named (here after 2 s)."""
    test = "test_rank_skips_a_subgroup_check"
    failed_with(
        parity,
        test,
        "  rank 0/4  failed in call: TwinMeetingError: assert_equal_across_ranks on the "
        "group of ranks 0, 1, 2 in test_cases.py::test_rank_skips_a_subgroup_check: rank 1 "
        "did not call assert_equal_across_ranks within 2 s; ranks 0, 2 did.*",
        "  rank 1/4  passed",
    )
    assert seconds(parity, test) < 20


def test_members_holding_different_groups_check_a_subgroup(parity: Shared) -> None:
    """attack-c r1: the twin took torch's hashed name, which counts the groups each process
    holds: rank 1 (in two groups) and rank 0 (in one) waited in each other's rendezvous."""
    test = "test_members_hold_different_groups"
    assert parity.outcome(test) == "passed"
    assert seconds(parity, test) < 20


def test_ranks_that_make_other_calls_fail_together_naming_them(parity: Shared) -> None:
    """attack-c r12/r8/r7: checks paired by call order: rank 0's 'w1' passed against rank 1's
    'w2'; other checks crashed in all_gather; other arguments gave other verdicts."""
    head = "*ParityUsageError: A check across ranks in test_cases.py::test_ranks_make_other_calls"
    cases = {
        "order": "*  rank 1 called assert_equal_across_ranks(name='w2', equal_nan=False, "
        "allow_empty=False) where rank 0 called assert_equal_across_ranks(name='w1', *",
        "check": "*  rank 1 called assert_close_across_ranks(name='value', rtol=None, atol=None, "
        "*where rank 0 called assert_equal_across_ranks(name='value', *",
        "reference": "*  rank 1 called assert_close_to_reference(name='output', *where rank 0 "
        "called assert_equal_across_ranks(*",
        "argument": "*  rank 1 called assert_equal_across_ranks(name='value', equal_nan=False, "
        "allow_empty=False) where rank 0 called assert_equal_across_ranks(name='value', "
        "equal_nan=True, allow_empty=False)",
    }
    for how, line in cases.items():
        test = f"test_ranks_make_other_calls[{how}]"
        section = failed_with(parity, test, head + "*", line)
        assert "killed" not in "\n".join(section.lines)
        assert seconds(parity, test) < 20


def test_values_torch_cannot_pickle_still_get_the_table(parity: Shared) -> None:
    """attack-c r3/blame: the failure path gathered tensors with all_gather_object: float8,
    uint16 and complex32 raised AttributeError from pickling, a local subclass left the peer
    waiting in all_gather."""
    for dtype in ("float8_e4m3fn", "uint16", "complex32", "subclass"):
        test = f"test_unpicklable_values_differ[{dtype}]"
        section = failed_with(
            parity,
            test,
            "*AssertionError: assert_equal_across_ranks failed in test_cases.py::"
            f"test_unpicklable_values_differ[[]{dtype}[]]: x differs between ranks*",
            "*x differs on rank 1 at (0,): 2* there, 1* on rank 0*",
        )
        assert "killed" not in "\n".join(section.lines)


def test_a_tolerance_without_the_other_is_refused_on_one_rank_too(parity: Shared) -> None:
    """attack-c 6: torch.testing.assert_close refuses atol without rtol; so do the checks, on a
    group of any size (on more ranks in each rank's own part, so all fail together)."""
    failed_with(
        parity,
        "test_one_rank_tolerance_alone_is_refused",
        "*ParityUsageError: atol was given without rtol: pass both or neither*",
    )


def test_an_empty_mapping_differs_from_an_empty_list(parity: Shared) -> None:
    """attack-c r4: every empty container was one leaf ({} equalled []), and values that
    differ only in their empty containers read "compares nothing"."""
    section = failed_with(
        parity,
        "test_empty_kinds_differ",
        "*state differs between ranks*",
        "*state[[]'a'[]] on rank 1: type differs, empty; empty mapping on rank 0*",
    )
    assert not any("compares nothing" in line for line in section.lines)


def test_a_nested_reference_is_refused(parity: Shared) -> None:
    """hostile-4 D19: a torch error ('A process group is already registered')."""
    test = "test_nested_reference"
    failed_with(
        parity,
        test,
        "*ParityUsageError: reference(inner) inside reference(outer) in test_cases.py::"
        "test_nested_reference: the outer function already runs at world size 1*",
    )
