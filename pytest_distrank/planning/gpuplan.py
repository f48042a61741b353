"""Which GPU each rank of a test gets, decided before any rank starts: one GPU per rank, ranks
sharing GPUs (opt-in), or a skip that says why.

Runs where tests are planned: in the controller (pool mode) and in rank 0 of a launched world
(launcher mode, which never oversubscribes: its launcher placed the ranks; :data:`LAUNCHED`).
Pure logic, except :func:`nccl_version`, which asks torch (imported only then) or the test seam.

The rule is that two ranks of one NCCL group are never put on one GPU behind the user's back:
NCCL before 2.30 refuses that ("Duplicate GPU detected") or hangs. With fewer GPUs than ranks a
test is skipped, naming the counts and the option that would run it, unless the user opted into
oversubscription (``--distrank-gpu-oversubscribe``): then rank ``r`` gets GPU ``r % n`` of the
pool's ``n``, and

- NCCL 2.30 or later runs several ranks per GPU when ``NCCL_MULTI_RANK_GPU_ENABLE=1`` is set in
  the ranks (the plugin sets it and says so in the header);
- an older NCCL runs the test with gloo on the same CUDA tensors if the user allowed that
  fallback (``--distrank-gpu-fallback=gloo``), else the test is skipped saying which NCCL is
  installed and what would run it.

Test seams (``envvars.py``): ``DISTRANK_FAKE_GPU_COUNT`` (capabilities.py) and
``DISTRANK_FAKE_NCCL_VERSION`` (``2.30.1``), so both sides of 2.30 are tested without GPUs.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable

from ..envvars import FAKE_NCCL_VERSION_ENV

#: The first NCCL that runs several ranks of one communicator on one GPU, and its switch.
MULTI_RANK_NCCL = (2, 30, 0)
MULTI_RANK_ENV = "NCCL_MULTI_RANK_GPU_ENABLE"


@dataclasses.dataclass(frozen=True)
class GpuPolicy:
    """The user's GPU options, as the controller resolved them."""

    oversubscribe: bool = False
    fallback: str = "none"
    #: Where each value came from (for skip reasons): "--distrank-gpu-oversubscribe (command line)".
    oversubscribe_source: str = "default"
    #: Whether a skip may point at the options (not under a launcher, which placed the ranks).
    offered: bool = True


#: No oversubscription, no fallback: the default.
STRICT = GpuPolicy()
#: Launcher mode's: the launcher placed the ranks, no option of ours can share GPUs.
LAUNCHED = GpuPolicy(offered=False)


@dataclasses.dataclass(frozen=True)
class GpuPlan:
    """How a test's ranks use GPUs. ``gpus`` 0: a CPU test."""

    #: GPUs its pool leases (rank r uses the lease's GPU r % gpus).
    gpus: int = 0
    #: The backend its ranks use: the test's, or "gloo" under the fallback.
    backend: str = ""
    #: "" (one GPU per rank, or none), "nccl" (NCCL multi-rank) or "gloo" (the fallback).
    shared: str = ""
    #: Environment its ranks get on top of the session's.
    env: tuple[tuple[str, str], ...] = ()

    def describe(self, world_size: int) -> str:
        """The pool's GPUs in words, for its key and the header ("" for one GPU per rank)."""
        if not self.shared:
            return ""
        per = f"{world_size} ranks on {gpus_words(self.gpus)}"
        if self.shared == "nccl":
            return f"{per}, NCCL multi-rank ({MULTI_RANK_ENV}=1)"
        return f"{per}, gloo on CUDA tensors (--distrank-gpu-fallback=gloo)"


def share_env(shared: str) -> tuple[tuple[str, str], ...]:
    """What ranks that share GPUs this way need in their environment."""
    return ((MULTI_RANK_ENV, "1"),) if shared == "nccl" else ()


def gpus_words(n: int) -> str:
    """``1 GPU``, ``2 GPUs``."""
    return "1 GPU" if n == 1 else f"{n} GPUs"


def _version_text(version: tuple[int, ...] | None) -> str:
    return ".".join(str(v) for v in version) if version else "unknown"


def parse_version(text: str) -> tuple[int, ...]:
    """``"2.30.1"`` -> ``(2, 30, 1)`` (ValueError for anything else)."""
    parts = tuple(int(p) for p in text.strip().split("."))
    if not parts:
        raise ValueError(f"not an NCCL version: {text!r}")
    return parts


@functools.cache
def _real_nccl_version() -> tuple[int, ...] | None:
    """``torch.cuda.nccl.version()``: (major, minor, patch[, suffix]); None without NCCL."""
    try:
        import torch

        raw = torch.cuda.nccl.version()
    except Exception:  # a CPU build: no NCCL compiled in
        return None
    return tuple(int(v) for v in raw[:3])


def nccl_version() -> tuple[int, ...] | None:
    """The NCCL torch was built with (or the test seam's), None when there is none."""
    fake = os.environ.get(FAKE_NCCL_VERSION_ENV, "").strip()
    if fake:
        return parse_version(fake)
    return _real_nccl_version()


def plan_gpus(
    world_size: int,
    backend: str,
    needs_nccl: bool,
    min_gpus: int,
    visible: int,
    policy: GpuPolicy,
    version: Callable[[], tuple[int, ...] | None] = nccl_version,
) -> GpuPlan | str:
    """The GPU plan of a test, or why it is skipped."""
    uses_nccl = needs_nccl or "nccl" in [p.split(":", 1)[-1] for p in backend.split(",")]
    if not uses_nccl:
        return GpuPlan(min_gpus, backend)
    if visible >= world_size:
        return GpuPlan(max(min_gpus, world_size), backend)
    what = "requires_nccl: needs NCCL and" if needs_nccl else "backend 'nccl' needs"
    short = f"{what} {gpus_words(world_size)} (one per rank), {visible} visible"
    if visible == 0 or visible < min_gpus or not policy.offered:
        return short
    if not policy.oversubscribe:
        share = f"{world_size} ranks share {gpus_words(visible)}"
        return f"{short}; --distrank-gpu-oversubscribe lets {share}"
    installed = version()
    if installed is not None and installed >= MULTI_RANK_NCCL:
        return GpuPlan(visible, backend, "nccl", share_env("nccl"))
    if policy.fallback == "gloo":
        return GpuPlan(visible, "gloo", "gloo")
    return (
        f"{short}; NCCL {_version_text(installed)} cannot run several ranks on one GPU "
        f"(NCCL 2.30 can, with {MULTI_RANK_ENV}=1); --distrank-gpu-fallback=gloo runs the test "
        "with gloo on the same CUDA tensors"
    )


def describe_policy(policy: GpuPolicy, version: tuple[int, ...] | None) -> str:
    """The header's words for the oversubscription mode in force ("" when it is off)."""
    if not policy.oversubscribe:
        return ""
    head = f"GPU oversubscription on ({policy.oversubscribe_source})"
    if version is not None and version >= MULTI_RANK_NCCL:
        shared = f"runs several ranks per GPU ({MULTI_RANK_ENV}=1)"
        return f"{head}: NCCL {_version_text(version)} {shared}"
    installed = f"NCCL {_version_text(version)}" if version else "no NCCL found; it"
    cannot = f"{installed} cannot put several ranks on one GPU"
    if policy.fallback == "gloo":
        return f"{head}: {cannot}; shared GPUs run gloo on CUDA tensors"
    return f"{head}: {cannot}; tests with fewer GPUs than ranks skip"
