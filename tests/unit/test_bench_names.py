"""Unit tests of the benchmark scripts' own logic (bench/ runs in plain Python processes)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_overhead.py"


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_overhead_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_workload_names_keep_a_comma_inside_a_name() -> None:
    bench = _bench()
    text = "distrank ws4 empty, no checks,distrank ws4 empty,MultiProcContinuous ws4"
    assert bench.workload_names(text) == [
        "distrank ws4 empty, no checks",
        "distrank ws4 empty",
        "MultiProcContinuous ws4",
    ]


def test_an_unknown_workload_name_is_named() -> None:
    bench = _bench()
    with pytest.raises(SystemExit, match="not a workload name: 'distrank ws9'"):
        bench.workload_names("distrank ws4,distrank ws9")
