"""GPU tiers (``--distrank-gpus``): how many GPUs a test needs, and whether that falls in the tier
a CI runner takes.

Runs where tests are planned: pool mode's controller (and each pytest-xdist worker's), at
collection, before any rank process starts. Pure logic: no torch, no pytest items (the plugin
in :mod:`tierselect` reads the items and calls these). The tier itself is parsed in
:mod:`pytest_distrank.parsing` (``GpuRange``), beside the other options' values.

A test's need is computed from its markers and the options only, never from the GPUs or the
NCCL of this machine, so that a CPU-only CI job lists every tier as a GPU runner would, and the
tiers of one fleet partition the suite:

- an ordinary test: ``requires_gpus(n)``'s n (0 without); with ``requires_nccl``, at least 1;
- a distributed test: the fewest visible GPUs for which :func:`gpuplan.plan_gpus` runs it. That
  is 0 for gloo (or ``requires_gpus(n)``'s n), one per rank for NCCL, and under
  ``--distrank-gpu-oversubscribe`` one (the ranks share it), taking the installed NCCL to be one
  that can share (2.30 or later): on a runner whose NCCL cannot, such a test skips saying so,
  unless ``--distrank-gpu-fallback=gloo``. Memory shares (``requires_gpus(n, memory=...)``)
  change how many tests share a runner's GPUs at once, not how many a test needs;
- a declared need (``@pytest.mark.distrank_gpus(n)``, or the attribute ``distrank_gpus = n`` on
  the test's class or function) wins over the markers: it is how a harness class whose world
  size counts GPUs says what it needs;
- a test of a harness class (PyTorch's ``MultiProcessTestCase`` family, DeepSpeed's
  ``DistributedTest``) without a declaration needs 0 (tier 0), whatever its world size reads on
  this machine, and the collection says so, naming the classes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..parsing import GpuRange
from .gpuplan import MULTI_RANK_NCCL, GpuPlan, GpuPolicy, plan_gpus
from .spec import DistSpec

#: The marker and the class (or function) attribute that declare a test's GPU need.
DECLARATION = "distrank_gpus"


@dataclasses.dataclass(frozen=True)
class Need:
    """How many GPUs one test needs, and why when it is not what its markers say."""

    gpus: int
    #: Where a declared need came from, e.g. ``@pytest.mark.distrank_gpus(4)``; "" otherwise.
    declared: str = ""
    #: The harness class of a test whose need is not declared (then ``gpus`` is 0); "" otherwise.
    undeclared_class: str = ""


def _sharing_nccl() -> tuple[int, ...]:
    """The NCCL a tier takes to be installed: one that runs several ranks on one GPU."""
    return MULTI_RANK_NCCL


def spec_need(spec: DistSpec, policy: GpuPolicy) -> int:
    """The fewest GPUs a runner needs to run this distributed test (gpuplan.py's rule)."""
    most = max(spec.min_gpus, spec.world_size)
    for visible in range(spec.min_gpus, most + 1):
        plan = plan_gpus(
            spec.world_size,
            spec.backend,
            spec.needs_nccl,
            spec.min_gpus,
            visible,
            policy,
            version=_sharing_nccl,
        )
        if isinstance(plan, GpuPlan):
            return visible
    return most


def ordinary_need(min_gpus: int, needs_nccl: bool, policy: GpuPolicy) -> int:
    """An ordinary test's need: ``requires_gpus(n)``, and one GPU with ``requires_nccl``
    (as ``capabilities.check_ordinary_test`` decides it)."""
    if not needs_nccl:
        return min_gpus
    return spec_need(DistSpec(1, "nccl", False, True, min_gpus), policy)


def declared_gpus(value: object, where: str) -> int:
    """A declared need (a GPU count >= 0); ValueError naming ``where`` and the value."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: expected a GPU count >= 0 (an int), got {value!r}")
    return value


def describe_selection(tier: GpuRange, source: str, kept: int, total: int) -> str:
    """The line after collection: which tier, from where, how many tests it keeps."""
    return (
        f"distrank: GPU tier {tier.text} ({source}): {kept} of {total} "
        f"test{'' if total == 1 else 's'} need {tier.describe()}; {total - kept} deselected"
    )


def undeclared_note(classes: Mapping[str, int]) -> str:
    """The line naming harness classes whose tests declared no need ("" for none)."""
    if not classes:
        return ""
    count = sum(classes.values())
    names = ", ".join(sorted(classes))
    return (
        f"distrank: {count} test{'' if count == 1 else 's'} of harness classes ({names}) "
        f"declare{'s' if count == 1 else ''} no GPU need: counted as 0 GPUs (tier 0), whatever "
        f"their world size reads on this machine; declare it with @pytest.mark.{DECLARATION}(N) "
        f"or {DECLARATION} = N on the class (docs/gpus.md#gpu-tiers)"
    )
