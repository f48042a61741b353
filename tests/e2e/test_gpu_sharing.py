"""End-to-end: NCCL tests with fewer GPUs than ranks, on a machine without GPUs, through the
DISTRANK_FAKE_GPU_COUNT and DISTRANK_FAKE_NCCL_VERSION seams.

Without --distrank-gpu-oversubscribe such a test is skipped before any rank starts, naming the
counts and the option. With it, NCCL >= 2.30 puts ranks round-robin on the GPUs with
NCCL_MULTI_RANK_GPU_ENABLE=1, an older NCCL falls back to gloo where allowed, or skips naming the
version. The tests run with ``init_process_group=False`` where NCCL would have to start: they
check what each rank was given (its GPU, backend, environment), not NCCL itself, which
``tests/gpu/`` runs on a real GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..helpers import RunPytest

#: Each rank writes down what it was given.
RECORD = """
import os, pathlib, pytest

@pytest.mark.world_size(4, backend="nccl", init_process_group=False)
def test_given(rank, backend, device):
    pathlib.Path(f"rank{rank}").write_text(" ".join([
        backend,
        str(device),
        os.environ["CUDA_VISIBLE_DEVICES"],
        os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE", "-"),
    ]))
"""


def machine(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, gpus: int, nccl: str
) -> None:
    """This many fake GPUs and this NCCL version, and the recording test."""
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", str(gpus))
    monkeypatch.setenv("DISTRANK_FAKE_NCCL_VERSION", nccl)
    pytester.makepyfile(test_given=RECORD)


def given(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.glob("rank*"))}


def test_fewer_gpus_than_ranks_skip_naming_the_option(
    pytester: pytest.Pytester,
    run_pytest: RunPytest,
    fake_gpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine(pytester, monkeypatch, gpus=2, nccl="2.30.1")
    result = run_pytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [
            "SKIPPED [[]1[]] *: backend 'nccl' needs 4 GPUs (one per rank), 2 visible; "
            "--distrank-gpu-oversubscribe lets 4 ranks share 2 GPUs"
        ]
    )
    assert given(pytester.path) == {}


def test_nccl_2_30_puts_ranks_round_robin_with_the_switch(
    pytester: pytest.Pytester,
    run_pytest: RunPytest,
    fake_gpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine(pytester, monkeypatch, gpus=2, nccl="2.30.1")
    result = run_pytest("--distrank-gpu-oversubscribe")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "distrank: * GPU oversubscription on (--distrank-gpu-oversubscribe (command line)): "
            "NCCL 2.30.1 runs several ranks per GPU (NCCL_MULTI_RANK_GPU_ENABLE=1)"
        ]
    )
    assert given(pytester.path) == {
        "rank0": "nccl cuda:0 0,1 1",
        "rank1": "nccl cuda:1 0,1 1",
        "rank2": "nccl cuda:0 0,1 1",
        "rank3": "nccl cuda:1 0,1 1",
    }


def test_older_nccl_skips_naming_its_version_and_the_fallback(
    pytester: pytest.Pytester,
    run_pytest: RunPytest,
    fake_gpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine(pytester, monkeypatch, gpus=1, nccl="2.21.5")
    monkeypatch.setenv("DISTRANK_GPU_OVERSUBSCRIBE", "1")
    result = run_pytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [
            "distrank: * GPU oversubscription on (DISTRANK_GPU_OVERSUBSCRIBE=1 (environment)): "
            "NCCL 2.21.5 cannot put several ranks on one GPU; tests with fewer GPUs than ranks "
            "skip",
            "SKIPPED [[]1[]] *: backend 'nccl' needs 4 GPUs (one per rank), 1 visible; NCCL 2.21.5 "
            "cannot run several ranks on one GPU (NCCL 2.30 can, with "
            "NCCL_MULTI_RANK_GPU_ENABLE=1); --distrank-gpu-fallback=gloo runs the test with gloo "
            "on the same CUDA tensors",
        ]
    )


def test_older_nccl_falls_back_to_gloo_on_the_shared_gpus(
    pytester: pytest.Pytester,
    run_pytest: RunPytest,
    fake_gpus: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine(pytester, monkeypatch, gpus=2, nccl="2.21.5")
    result = run_pytest("--distrank-gpu-oversubscribe", "--distrank-gpu-fallback=gloo")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*shared GPUs run gloo on CUDA tensors"])
    assert given(pytester.path) == {
        "rank0": "gloo cuda:0 0,1 -",
        "rank1": "gloo cuda:1 0,1 -",
        "rank2": "gloo cuda:0 0,1 -",
        "rank3": "gloo cuda:1 0,1 -",
    }


def test_a_bad_fallback_value_names_the_option(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(test_given=RECORD)
    result = run_pytest("--distrank-gpu-fallback=mpi")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*invalid value 'mpi' for --distrank-gpu-fallback (ini: distrank_gpu_fallback, env: "
            "DISTRANK_GPU_FALLBACK), from --distrank-gpu-fallback=mpi (command line):",
            "*expected one of none, gloo",
        ]
    )
