"""The stacks of a stuck rank's process tree, taken by the controller at the pool's deadline.

Runs in the controller (pool mode), called from :meth:`pool.onetest.attempt.Attempt._unfinished`
before the pool is killed: the controller is the ranks' ancestor, so py-spy may read their
descendants under Yama's ``ptrace_scope=1`` too. Which tests opted in is recorded here at
collection (:data:`OPTED`), so that the pool's code needs no new argument.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from pytest import TestReport

from ..envvars import TREE_DIR_ENV as DIR_ENV
from .dump import dump_tree
from .procs import descendants_of, read_proc
from .words import STACKS_TITLE, stacks_text

#: Node ids of the session's distributed tests that opted in (the controller's plugin fills it).
OPTED: set[str] = set()


def rank_tree_sections(nodeid: str, rank_pids: Iterable[tuple[int, int]]) -> dict[int, str]:
    """rank -> the stacks of its tree's processes, in words, for an opted-in test ({} else)."""
    if nodeid not in OPTED:
        return {}
    out = {}
    for rank, pid in rank_pids:
        tree = descendants_of({pid})
        procs = [read_proc(child, parent) for child, parent in sorted(tree.items())]
        if not procs:
            continue
        started = time.monotonic()
        stacks, method = dump_tree(procs, os.environ.get(DIR_ENV))
        out[rank] = stacks_text(stacks, method, time.monotonic() - started)
    return out


def add_sections(reports: dict[int, list[TestReport]], sections: dict[int, str]) -> None:
    """Each rank's tree stacks as a section of its last report (merged per rank by the
    controller, as captured output is)."""
    for rank, text in sections.items():
        if reports.get(rank):
            reports[rank][-1].sections.append((STACKS_TITLE, text))
