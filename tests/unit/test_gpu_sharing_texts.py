"""Unit tests of the gloo fallback's skip (pool/worker/rankgpu.py, ``GlooFallback``): an op gloo
cannot run on CUDA tensors turns the test's failure into a skip naming the op, the ranks and the
GPUs. ``tests/e2e/test_gpu_sharing.py`` shows it in a session of 4 ranks on 2 GPUs; here the
words for 2 ranks on 1 GPU, and what is left alone."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal, cast

import pytest
from pytest import TestReport

from pytest_distrank.pool.worker.rankgpu import GlooFallback


def _gloo_refuses() -> None:
    raise RuntimeError("ProcessGroupGloo::alltoall_base: unsupported device type cuda")


def _made(fallback: GlooFallback, error: BaseException | None) -> TestReport:
    """The report the wrapper makes of a failed call with ``error`` (raised in this file)."""
    excinfo = None
    if error is not None:
        try:
            raise error
        except BaseException:
            excinfo = pytest.ExceptionInfo.from_current()
    item = SimpleNamespace(location=("test_alltoall.py", 3, "test_alltoall"), path=Path(__file__))
    call = SimpleNamespace(excinfo=excinfo)
    outcome: Literal["passed", "failed"] = "failed" if error is not None else "passed"
    report = TestReport("test_alltoall.py::test_alltoall", item.location, {}, outcome, "E", "call")
    wrapper = cast(
        Generator[None, TestReport, TestReport],
        fallback.pytest_runtest_makereport(cast(pytest.Item, item), cast(Any, call)),
    )
    next(wrapper)
    with pytest.raises(StopIteration) as done:
        wrapper.send(report)
    return cast(TestReport, done.value.value)


def test_the_reason_names_the_ranks_and_gpus() -> None:
    assert GlooFallback(2, 1).why == (
        "this NCCL test ran with gloo (2 ranks on 1 GPU, --distrank-gpu-fallback=gloo)"
    )
    assert GlooFallback(4, 2).why == (
        "this NCCL test ran with gloo (4 ranks on 2 GPUs, --distrank-gpu-fallback=gloo)"
    )


def test_an_op_gloo_cannot_run_on_cuda_is_a_skip_naming_it() -> None:
    try:
        _gloo_refuses()
    except RuntimeError as exc:
        error = exc
    report = _made(GlooFallback(2, 1), error)
    assert report.outcome == "skipped"
    path, line, message = cast(tuple[str, int, str], report.longrepr)
    assert path == "test_alltoall.py"
    assert line == _gloo_refuses.__code__.co_firstlineno + 1  # the raising line, 1-based
    assert message == (
        "Skipped: gloo cannot run alltoall_base on CUDA tensors; this NCCL test ran with gloo "
        "(2 ranks on 1 GPU, --distrank-gpu-fallback=gloo). It needs NCCL >= 2.30 or one GPU per "
        "rank."
    )


def test_other_failures_and_passes_are_left_alone() -> None:
    failed = _made(GlooFallback(2, 1), AssertionError("assert 1 == 2"))
    assert (failed.outcome, failed.longrepr) == ("failed", "E")
    assert _made(GlooFallback(2, 1), None).outcome == "passed"
