"""Unit: GPU tiers (``--distrank-gpus``): the tier's parser, a test's GPU need from its spec and
the options (planning/tiers.py), declarations, and the words after collection."""

from __future__ import annotations

import fnmatch

import pytest

from pytest_distrank.parsing import GpuRange, parse_gpu_range
from pytest_distrank.planning.gpuplan import STRICT, GpuPolicy
from pytest_distrank.planning.spec import DistSpec
from pytest_distrank.planning.tiers import (
    declared_gpus,
    describe_selection,
    ordinary_need,
    spec_need,
    undeclared_note,
)

SHARE = GpuPolicy(oversubscribe=True)
SHARE_GLOO = GpuPolicy(oversubscribe=True, fallback="gloo")


@pytest.mark.parametrize(
    ("text", "low", "high"),
    [
        ("0", 0, 0),
        ("2", 2, 2),
        ("1-2", 1, 2),
        (" 1 - 4 ", 1, 4),
        (">=4", 4, None),
        ("4+", 4, None),
        (">3", 4, None),
        ("<=2", 0, 2),
        ("<2", 0, 1),
        ("3-3", 3, 3),
    ],
)
def test_tiers_parse(text: str, low: int, high: int | None) -> None:
    tier = parse_gpu_range(text)
    assert tier is not None
    assert (tier.low, tier.high) == (low, high)


def test_all_keeps_every_test() -> None:
    assert parse_gpu_range("all") is None
    assert parse_gpu_range("ALL") is None


@pytest.mark.parametrize("text", ["many", "1-", "-1", "1-2-3", ">=x", "=>4", "1,2", "2.5", "+"])
def test_unknown_tier_expressions_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected a GPU tier: N, A-B, >=N \(or N\+\)"):
        parse_gpu_range(text)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "an empty tier selects no test*quote it, '>=4', or write 4+*"),
        ("3-1", "3-1 is an empty tier*write it low-high, e.g. 1-3"),
        ("<0", "<0 is an empty tier*"),
    ],
)
def test_empty_tiers_are_refused(text: str, words: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_gpu_range(text)
    assert fnmatch.fnmatch(str(info.value), words), str(info.value)


def test_a_tier_holds_counts_in_its_range() -> None:
    tier = GpuRange(1, 2, "1-2")
    assert [n in tier for n in range(4)] == [False, True, True, False]
    assert 100 in GpuRange(4, None, ">=4")
    assert "2" not in tier


@pytest.mark.parametrize(
    ("tier", "words"),
    [
        (GpuRange(0, 0, "0"), "0 GPUs"),
        (GpuRange(1, 1, "1"), "1 GPU"),
        (GpuRange(1, 2, "1-2"), "1 to 2 GPUs"),
        (GpuRange(4, None, ">=4"), "4 GPUs or more"),
        (GpuRange(1, None, "1+"), "1 GPU or more"),
    ],
)
def test_a_tier_in_words(tier: GpuRange, words: str) -> None:
    assert tier.describe() == words


def spec(ws: int, backend: str = "gloo", nccl: bool = False, gpus: int = 0) -> DistSpec:
    return DistSpec(ws, backend, True, nccl, gpus)


@pytest.mark.parametrize(
    ("the_spec", "policy", "need"),
    [
        (spec(4), STRICT, 0),  # gloo on the CPU
        (spec(2, gpus=3), STRICT, 3),  # requires_gpus(3) on a gloo test
        (spec(1, "nccl"), STRICT, 1),
        (spec(2, "nccl"), STRICT, 2),
        (spec(4, "nccl"), STRICT, 4),
        (spec(2, "nccl", nccl=True), STRICT, 2),  # requires_nccl
        (spec(2, "nccl", gpus=4), STRICT, 4),  # requires_gpus(4) beyond one per rank
        (spec(2, "cpu:gloo,cuda:nccl"), STRICT, 2),  # a mapping with nccl: one per rank
        (spec(4, "nccl"), SHARE, 1),  # oversubscribed: the ranks share one GPU
        (spec(4, "nccl"), SHARE_GLOO, 1),
        (spec(4, "nccl", gpus=2), SHARE, 2),  # requires_gpus(2) still counts
        (DistSpec(1, "fake", True, False, 0), STRICT, 0),  # a simulated world
    ],
)
def test_the_need_of_a_distributed_test(the_spec: DistSpec, policy: GpuPolicy, need: int) -> None:
    assert spec_need(the_spec, policy) == need


def test_a_memory_share_needs_its_gpus_all_the_same() -> None:
    """requires_gpus(1, memory=...) shares a GPU between pools: the test still needs one."""
    shared = DistSpec(1, "nccl", True, False, 1, gpu_memory=8 * 2**30)
    assert spec_need(shared, STRICT) == 1


def test_the_need_does_not_depend_on_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither the GPUs nor the NCCL this machine has change a need."""
    for count, version in (("0", ""), ("8", "2.21.5"), ("1", "2.30.1")):
        monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", count)
        monkeypatch.setenv("DISTRANK_FAKE_NCCL_VERSION", version)
        assert spec_need(spec(4, "nccl"), STRICT) == 4
        assert spec_need(spec(4, "nccl"), SHARE) == 1


@pytest.mark.parametrize(
    ("gpus", "nccl", "policy", "need"),
    [(0, False, STRICT, 0), (2, False, STRICT, 2), (0, True, STRICT, 1), (3, True, SHARE, 3)],
)
def test_the_need_of_an_ordinary_test(gpus: int, nccl: bool, policy: GpuPolicy, need: int) -> None:
    assert ordinary_need(gpus, nccl, policy) == need


def test_declared_needs() -> None:
    assert declared_gpus(4, "@pytest.mark.distrank_gpus(4)") == 4
    assert declared_gpus(0, "x") == 0
    for bad in (-1, True, "4", 2.0, (1, 2)):
        with pytest.raises(ValueError, match="where: expected a GPU count >= 0"):
            declared_gpus(bad, "where")


def test_the_words_after_collection() -> None:
    tier = GpuRange(1, 2, "1-2")
    assert describe_selection(tier, "--distrank-gpus=1-2 (command line)", 5, 12) == (
        "distrank: GPU tier 1-2 (--distrank-gpus=1-2 (command line)): 5 of 12 tests need 1 to 2 "
        "GPUs; 7 deselected"
    )
    assert undeclared_note({}) == ""
    note = undeclared_note({"TestB": 2, "TestA": 1})
    assert note.startswith("distrank: 3 tests of harness classes (TestA, TestB) declare no GPU")
    assert "@pytest.mark.distrank_gpus(N) or distrank_gpus = N on the class" in note
