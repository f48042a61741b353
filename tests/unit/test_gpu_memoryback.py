"""Unit tests of GPU memory back before the next lease (pool/pools/memoryback.py).

The verdict (:func:`memoryback.judge`) is property-tested; the wait runs on a fake clock and a
fake reading of the GPUs' use; the ``DISTRANK_FAKE_GPU_USED_DIR`` seam of
:func:`gpumemory.used_memory` is read from files. The end-to-end run is in
``tests/e2e/test_gpu_leasing.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.pool.pools import gpumemory, gpus, memoryback
from pytest_distrank.pool.pools.memoryback import TOLERANCE, MemoryWatch, judge
from pytest_distrank.pool.pools.poolkey import PoolKey
from pytest_distrank.settings import Value

GIB = 2**30
used_bytes = st.integers(min_value=0, max_value=200 * GIB)


@given(used_bytes, st.lists(used_bytes, min_size=1, max_size=20), st.integers(0, GIB))
def test_back_is_the_last_sample_within_the_tolerance(
    baseline: int, samples: list[int], tolerance: int
) -> None:
    verdict = judge(baseline, samples, tolerance)
    assert verdict.back == (samples[-1] <= baseline + tolerance)
    assert verdict.held == max(0, samples[-1] - baseline)
    assert verdict.falling == (max(samples) - samples[-1] > tolerance)


@given(used_bytes, st.lists(used_bytes, min_size=1, max_size=20), used_bytes)
def test_more_memory_held_never_makes_it_back(baseline: int, samples: list[int], more: int) -> None:
    raised = [*samples[:-1], samples[-1] + more]
    if judge(baseline, raised).back:
        assert judge(baseline, samples).back
    assert judge(baseline, raised).held >= judge(baseline, samples).held


@given(used_bytes, st.lists(used_bytes, max_size=20), used_bytes)
def test_only_the_last_sample_decides_back(baseline: int, before: list[int], last: int) -> None:
    assert judge(baseline, [*before, last]).back == judge(baseline, [last]).back
    assert judge(baseline, []).back


class FakeGpus:
    """GPUs whose use follows a script: ``script[gpu]`` is read once per reading (the last value
    stays); a clock that only the wait's sleeps move."""

    def __init__(self, script: dict[str, list[int | None]]) -> None:
        self.script = script
        self.now = 0.0
        self.reads: list[str] = []

    def read(self, gpu: str) -> int | None:
        self.reads.append(gpu)
        values = self.script[gpu]
        return values.pop(0) if len(values) > 1 else values[0]

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _watch(fake: FakeGpus, wait: float, notes: list[str]) -> MemoryWatch:
    return MemoryWatch(Value(wait, "default"), notes, fake.read, lambda: fake.now, fake.sleep)


def test_first_lease_records_the_baseline_and_does_not_wait() -> None:
    fake, notes = FakeGpus({"0": [GIB], "1": [2 * GIB]}), list[str]()
    watch = _watch(fake, 5.0, notes)
    assert watch.settle(["0", "1"], "pool") == 0.0
    assert watch.baselines == {"0": GIB, "1": 2 * GIB}
    assert notes == []


def test_next_lease_waits_until_the_memory_is_back() -> None:
    fake, notes = FakeGpus({"0": [GIB]}), list[str]()
    watch = _watch(fake, 5.0, notes)
    watch.settle(["0"], "pool")
    fake.script["0"] = [3 * GIB, 3 * GIB, 2 * GIB, GIB + TOLERANCE]
    waited = watch.settle(["0"], "pool")
    assert waited == pytest.approx(3 * memoryback.POLL_SECONDS)
    assert notes == []


