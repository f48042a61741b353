"""A pool rank's GPU after each test: CUDA memory a test left allocated, and the skips of the
gloo fallback.

Runs in pool-mode rank processes (:mod:`main` calls :meth:`CudaMemory.after_test` after every
test, PyTorch's own suites included, and registers :class:`GlooFallback` in pools that run NCCL
tests with gloo, see gpuplan.py).

CUDA memory: the bytes ``torch.cuda.memory_allocated`` counts on the rank's device after its first
test are its steady state (session fixtures, a model a module fixture keeps); each later test
that ends with more than the test before it is named (a note in the controller's summary), and
when the rank holds more than the limit (``--distrank-cuda-growth``) above its steady state the
pool is replaced before the next test. Nothing is asked of CUDA unless the test initialised it.

CUDA memory reserved (the caching allocator's, ``torch.cuda.memory_reserved``) grows by design, so
it never makes a pool unfit: when a test leaves the rank reserving more than the same limit above
its steady state, the cache is released (``torch.cuda.empty_cache``) and named with what the test
left behind (rank/leftovers.py's summary line).

Test seams: ``DISTRANK_FAKE_CUDA_ALLOCATED_FILE`` and ``DISTRANK_FAKE_CUDA_RESERVED_FILE`` name
files whose numbers are taken as the bytes allocated and reserved (a release writes the steady
state's back to the second), so the rules are tested on machines without GPUs.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import pytest

from ...envvars import FAKE_ALLOCATED_ENV, FAKE_RESERVED_ENV
from ...parsing import size_words
from ..protocol import RankConfig


def _fake(env: str) -> int | None:
    try:
        with open(os.environ[env]) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return None


def _cuda() -> Any:
    """torch, where this process initialised CUDA (else None: nothing is asked of CUDA)."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.cuda.is_initialized() else None


def cuda_allocated(device: int) -> int | None:
    """Bytes PyTorch's allocator holds for tensors on ``device``; None where the process has
    not initialised CUDA (nothing is asked then)."""
    if os.environ.get(FAKE_ALLOCATED_ENV):
        return _fake(FAKE_ALLOCATED_ENV)
    torch = _cuda()
    return None if torch is None else int(torch.cuda.memory_allocated(max(device, 0)))


def cuda_reserved(device: int) -> int | None:
    """Bytes the caching allocator reserves on ``device`` (None: CUDA not initialised)."""
    if os.environ.get(FAKE_RESERVED_ENV):
        return _fake(FAKE_RESERVED_ENV)
    torch = _cuda()
    return None if torch is None else int(torch.cuda.memory_reserved(max(device, 0)))


def release_reserved(steady: int) -> None:
    """Give the cached blocks back to the driver (the seam's file says ``steady`` again)."""
    if os.environ.get(FAKE_RESERVED_ENV):
        with open(os.environ[FAKE_RESERVED_ENV], "w") as f:
            f.write(str(steady))
        return
    torch = _cuda()
    if torch is not None:
        torch.cuda.empty_cache()


class CudaMemory:
    """One rank's CUDA memory from test to test (see the module docstring)."""

    def __init__(self, device: int, limit: int) -> None:
        self.device = device
        #: Bytes above the steady state that make the pool unfit (0: never).
        self.limit = limit
        self.steady: int | None = None
        self.last = 0
        #: Bytes reserved after the rank's first test.
        self.steady_reserved: int | None = None

    def release(self) -> str:
        """After each test: the reserved memory released, in words ("" when none was): what
        a test left reserved above the limit goes back to the driver."""
        now = cuda_reserved(self.device)
        if now is None:
            return ""
        if self.steady_reserved is None:
            self.steady_reserved = now
            return ""
        above = now - self.steady_reserved
        if not self.limit or above <= self.limit:
            return ""
        release_reserved(self.steady_reserved)
        return (
            f"{size_words(above)} of reserved CUDA memory above the steady state (released: "
            "torch.cuda.empty_cache())"
        )

    def after_test(self) -> tuple[str, str]:
        """(what this test left, in words or ""; why the pool must go, or "")."""
        now = cuda_allocated(self.device)
        if now is None:
            return "", ""
        if self.steady is None:
            self.steady = self.last = now
            return "", ""
        left, self.last = now - self.last, now
        note = f"left {size_words(left)} of CUDA memory allocated" if left > 0 else ""
        above = now - self.steady
        if self.limit and above > self.limit:
            return note, (
                f"left the rank holding {size_words(above)} of CUDA memory above its steady "
                f"state ({size_words(self.steady)} after its first test), past the limit of "
                f"{size_words(self.limit)} (--distrank-cuda-growth)"
            )
        return note, ""


#: What gloo says when it cannot run an op on CUDA tensors, or at all.
_GLOO_CANNOT = re.compile(
    r"ProcessGroupGloo::(\w+): unsupported device type|Backend gloo does not support (\w+)"
)


def gloo_cannot(message: str) -> str | None:
    """The op a gloo error names as impossible (on CUDA tensors, or at all), else None."""
    found = _GLOO_CANNOT.search(message)
    if found is None:
        return None
    return found.group(1) or found.group(2)


class GlooFallback:
    """In a pool that runs NCCL tests with gloo on shared GPUs (--distrank-gpu-fallback=gloo): a
    collective gloo cannot run on CUDA tensors is a skip naming it, not the test's failure."""

    def __init__(self, world_size: int, gpus: int) -> None:
        self.why = (
            f"this NCCL test ran with gloo ({world_size} ranks on {gpus} GPU"
            f"{'s' if gpus > 1 else ''}, --distrank-gpu-fallback=gloo)"
        )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
        report = yield
        if call.excinfo is None or not report.failed:
            return report
        op = gloo_cannot(str(call.excinfo.value))
        if op is not None:
            path, lineno, _ = item.location
            # The line of the test that called the collective, when the traceback passes there.
            own = [e for e in call.excinfo.traceback if str(e.path) == str(item.path)]
            line = own[-1].lineno + 1 if own else (lineno or 0) + 1
            report.outcome = "skipped"
            report.longrepr = (
                str(path),
                line,
                f"Skipped: gloo cannot run {op} on CUDA tensors; {self.why}. It needs NCCL >= "
                "2.30 or one GPU per rank.",
            )
        return report


def gloo_fallback_plugin(cfg: RankConfig) -> GlooFallback | None:
    """The plugin a rank of a gloo-fallback pool needs (None for any other pool)."""
    if cfg.gpu_share != "gloo":
        return None
    gpus = len([g for g in cfg.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()])
    return GlooFallback(cfg.world_size, max(gpus, 1))
