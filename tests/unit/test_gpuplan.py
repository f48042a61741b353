"""Unit tests of the GPU plan (gpuplan.py): one GPU per rank, shared GPUs on opt-in, or a skip
that names the counts, the NCCL version and the option that would run the test."""

from __future__ import annotations

import pytest

from pytest_distrank.planning.gpuplan import (
    LAUNCHED,
    MULTI_RANK_ENV,
    STRICT,
    GpuPlan,
    GpuPolicy,
    describe_policy,
    nccl_version,
    parse_version,
    plan_gpus,
)
from pytest_distrank.pool.pools.poolkey import PoolKey

SHARE = GpuPolicy(oversubscribe=True, oversubscribe_source="--distrank-gpu-oversubscribe")
SHARE_OR_GLOO = GpuPolicy(True, "gloo", "DISTRANK_GPU_OVERSUBSCRIBE=1 (environment)")


def plan(
    ws: int, visible: int, policy: GpuPolicy = STRICT, nccl: tuple[int, ...] | None = (2, 21, 5)
) -> GpuPlan | str:
    return plan_gpus(ws, "nccl", False, 0, visible, policy, lambda: nccl)


def test_cpu_tests_lease_only_what_requires_gpus_asks() -> None:
    assert plan_gpus(4, "gloo", False, 1, 0, STRICT) == GpuPlan(1, "gloo")


def test_enough_gpus_one_per_rank() -> None:
    assert plan(4, 8) == GpuPlan(4, "nccl")


def test_fewer_gpus_than_ranks_skip_naming_the_option() -> None:
    assert plan(4, 2) == (
        "backend 'nccl' needs 4 GPUs (one per rank), 2 visible; --distrank-gpu-oversubscribe "
        "lets 4 ranks share 2 GPUs"
    )
    assert plan_gpus(2, "nccl", True, 0, 1, STRICT) == (
        "requires_nccl: needs NCCL and 2 GPUs (one per rank), 1 visible; "
        "--distrank-gpu-oversubscribe lets 2 ranks share 1 GPU"
    )


def test_under_a_launcher_the_skip_offers_no_option() -> None:
    assert plan(4, 2, LAUNCHED) == "backend 'nccl' needs 4 GPUs (one per rank), 2 visible"


def test_no_gpu_at_all_is_a_skip_even_with_oversubscription() -> None:
    assert plan(2, 0, SHARE_OR_GLOO) == "backend 'nccl' needs 2 GPUs (one per rank), 0 visible"


def test_nccl_2_30_shares_gpus_with_the_switch_set() -> None:
    assert plan(4, 2, SHARE, (2, 30, 0)) == GpuPlan(2, "nccl", "nccl", ((MULTI_RANK_ENV, "1"),))
    assert plan(4, 1, SHARE, (2, 31, 2)) == GpuPlan(1, "nccl", "nccl", ((MULTI_RANK_ENV, "1"),))


def test_older_nccl_skips_saying_which_and_what_would_run_it() -> None:
    reason = plan(4, 2, SHARE, (2, 29, 9))
    assert isinstance(reason, str)
    assert "NCCL 2.29.9 cannot run several ranks on one GPU" in reason
    assert "--distrank-gpu-fallback=gloo runs the test with gloo" in reason


def test_older_nccl_falls_back_to_gloo_when_allowed() -> None:
    assert plan(4, 2, SHARE_OR_GLOO, (2, 21, 5)) == GpuPlan(2, "gloo", "gloo")
    assert plan(2, 1, SHARE_OR_GLOO, None) == GpuPlan(1, "gloo", "gloo")


def test_ranks_go_round_robin_over_the_lease() -> None:
    key = PoolKey(4, "nccl", True, gpus=2, gpu_share="nccl")
    assert [key.cuda_device(r) for r in range(4)] == [0, 1, 0, 1]
    assert PoolKey(2, "nccl", True, gpus=2).cuda_device(1) == 1
    assert PoolKey(2, "gloo", True, gpus=1).cuda_device(1) == -1  # requires_gpus: CPU device
    assert PoolKey(2, "gloo", True, gpus=1, gpu_share="gloo").cuda_device(1) == 0
    assert "4 ranks on 2 GPUs, NCCL multi-rank (NCCL_MULTI_RANK_GPU_ENABLE=1)" in key.describe()


def test_the_header_says_which_mode_is_in_force() -> None:
    assert describe_policy(STRICT, (2, 30, 0)) == ""
    assert describe_policy(SHARE, (2, 30, 1)) == (
        "GPU oversubscription on (--distrank-gpu-oversubscribe): NCCL 2.30.1 runs several ranks "
        "per GPU (NCCL_MULTI_RANK_GPU_ENABLE=1)"
    )
    assert describe_policy(SHARE_OR_GLOO, (2, 21, 5)).endswith(
        ": NCCL 2.21.5 cannot put several ranks on one GPU; shared GPUs run gloo on CUDA tensors"
    )
    assert describe_policy(SHARE, None).endswith(
        ": no NCCL found; it cannot put several ranks on one GPU; tests with fewer GPUs than "
        "ranks skip"
    )


def test_the_nccl_version_seam(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_NCCL_VERSION", "2.30.1")
    assert nccl_version() == (2, 30, 1)
    assert parse_version("2.21.5") == (2, 21, 5)
    with pytest.raises(ValueError):
        parse_version("two")
