"""Unit: the ``--distrank-debug-rank`` announcement (pool/debugrelay.py), D17 of #24."""

from __future__ import annotations

import types
from typing import Any

from pytest_distrank.pool.onetest.debugrelay import DebugTerminal
from pytest_distrank.settings import Value


class _Reporter:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write_line(self, line: str) -> None:
        self.lines.append(line)

    def ensure_newline(self) -> None:
        pass


def _terminal() -> tuple[DebugTerminal, _Reporter]:
    reporter = _Reporter()
    manager = types.SimpleNamespace(get_plugin=lambda name: reporter)
    return DebugTerminal(types.SimpleNamespace(pluginmanager=manager)), reporter  # type: ignore[arg-type]


def _pool(pool_id: int, size: int) -> Any:
    ranks = [types.SimpleNamespace(pid=100 + r) for r in range(size)]
    return types.SimpleNamespace(
        id=pool_id,
        world_size=size,
        describe=lambda: f"world_size={size}, backend=gloo",
        ranks=ranks,
    )


def test_a_debug_rank_no_pool_has_is_said_once_per_world_size() -> None:
    """``--distrank-debug-rank=99`` at world size 2 was accepted and did nothing, silently."""
    terminal, reporter = _terminal()
    live: Value[int | None] = Value(99, "--distrank-debug-rank=99 (command line)")
    for pool_id in (1, 1, 2):  # two tests of one pool, then a pool of the same size
        terminal.announce_debug_rank(_pool(pool_id, 2), live)
    terminal.announce_debug_rank(_pool(3, 1), live)
    assert reporter.lines == [
        "distrank: --distrank-debug-rank=99 (command line): pool world_size=2, backend=gloo has "
        "no rank 99 (ranks 0-1), so none of its ranks is debugged; the option picks that rank "
        "in every pool that has one",
        "distrank: --distrank-debug-rank=99 (command line): pool world_size=1, backend=gloo has "
        "no rank 99 (rank 0 only), so none of its ranks is debugged; the option picks that rank "
        "in every pool that has one",
    ]


def test_a_debug_rank_a_pool_has_is_announced_with_its_pid() -> None:
    terminal, reporter = _terminal()
    live: Value[int | None] = Value(3, "DISTRANK_DEBUG_RANK=3 (environment)")
    terminal.announce_debug_rank(_pool(1, 4), live)
    (line,) = reporter.lines
    assert line.startswith("distrank: rank 3/4 of pool world_size=4, backend=gloo is pid 103")