def test_memory_not_back_in_time_is_noted_naming_the_gpu_the_amount_and_the_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    devices = tmp_path / "dev"
    devices.mkdir()
    monkeypatch.setenv("DISTRANK_FAKE_NVIDIA_DIR", str(devices))
    held = os.open(devices / "nvidia1", os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fake, notes = FakeGpus({"0": [GIB], "1": [GIB]}), list[str]()
        watch = _watch(fake, 2.0, notes)
        watch.settle(["0", "1"], "pool")
        fake.script["1"] = [3 * GIB]
        waited = watch.settle(["0", "1"], "world_size=2, backend=nccl, 2 GPUs")
    finally:
        os.close(held)
    assert waited == pytest.approx(2.0)
    assert len(notes) == 1
    assert notes[0].startswith(
        "GPU 1: 2.0 GiB of its memory still held 2.0 s after the pools before released it "
        "(it uses 3.0 GiB, 1.0 GiB when this session first leased it; tolerance 64 MiB); the "
        "pool world_size=2, backend=nccl, 2 GPUs started on it anyway\n"
    )
    assert f"  GPU 1 is held open by pid {os.getpid()} (" in notes[0]
    assert "What to do: end the process that holds it" in notes[0]


def test_memory_still_going_down_says_to_raise_the_wait() -> None:
    fake, notes = FakeGpus({"0": [GIB]}), list[str]()
    watch = _watch(fake, 0.3, notes)
    watch.settle(["0"], "pool")
    fake.script["0"] = [9 * GIB, 8 * GIB, 7 * GIB, 6 * GIB, 5 * GIB]
    watch.settle(["0"], "pool")
    assert "What to do: raise --distrank-gpu-memory-wait (0.3 s, from default)" in notes[0]
    assert "no process seen holding it" in notes[0]


def test_nvml_processes_are_named_and_host_pids_marked(monkeypatch: pytest.MonkeyPatch) -> None:
    unseen = 2**22 + 1  # above Linux's pid_max: no process here has it
    listed = [(os.getpid(), GIB), (unseen, 2 * GIB)]
    monkeypatch.setattr(memoryback, "gpu_processes", lambda gpu: listed)
    fake, notes = FakeGpus({"0": [GIB]}), list[str]()
    watch = _watch(fake, 0.2, notes)
    watch.settle(["0"], "pool")
    fake.script["0"] = [4 * GIB]
    watch.settle(["0"], "pool")
    assert f"\n  NVML: pid {os.getpid()} uses 1.0 GiB\n" in notes[0]
    assert f"  NVML: pid {unseen} uses 2.0 GiB (a pid this pid namespace does not see)" in notes[0]
    assert "no process seen" not in notes[0]


def test_no_wait_and_nothing_said_without_nvml() -> None:
    fake, notes = FakeGpus({"0": [None]}), list[str]()
    watch = _watch(fake, 5.0, notes)
    assert watch.settle(["0"], "pool") == 0.0
    assert watch.settle(["0"], "pool") == 0.0
    assert watch.baselines == {}
    assert notes == []


def test_a_wait_of_zero_reads_nothing() -> None:
    fake, notes = FakeGpus({"0": [GIB]}), list[str]()
    _watch(fake, 0.0, notes).settle(["0"], "pool")
    assert fake.reads == []


def test_used_memory_seam_reads_one_file_per_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_GPU_USED_DIR", str(tmp_path))
    (tmp_path / "0").write_text("1GiB\n")
    (tmp_path / "1").write_text("lots")
    assert gpumemory.used_memory("0") == GIB
    assert gpumemory.used_memory("1") is None
    assert gpumemory.used_memory("2") is None
    assert gpumemory.gpu_processes("0") == []


def test_no_nvml_here_reads_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISTRANK_FAKE_GPU_USED_DIR", raising=False)
    if gpumemory._nvml() is not None:
        pytest.skip("this machine has NVML")
    assert gpumemory.used_memory("0") is None
    assert gpumemory.gpu_processes("0") == []


def test_shares_do_not_wait_whole_leases_do(
    fake_gpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_GPU_MEMORY", "80GiB")
    fake = FakeGpus({g: [GIB] for g in "0123"})
    leases = gpus.SessionLeases(
        Value(str(fake_gpus), "test"), Value(0.0, "default"), _watch(fake, 5.0, [])
    )
    share = leases.take(PoolKey(1, "gloo", True, gpus=1, gpu_memory=GIB), "share")
    assert share is not None and fake.reads == []
    share.release()
    whole = leases.take(PoolKey(1, "gloo", True, gpus=2), "whole")
    assert whole is not None and fake.reads == ["0", "1"]
    whole.release()
