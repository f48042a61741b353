"""What the fork server imports before it forks ranks: so that every rank starts with it.

Runs in the controller (the list is handed to multiprocessing's forkserver before it starts).
A module imported in the fork server is in every rank's memory at no cost; one imported by each
rank's own collection costs each rank its import time (PyTorch's DTensor test harness: about 3 s
of CPU per rank).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from ... import _compat
from ...envvars import FAKE_GPU_COUNT_ENV

#: What pytest imports as it starts when it forks the fork server from itself (earlyfork.py).
SHARED_WITH_PYTEST = ["torch", "torch.distributed", "pytest", "pytest_distrank.plugin"]
#: Modules the fork server imports once, so that every rank starts with them in memory: the rank
#: side's own modules too (~50 ms of CPU per rank otherwise, 34 modules with pdb). The last one
#: freezes the fork server's heap (cheap exit, copy-on-write friendly ranks).
PRELOAD = [
    *SHARED_WITH_PYTEST,
    "pytest_distrank.pool.worker.entry",
    "pytest_distrank.tree.plugin",  # every rank registers it at configure (plugin.py)
    "pytest_distrank.pool.worker.preload",
]
#: The library modules a test file's imports may add to the preload list (the distributed stack
#: and PyTorch's own test harness), never the test's own modules.
FILE_PRELOAD_PREFIXES = ("torch.distributed.", "torch.testing._internal.")
#: What a test file uses that imports ``torch._dynamo`` in each rank at its first call (~2 s of
#: CPU a rank; torch keeps Dynamo out of these APIs by wrapping them): DDP, FSDP, DTensor,
#: PyTorch's test harness. Such a file's ranks get it from the fork server.
DYNAMO_USERS = (
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "torch.distributed._composable",
    "torch.distributed.pipelining",
    "torch.testing._internal",
)
DYNAMO_WORDS = (b"DistributedDataParallel", b"fully_shard", b"FullyShardedDataParallel")
#: Where a machine shows an NVIDIA or AMD GPU driver.
GPU_DRIVER_PATHS = ("/proc/driver/nvidia/gpus", "/dev/nvidiactl", "/dev/kfd")


def plugin_modules(config: pytest.Config) -> list[str]:
    """pytest's own plugin modules and installed pytest plugins: what every rank imports anyway.

    Imported once in the fork server instead of in every rank's pytest session (pdb, junitxml,
    xdist and execnet, pytest-cov ...: about 50 modules). Only library code: a conftest.py or
    a test module is never preloaded.
    """
    names = _compat.default_plugin_modules()
    for plugin, _dist in config.pluginmanager.list_plugin_distinfo():
        name = getattr(plugin, "__name__", None)
        if isinstance(name, str) and not name.startswith("pytest_distrank"):
            names.append(name)
    return names


def file_preloads(source: bytes) -> list[str]:
    """The modules of torch's distributed stack and test harness that a test file imports at
    its top level (``torch.distributed.tensor``, ``torch.testing._internal.common_distributed``
    ...), read with ``ast`` before pytest imports the file, and ``torch._dynamo`` where the file
    uses what imports it at the first call (:data:`DYNAMO_USERS`, :data:`DYNAMO_WORDS`); none
    on a machine with a GPU driver.

    Only there: some of those modules count devices when imported (``common_dtensor``), which
    without NVML initialises the CUDA driver, and a CUDA driver initialised in the fork server
    is unusable in the ranks forked from it. On such machines ``--distrank-preload`` opts in.
    """
    if gpu_driver_present():
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.append(node.module)
    found = [n for n in dict.fromkeys(names) if n.startswith(FILE_PRELOAD_PREFIXES)]
    if any(n.startswith(DYNAMO_USERS) for n in found) or any(w in source for w in DYNAMO_WORDS):
        found.append("torch._dynamo")
    return found


def files_preloads(files: list[str], invocation_dir: Path) -> tuple[str, ...]:
    """:func:`file_preloads` of each of ``files`` (relative to ``invocation_dir``), for a rank
    template to import before it forks (pool/worker/template.py); a file it cannot read adds
    nothing."""
    names: list[str] = []
    for file in files:
        try:
            names.extend(file_preloads((invocation_dir / file).read_bytes()))
        except OSError:
            continue
    return tuple(dict.fromkeys(names))


def gpu_driver_present() -> bool:
    """A GPU driver on this machine, or the fake GPUs of the test seam (no torch import)."""
    fake = os.environ.get(FAKE_GPU_COUNT_ENV, "").strip()
    if fake:
        return fake != "0"
    return any(Path(path).exists() for path in GPU_DRIVER_PATHS)
