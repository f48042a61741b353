"""Unit tests of the controller's header and summary lines (pool/terminal.py), from stand-in
values: the end-to-end sessions (tests/e2e/test_basics.py) check one real header and summary
each; the wording of every part is checked here."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from pytest_distrank.planning.gpuplan import STRICT
from pytest_distrank.pool.pools.stats import PoolStart, Stats
from pytest_distrank.pool.terminal import header_line, summary_lines
from pytest_distrank.settings import Settings, Value


def header(seed: int | None = 1234, order_seed: int | None = None, **options: Any) -> str:
    """The header with the default settings but ``options`` (name -> value)."""
    settings = {
        "timeout": Value(300.0, "default"),
        "isolate": Value(False, "default"),
        "preload": Value([], "default"),
        "backend": Value("gloo", "default"),
        "start_method": Value("forkserver", "default"),
        "world_size": Value(2, "default"),
        "order": Value(("collected", None), "default"),
    }
    settings.update({name: Value(value, "command line") for name, value in options.items()})
    return header_line(cast(Settings, SimpleNamespace(**settings)), STRICT, seed, order_seed, "1.2")


def test_the_header_says_every_setting_and_where_the_timeout_came_from() -> None:
    assert header() == (
        "distrank: 1.2, backend gloo, start method forkserver, seed 1234 (--distrank-seed to "
        "repeat), timeout 300 s (default), default world size 2"
    )
    changed = header(
        start_method="spawn",
        world_size=3,
        isolate=True,
        preload=["heavy", "json"],
        timeout=0.0,
        seed=None,
        order=("reverse", None),
    )
    assert changed == (
        "distrank: 1.2, backend gloo, start method spawn, seed off, order reverse, timeout none "
        "(command line), default world size 3, isolate, preload heavy,json"
    )
    shuffled = header(order=("random", None), order_seed=1234)
    assert ", seed 1234 (--distrank-seed to repeat), order random:1234, " in shuffled


def test_no_distributed_test_no_summary() -> None:
    assert summary_lines(Stats(), []) == []


def test_only_ordinary_tests_still_show_what_ran_in_ranks() -> None:
    """An ordinary test that requested a fixture at another world size: its line stays."""
    note = "fixture 'ckpt' (world size 4) passed (ran in 2.31 s, before test_x.py::test_a)"
    assert summary_lines(Stats(), [note]) == [note]


def test_one_test_in_one_pool() -> None:
    stats = Stats(tests=1, pools_started={(2, ""): 1})
    stats.pools.append(PoolStart(2, 0.5, 0.1, 0.4, after_fault=False))
    stats.test_seconds.append(0.0065)
    assert summary_lines(stats, []) == [
        "1 distributed test; pools started: 1 at world size 2",
        "pool start: median 0.50 s",
        "per-test wall time in the controller: median 6.5 ms",
    ]


def test_pools_are_counted_per_size_in_order_and_faults_and_notes_follow() -> None:
    started = {(4, ""): 1, (2, ""): 4, (1, ""): 1, (3, ""): 1, (4, "local"): 1}
    stats = Stats(tests=32, pools_started=started)
    stats.replaced.append("world_size=2, backend=gloo: rank 1 crashed in test_a.py::test_b")
    lines = summary_lines(stats, ["world size 512 on 2 CPU cores: slow"])
    assert lines == [
        "32 distributed tests; pools started: 1 at world size 1, 4 at world size 2, "
        "1 at world size 3, 1 at world size 4, 1 at world size 4 simulated (local)",
        "pool killed after a fault: world_size=2, backend=gloo: rank 1 crashed in "
        "test_a.py::test_b",
        "world size 512 on 2 CPU cores: slow",
    ]
    assert summary_lines(Stats(tests=3), [])[0] == "3 distributed tests; pools started: none"
