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
