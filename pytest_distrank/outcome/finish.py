"""The end of one distributed test's report: the one tail both modes call.

Runs where one report per test is written: in the controller (pool mode) and in rank 0 of a
launched world (launcher mode). From the ranks' reports to what pytest logs: the
``pytest_distrank_merge_reports`` hook (or :func:`merge.merge_test`), the mode's own steps on the
merged list (pool mode: an interrupted test's teardown, the pool start's charge), the ranks'
warnings into the session's summary, the rank table and rerun command under each failure
(:func:`merge.annotate`), then the mode's steps after it (pool mode: simulated ranks' labels).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pytest
from pytest import TestReport

from .merge import annotate, merge_test
from .records import WarningRecord
from .warnings import forward_warnings

#: A mode's step on the merged reports: a new list, or None (it changed them in place).
Step = Callable[[list[TestReport]], list[TestReport] | None]


def finish_test(
    item: pytest.Item,
    per_rank: Mapping[int, Sequence[TestReport]],
    world_size: int,
    pids: Sequence[int],
    rerun: str,
    warnings: Mapping[int, Sequence[WarningRecord]],
    before: Sequence[Step] = (),
    after: Sequence[Step] = (),
    launched: Sequence[tuple[int, int]] = (),
) -> list[TestReport]:
    """One report per phase for ``item`` from every rank's, ready to log (``launched``: a
    launched world's sub-world, ``(launched rank, node)`` of each of its ranks)."""
    merged: list[TestReport] | None = item.ihook.pytest_distrank_merge_reports(
        item=item, reports=per_rank
    )
    if merged is None:
        merged = merge_test(per_rank, world_size)
    merged = _apply(before, merged)
    forward_warnings(item, warnings, world_size, launched)
    annotate(merged, per_rank, world_size, pids, rerun)
    return _apply(after, merged)


def _apply(steps: Sequence[Step], merged: list[TestReport]) -> list[TestReport]:
    for step in steps:
        changed = step(merged)
        merged = merged if changed is None else changed
    return merged
