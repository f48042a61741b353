"""Unit: which modules a test file adds to the fork server's preload list (pool/preloads.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_distrank.pool.pools import preloads

SOURCE = b"""
import os
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.testing._internal.common_distributed import MultiProcessTestCase
from .helpers import thing
from mypkg.models import Net

def f():
    import torch.distributed.fsdp  # not at the top level: left to the rank
"""


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preloads, "GPU_DRIVER_PATHS", ())
    monkeypatch.delenv("DISTRANK_FAKE_GPU_COUNT", raising=False)


@pytest.mark.usefixtures("no_gpu")
def test_the_distributed_stack_and_the_harness_are_preloaded() -> None:
    assert preloads.file_preloads(SOURCE) == [
        "torch.distributed.tensor",
        "torch.testing._internal.common_distributed",
        "torch._dynamo",  # DTensor and the harness import it at their first call
    ]


@pytest.mark.usefixtures("no_gpu")
@pytest.mark.parametrize(
    ("source", "dynamo"),
    [
        (b"import torch.distributed as dist\ndist.all_reduce(t)\n", False),
        (b"import torch.distributed.rpc\n", False),
        (b"from torch.nn.parallel import DistributedDataParallel as DDP\n", True),
        (b"import torch\nnet = torch.nn.parallel.DistributedDataParallel(m)\n", True),
        (b"from torch.distributed.fsdp import fully_shard\n", True),
        (b"from torch.distributed._composable.fsdp import fully_shard\n", True),
        (b"from torch.distributed.pipelining import pipeline\n", True),
    ],
)
def test_dynamo_comes_with_what_imports_it_at_its_first_call(source: bytes, dynamo: bool) -> None:
    assert ("torch._dynamo" in preloads.file_preloads(source)) is dynamo


@pytest.mark.usefixtures("no_gpu")
def test_a_file_that_does_not_parse_adds_nothing() -> None:
    assert preloads.file_preloads(b"def broken(:\n") == []


def test_nothing_is_added_where_a_gpu_may_be(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "2")
    assert preloads.file_preloads(SOURCE) == []


def test_a_driver_file_means_a_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.delenv("DISTRANK_FAKE_GPU_COUNT", raising=False)
    monkeypatch.setattr(preloads, "GPU_DRIVER_PATHS", (str(tmp_path),))
    assert preloads.gpu_driver_present()


@pytest.mark.usefixtures("no_gpu")
def test_a_template_preloads_what_its_files_import_once_each(tmp_path: Path) -> None:
    """Relative to the invocation folder, in the files' order, each module once; a file that
    cannot be read (moved since collection) adds nothing."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "test_a.py").write_bytes(SOURCE)
    (tmp_path / "test_b.py").write_bytes(b"import torch.distributed.rpc, torch.distributed.tensor")
    files = ["sub/test_a.py", "gone.py", "test_b.py"]
    assert preloads.files_preloads(files, tmp_path) == (
        "torch.distributed.tensor",
        "torch.testing._internal.common_distributed",
        "torch._dynamo",
        "torch.distributed.rpc",
    )
