"""Unit tests of a rank's GPU checks (pool/worker/rankgpu.py): CUDA memory a test leaves, gloo's
refusals, and the size option's parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_distrank.parsing import parse_bytes, size_words
from pytest_distrank.pool.worker.rankgpu import CudaMemory, gloo_cannot

MIB = 1024 * 1024


def test_growth_above_the_steady_state_is_named_then_past_the_limit_replaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allocated = tmp_path / "allocated"
    monkeypatch.setenv("DISTRANK_FAKE_CUDA_ALLOCATED_FILE", str(allocated))
    memory = CudaMemory(0, limit=100 * MIB)
    seen = []
    for held in (50, 50, 114, 80, 200):  # first test: the steady state (a model fixture)
        allocated.write_text(str(held * MIB))
        seen.append(memory.after_test())
    assert seen[:2] == [("", ""), ("", "")]
    assert seen[2] == ("left 64 MiB of CUDA memory allocated", "")
    assert seen[3] == ("", "")  # freed some: nothing left by this test
    note, unfit = seen[4]
    assert note == "left 120 MiB of CUDA memory allocated"
    assert unfit == (
        "left the rank holding 150 MiB of CUDA memory above its steady state (50 MiB after its "
        "first test), past the limit of 100 MiB (--distrank-cuda-growth)"
    )


def test_no_cuda_no_question(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISTRANK_FAKE_CUDA_ALLOCATED_FILE", raising=False)
    assert CudaMemory(0, limit=1).after_test() == ("", "")  # CPU torch: CUDA never initialised


def test_gloo_refusals_name_the_op() -> None:
    assert gloo_cannot("ProcessGroupGloo::alltoall_base: unsupported device type cuda") == (
        "alltoall_base"
    )
    assert gloo_cannot("RuntimeError: Backend gloo does not support reduce_scatter") == (
        "reduce_scatter"
    )
    assert gloo_cannot("ProcessGroupGloo::allreduce: unsupported layout") is None
    assert gloo_cannot("assert 1 == 2") is None


def test_sizes() -> None:
    assert parse_bytes("1GiB") == 1 << 30
    assert parse_bytes("512 MiB") == 512 << 20
    assert parse_bytes("2GB") == 2 * 10**9
    assert parse_bytes("0") == 0
    with pytest.raises(ValueError, match="expected a size such as 512MiB"):
        parse_bytes("lots")
    assert size_words(1536 * MIB) == "1.5 GiB"
    assert size_words(3) == "3 bytes"
