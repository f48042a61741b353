"""Capability probes: is a backend built in, how many GPUs are visible -> skip reasons.

Runs where tests are planned: in the controller (pool mode), before any rank process starts,
and in rank 0 of a launched world (launcher mode, :mod:`launch.plan`), whose decisions every
rank follows. Never initialises CUDA: the GPU count
comes from ``torch.cuda.device_count()``, which asks NVML first, and a CPU build of torch answers 0
without touching a driver.

Test seams (``envvars.py``): ``DISTRANK_FAKE_GPU_COUNT=N`` makes the controller believe N GPUs
are visible, and ``DISTRANK_FAKE_NCCL_VERSION`` that this NCCL is built in (gpuplan.py), so that
the decisions below can be tested on machines without GPUs.
"""

from __future__ import annotations

import functools
import os
import resource

import pytest

from .. import _compat
from ..envvars import FAKE_GPU_COUNT_ENV, FAKE_NCCL_VERSION_ENV
from .gpuplan import STRICT, GpuPlan, GpuPolicy, gpus_words, plan_gpus
from .spec import MAX_SIMULATED_SIZE, DistSpec, MarkerError, min_gpus


@functools.cache
def _real_gpu_count() -> int:
    import torch

    return int(torch.cuda.device_count())


def visible_gpu_count() -> int:
    """GPUs this process may use (respects CUDA_VISIBLE_DEVICES and the test seam)."""
    fake = os.environ.get(FAKE_GPU_COUNT_ENV)
    if fake is not None and fake.strip() != "":
        return int(fake)
    return _real_gpu_count()


def backend_available(name: str) -> bool:
    """Whether this torch build has the named process-group backend (or the test seam says
    NCCL is there: read each time, the build's answer only once)."""
    if name == "nccl" and os.environ.get(FAKE_NCCL_VERSION_ENV, "").strip():
        return True  # the test seam: this NCCL is taken as built in (gpuplan.py)
    return _backend_built(name)


@functools.cache
def _backend_built(name: str) -> bool:
    """Whether this torch build has the named process-group backend.

    gloo is taken as given (every torch build for Linux, macOS and Windows has it), so that a
    session of gloo tests never imports torch in the controller: that import costs ~1.5 s of
    CPU that the fork server is spending at the same moment.
    """
    if name in ("gloo", "fake"):  # fake: torch.testing's, registered by the rank that uses it
        return True
    import torch.distributed as dist

    if not dist.is_available():
        return False
    probes = {
        "gloo": dist.is_gloo_available,
        "nccl": dist.is_nccl_available,
        "mpi": dist.is_mpi_available,
        "ucc": dist.is_ucc_available,
        "xccl": getattr(dist, "is_xccl_available", lambda: False),
    }
    probe = probes.get(name)
    return bool(probe()) if probe is not None else False


def _backends_of(backend: str) -> list[str]:
    """``"cpu:gloo,cuda:nccl"`` -> ``["gloo", "nccl"]``; ``"gloo"`` -> ``["gloo"]``."""
    return [part.split(":", 1)[-1] for part in backend.split(",")]


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def gpu_plan(spec: DistSpec, policy: GpuPolicy = STRICT) -> GpuPlan | str:
    """How the test's ranks use GPUs (gpuplan.py), or why it cannot run on this machine."""
    backends = _backends_of(spec.backend)
    if spec.needs_nccl and not backend_available("nccl"):
        return (
            f"requires_nccl: needs NCCL and {gpus_words(spec.world_size)}, but this torch build "
            f"(torch {_torch_version()}) has no NCCL"
        )
    for name in backends:
        if not backend_available(name):
            return (
                f"backend {name!r} is not available in this torch build (torch {_torch_version()})"
            )
    reason = gpu_skip_reason(spec.min_gpus)
    if reason:
        return reason
    uses_nccl = spec.needs_nccl or "nccl" in backends
    return plan_gpus(
        spec.world_size,
        spec.backend,
        spec.needs_nccl,
        spec.min_gpus,
        visible_gpu_count() if uses_nccl else 0,
        policy,
    )


#: Rank processes per CPU core one pool may have (and at least :data:`MIN_POOL_LIMIT`): beyond it
#: the pool is refused before any process starts. 12 ranks on 2 cores run; hundreds take turns.
POOL_RANKS_PER_CORE = 64
MIN_POOL_LIMIT = 256


def too_many_ranks(
    world_size: int, cores: int | None = None, nproc: int | None = None
) -> str | None:
    """Why a pool of ``world_size`` rank processes cannot start on this machine, or None.

    ``cores`` and ``nproc`` (the soft ``RLIMIT_NPROC``) default to this machine's. A huge size
    would otherwise be started rank by rank until memory or the process limit runs out.
    """
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if nproc is None:
        soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
        nproc = soft if soft != resource.RLIM_INFINITY else 0
    limit = max(MIN_POOL_LIMIT, POOL_RANKS_PER_CORE * cores)
    why = f"at most {limit} ranks in one pool on {cores} CPU cores"
    if 0 < nproc < limit:
        limit, why = nproc, f"at most {nproc} processes for this user (ulimit -u)"
    if world_size <= limit:
        return None
    simulate = (
        f"simulate the world instead (@pytest.mark.simulate('fake', {world_size}), "
        "docs/simulation.md) or "
        if world_size <= MAX_SIMULATED_SIZE
        else ""
    )
    return (
        f"world size {world_size} needs {world_size} rank processes on this machine, {why}; "
        f"{simulate}run it across nodes under a launcher (docs/multi-node.md)"
    )


def gpu_skip_reason(min_gpus: int) -> str | None:
    """The reason a ``requires_gpus(n)`` test is skipped, or None."""
    if min_gpus <= 0:
        return None
    found = visible_gpu_count()
    if found < min_gpus:
        return f"requires_gpus({min_gpus}): needs {gpus_words(min_gpus)}, found {found}"
    return None


def misuse_message(nodeid: str, fixtures: list[str]) -> str:
    """The error of an ordinary test (no ``world_size``) that asks for rank fixtures."""
    names = ", ".join(repr(f) for f in fixtures)
    which = (
        "fixtures {names}, which exist" if len(fixtures) > 1 else "fixture {names}, which exists"
    )
    return (
        f"{nodeid} uses the distributed {which.format(names=names)} only inside rank "
        "processes, but the test has no world_size marker.\n"
        "Add @pytest.mark.world_size(n) (e.g. @pytest.mark.world_size(2)) to run it on n ranks."
    )


def check_ordinary_test(item: pytest.Item, used: list[str]) -> None:
    """Before an ordinary test (no ``world_size``) runs in this process: a rank fixture among
    ``used`` (the plugin's rank fixtures it sets up: ``fixtures.rank_fixtures_used``) is an
    error naming the marker to add; ``requires_gpus``/``requires_nccl`` may skip it."""
    if used:
        pytest.fail(misuse_message(item.nodeid, used), pytrace=False)
    try:
        gpus = min_gpus(item)
    except MarkerError as exc:
        pytest.fail(f"{item.nodeid}: {exc}", pytrace=False)
    reason = gpu_skip_reason(gpus)
    if item.get_closest_marker("requires_nccl") is not None:
        plan = gpu_plan(DistSpec(1, "nccl", False, True, gpus))
        reason = plan if isinstance(plan, str) else None
    if reason:
        raise _compat.skip_exception(reason)
