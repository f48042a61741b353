"""On a machine with an NVIDIA GPU: the plugin's CUDA and NCCL paths for real.

Skipped where CUDA is not available (CI never has a GPU). Run with ``bash gpu-check.sh`` on a GPU
machine (the script and its results: docs/gpus.md). Each case writes a test file and runs pytest
with the plugin in a subprocess, like the end-to-end tests; hang and crash cases carry
``@pytest.mark.timeout(10)`` so the run stays short. Written for one GPU: world sizes above the
GPU count go through oversubscription.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..helpers import RunPytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (run: bash gpu-check.sh, docs/gpus.md)"
)
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture(autouse=True)
def private_locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Leases in this test's own lock folder: another session on the machine is not waited for."""
    monkeypatch.setenv("DISTRANK_GPU_LOCK_DIR", str(tmp_path / "locks"))


def test_nccl_world_size_1_gets_its_gpu(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(
        test_one="""
        import torch, torch.distributed as dist, pytest

        @pytest.mark.world_size(1, backend="nccl")
        def test_sum(rank, device, pg):
            assert device == torch.device("cuda", 0)
            assert torch.cuda.current_device() == 0
            t = torch.ones(4, device=device)
            dist.all_reduce(t)
            assert t.sum().item() == 4
        """
    )
    run_pytest("-v").assert_outcomes(passed=1)


def test_requires_nccl_runs_or_skips_by_the_gpu_count(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        test_two="""
        import torch, torch.distributed as dist, pytest

        @pytest.mark.requires_nccl
        @pytest.mark.world_size(2)
        def test_pair(rank, device):
            t = torch.full((2,), float(rank), device=device)
            dist.all_reduce(t)
            assert t.tolist() == [1.0, 1.0]
        """
    )
    result = run_pytest("-rs")
    if GPUS >= 2:
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(skipped=1)
        result.stdout.fnmatch_lines(
            [
                "*requires_nccl: needs NCCL and 2 GPUs (one per rank), 1 visible; "
                "--distrank-gpu-oversubscribe lets 2 ranks share 1 GPU"
            ]
        )


def test_requires_gpus_leases_a_visible_gpu(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        test_lease="""
        import os, torch, pytest

        @pytest.mark.world_size(1)
        @pytest.mark.requires_gpus(1)
        def test_sees_one(rank):
            assert os.environ["CUDA_VISIBLE_DEVICES"] != ""
            assert torch.cuda.device_count() == 1
            torch.ones(1, device="cuda").sum().item()
        """
    )
    run_pytest().assert_outcomes(passed=1)


def test_gloo_with_cuda_tensors_at_world_size_2_on_one_gpu(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        test_gloo="""
        import torch, torch.distributed as dist, pytest

        @pytest.mark.world_size(2)
        def test_cuda_tensors(rank):
            t = torch.full((3,), float(rank + 1), device="cuda:0")
            dist.all_reduce(t)
            assert t.tolist() == [3.0, 3.0, 3.0]
        """
    )
    run_pytest().assert_outcomes(passed=1)


def test_oversubscription_runs_two_nccl_ranks_on_one_gpu(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        test_shared="""
        import torch, torch.distributed as dist, pytest

        @pytest.mark.world_size(2, backend="nccl")
        def test_shared(rank, device, backend):
            print("backend in force:", backend, "device:", device)
            t = torch.full((3,), float(rank + 1), device=device)
            dist.all_reduce(t)
            assert t.tolist() == [3.0, 3.0, 3.0]
        """
    )
    result = run_pytest("-s", "--distrank-gpu-oversubscribe", "--distrank-gpu-fallback=gloo")
    result.assert_outcomes(passed=1)
    # The header says which mode ran it: NCCL multi-rank (>= 2.30) or the gloo fallback.
    result.stdout.fnmatch_lines(["distrank: * GPU oversubscription on *"])


def test_leases_under_xdist(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(
        test_xdist="""
        import torch, pytest

        @pytest.mark.world_size(1)
        @pytest.mark.requires_gpus(1, memory="1GiB")
        @pytest.mark.parametrize("i", range(4))
        def test_small(rank, i):
            torch.ones(1 << 20, device="cuda").sum().item()
        """
    )
    run_pytest("-n", "2").assert_outcomes(passed=4)


def test_an_nccl_hang_fails_that_test_with_its_stack(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        test_hang="""
        import time, torch, torch.distributed as dist, pytest

        @pytest.mark.world_size(1, backend="nccl")
        @pytest.mark.timeout(10)
        def test_hang(rank, device):
            dist.all_reduce(torch.ones(1, device=device))
            time.sleep(120)

        @pytest.mark.world_size(1, backend="nccl")
        def test_after(rank, device):
            dist.all_reduce(torch.ones(1, device=device))
        """
    )
    result = run_pytest("-rf")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_hang*", "*time.sleep(120)*"])


def test_an_nccl_crash_names_the_signal(pytester: pytest.Pytester, run_pytest: RunPytest) -> None:
    pytester.makepyfile(
        test_crash="""
        import os, torch, torch.distributed as dist, pytest

        @pytest.mark.world_size(1, backend="nccl")
        @pytest.mark.timeout(10)
        def test_abort(rank, device):
            dist.all_reduce(torch.ones(1, device=device))
            os.abort()

        @pytest.mark.world_size(1, backend="nccl")
        def test_after(rank, device):
            dist.all_reduce(torch.ones(1, device=device))
        """
    )
    result = run_pytest("-rf")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*SIGABRT*"])


def test_cuda_memory_a_test_leaves_is_named(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(
        test_leak="""
        import torch, pytest

        KEPT = []

        @pytest.mark.world_size(1, backend="nccl")
        def test_a(rank, device):
            torch.ones(1, device=device)

        @pytest.mark.world_size(1, backend="nccl")
        def test_b_keeps_256_mib(rank, device):
            KEPT.append(torch.empty(64 << 20, device=device))  # 64 Mi float32 = 256 MiB
        """
    )
    result = run_pytest()
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["CUDA memory: test_leak.py::test_b_keeps_256_mib left 256 MiB of CUDA memory allocated*"]
    )
