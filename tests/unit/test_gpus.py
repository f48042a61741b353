"""Unit tests of GPU leasing (pool/gpus.py) in this process, on fake GPUs.

The ``fake_gpus`` fixture (``tests/conftest.py``) sets the DISTRANK_FAKE_GPU_COUNT seam to four
GPUs and gives each test a private lock folder. The end-to-end runs of leasing are in
``tests/e2e/test_gpu_leasing.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_distrank.pool import gpus


def test_leases_in_one_process_are_disjoint(fake_gpus: Path) -> None:
    first = gpus.lease(3, str(fake_gpus), wait=0)
    second = gpus.lease(1, str(fake_gpus), wait=0)
    assert first.ids == ("0", "1", "2")
    assert second.ids == ("3",)
    with pytest.raises(gpus.GpuUnavailable, match=r"could not lease 1 of the 4 visible GPUs"):
        gpus.lease(1, str(fake_gpus), wait=0)
    first.release()
    assert gpus.lease(2, str(fake_gpus), wait=0).ids == ("0", "1")


def test_busy_message_names_the_holder(fake_gpus: Path) -> None:
    held = gpus.lease(4, str(fake_gpus), wait=0)
    with pytest.raises(gpus.GpuUnavailable) as excinfo:
        gpus.lease(2, str(fake_gpus), wait=0.3)
    message = str(excinfo.value)
    assert "within 0.3 s: 4 are held by other pytest processes" in message
    assert f"GPU 0: pid {os.getpid()} on " in message
    held.release()


def test_outer_cuda_visible_devices_names_the_gpus(
    fake_gpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7,GPU-ab12")
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "3")
    assert gpus.visible_gpu_ids() == ["5", "7", "GPU-ab12"]
    lease = gpus.lease(3, str(fake_gpus), wait=0)
    assert lease.cuda_visible_devices == "5,7,GPU-ab12"
    assert gpus.lock_path(str(fake_gpus), "GPU-ab12").name == "gpu-GPU-ab12.lock"
    lease.release()


GIB = 1 << 30


def test_memory_leases_share_a_gpu_while_the_sum_fits(
    fake_gpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "1")
    monkeypatch.setenv("DISTRANK_FAKE_GPU_MEMORY", "80GiB")
    first = gpus.lease(1, str(fake_gpus), wait=0, memory=30 * GIB)
    second = gpus.lease(1, str(fake_gpus), wait=0, memory=30 * GIB)
    assert first.ids == second.ids == ("0",)
    with pytest.raises(gpus.GpuUnavailable) as excinfo:
        gpus.lease(1, str(fake_gpus), wait=0, memory=30 * GIB)
    assert f"GPU 0: 2 shares hold 60.0 GiB of 80.0 GiB (pid {os.getpid()})" in str(excinfo.value)
    with pytest.raises(gpus.GpuUnavailable):
        gpus.lease(1, str(fake_gpus), wait=0)  # whole: not while shares live
    first.release()
    third = gpus.lease(1, str(fake_gpus), wait=0, memory=50 * GIB)
    second.release()
    third.release()
    whole = gpus.lease(1, str(fake_gpus), wait=0)
    with pytest.raises(gpus.GpuUnavailable):
        gpus.lease(1, str(fake_gpus), wait=0, memory=GIB)  # a share: not while it is held whole
    whole.release()
    assert sorted(p.name for p in fake_gpus.glob("*.share.*")) == []


def test_a_gpu_of_unknown_memory_is_leased_whole(
    fake_gpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "1")
    monkeypatch.setattr(gpus, "total_memory", lambda gpu: None)  # the driver does not say
    held = gpus.lease(1, str(fake_gpus), wait=0, memory=GIB)
    with pytest.raises(gpus.GpuUnavailable):
        gpus.lease(1, str(fake_gpus), wait=0, memory=GIB)
    held.release()
