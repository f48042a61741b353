"""``--distrank-gpus``: keep the tests of one GPU tier, deselect the rest.

Runs in pool mode's controller (and in each pytest-xdist worker, which collects for itself),
during collection. :func:`register_gpu_tier` runs in the plugin's ``pytest_configure``: it
registers :class:`TierPlugin` only when a tier is given, and refuses a tier in launcher mode,
where the launcher placed the ranks on its GPUs before pytest started. Never in a pool rank
(ranks run the tests they are sent).

The selection itself is :func:`pytest_collection_modifyitems`, which plugin.py makes its own
module's hook: a plugin registered at ``pytest_configure`` time would come after the conftest.py
files that pytest loads first (rootdir, arguments), and pluggy calls the later-registered first,
so a marker such a conftest.py adds in its ``pytest_collection_modifyitems`` would not count.
As the entry point's hook it runs after every conftest.py's and before every ``trylast`` one:
pytest-split (``trylast``) shards the tier's tests only. Deselected tests go through
``pytest_deselected``, as ``-k`` and ``-m`` do: a tier's report holds its own tests and no skips
for the others. The needs themselves are :mod:`tiers`'.
"""

from __future__ import annotations

import pytest

from .. import _compat
from ..options import BACKEND, GPU_FALLBACK, GPU_OVERSUBSCRIBE, GPUS, WORLD_SIZE
from ..parsing import GpuRange
from ..settings import resolve
from .gpuplan import GpuPolicy
from .spec import MarkerError, min_gpus, spec_of
from .tiers import (
    DECLARATION,
    Need,
    declared_gpus,
    describe_selection,
    ordinary_need,
    spec_need,
    undeclared_note,
)

PLUGIN_NAME = "distrank-gpu-tier"


def register_gpu_tier(config: pytest.Config, launched_by: str | None) -> None:
    """Register the tier's plugin when ``--distrank-gpus`` names a tier; under a launcher
    (``launched_by``: its name) a tier is a usage error naming the option, value and source."""
    tier = resolve(config, GPUS)
    if tier.value is None:
        return
    if launched_by is not None:
        raise pytest.UsageError(
            f"pytest-distrank: {GPUS.flag} {tier.value.text!r} (from {tier.source}) picks the "
            f"tests of a GPU tier, which launcher mode does not do: this pytest is one rank of a "
            f"world that {launched_by} launched and placed on its GPUs. Choose the tests before "
            f"launching (a file, -k, -m), or run the tier in pool mode: "
            f"pytest -p distrank {GPUS.flag}={tier.value.text}"
        )
    oversubscribe = resolve(config, GPU_OVERSUBSCRIBE)
    policy = GpuPolicy(
        oversubscribe.value, resolve(config, GPU_FALLBACK).value, oversubscribe.source
    )
    plugin = TierPlugin(
        tier.value,
        tier.source,
        resolve(config, WORLD_SIZE).value,
        resolve(config, BACKEND).value,
        policy,
    )
    config.pluginmanager.register(plugin, PLUGIN_NAME)


class TierPlugin:
    """Deselects the tests whose GPU need is outside the tier (see the module)."""

    def __init__(
        self,
        tier: GpuRange,
        source: str,
        default_size: int,
        default_backend: str,
        policy: GpuPolicy,
    ) -> None:
        self.tier = tier
        self.source = source
        self.default_size = default_size
        self.default_backend = default_backend
        self.policy = policy
        self.lines: list[str] = []

    def need_of(self, item: pytest.Item) -> Need:
        """The GPUs ``item`` needs, from its markers and the options (tiers.py's rules)."""
        declared = _declared(item)
        if declared is not None:
            return declared
        harness = _harness_class(item)
        if harness:
            return Need(0, undeclared_class=harness)
        try:
            spec = spec_of(item, self.default_size, self.default_backend)
            if spec is not None:
                return Need(spec_need(spec, self.policy))
            needs_nccl = item.get_closest_marker("requires_nccl") is not None
            return Need(ordinary_need(min_gpus(item), needs_nccl, self.policy))
        except MarkerError:
            return Need(0)  # it errors in setup, before any rank starts: in tier 0

    def select(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Deselect the tests outside the tier; note the lines to say after collection."""
        kept: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        undeclared: dict[str, int] = {}
        for item in items:
            need = self.need_of(item)
            if need.undeclared_class:
                undeclared[need.undeclared_class] = undeclared.get(need.undeclared_class, 0) + 1
            (kept if need.gpus in self.tier else dropped).append(item)
        self.lines = [describe_selection(self.tier, self.source, len(kept), len(items))]
        note = undeclared_note(undeclared)
        if note:
            self.lines.append(note)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept

    def pytest_report_collectionfinish(self) -> list[str]:
        # pytest writes the hooks' lists in reverse order, each list's lines in order.
        return self.lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tier's selection, as the hook of the plugin's module (plugin.py imports it; see the
    module): a no-op unless :func:`register_gpu_tier` registered a tier."""
    plugin = config.pluginmanager.get_plugin(PLUGIN_NAME)
    if isinstance(plugin, TierPlugin):
        plugin.select(config, items)


def _declared(item: pytest.Item) -> Need | None:
    """A declared need: the closest ``distrank_gpus`` marker, else the attribute on the test's
    function, else on its class (a bad value is a usage error naming the test)."""
    marker = item.get_closest_marker(DECLARATION)
    value: object
    if marker is not None:
        args = [repr(a) for a in marker.args] + [f"{k}={v!r}" for k, v in marker.kwargs.items()]
        where = f"@pytest.mark.{DECLARATION}({', '.join(args)})"
        value = marker.args[0] if len(marker.args) == 1 and not marker.kwargs else marker.args
    else:
        owners = ((getattr(item, "obj", None), "function"), (_cls(item), "class"))
        found = [(owner, what) for owner, what in owners if hasattr(owner, DECLARATION)]
        if not found:
            return None
        owner, what = found[0]
        value = getattr(owner, DECLARATION)
        where = f"{DECLARATION} = {value!r} on its {what}"
    try:
        return Need(declared_gpus(value, where), declared=where)
    except ValueError as exc:
        raise pytest.UsageError(f"pytest-distrank: {item.nodeid}: {exc} ({GPUS.flag})") from None


def _cls(item: pytest.Item) -> type | None:
    cls = getattr(item, "cls", None)
    return cls if isinstance(cls, type) else None


def _harness_class(item: pytest.Item) -> str:
    """The name of the test's class when a harness spawns its ranks (PyTorch's
    ``MultiProcessTestCase`` family, DeepSpeed's ``DistributedTest``); "" otherwise. Decided by
    class, as pool/suites.py decides, whether the suites run warm or on their own harness."""
    cls = _cls(item)
    if cls is None:
        return ""
    if _compat.ds_harness_base(cls) is not None:
        return cls.__name__
    module = _compat.harness_module()
    if module is not None and _compat.harness_kind(cls, module) is not None:
        return cls.__name__
    return ""
