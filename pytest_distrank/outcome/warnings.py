"""The ranks' warnings, into the reporting session's warnings summary.

Runs where one report per test is written: the controller (pool mode) and rank 0 of a launched
world (launcher mode). Ranks send their tests' warnings as :data:`records.WarningRecord` tuples;
each distinct one of a test is recorded here once, through ``pytest_warning_recorded``, naming the
ranks when only some raised it (``[rank 1/2] only here``) and as pytest writes it when every rank
did: the summary, which groups warnings by their text, then shows it once with the same warning
of the controller's own tests (a session-scoped fixture's). Imports no torch.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from .merge import label, rank_ranges, ranks_words
from .records import WarningRecord


def merge_warnings(
    per_rank: Mapping[int, Sequence[WarningRecord]],
    world_size: int,
    launched: Sequence[tuple[int, int]] = (),
) -> list[tuple[WarningRecord, str | None]]:
    """Each distinct warning of a test once, with the ranks that raised it in words.

    Two records are the same warning when all their fields are equal: the same words from
    another line, or another category, are another warning. Returns each distinct record once,
    in first-seen order (ranks in order), with ``None`` when every rank of the world raised it
    (rank 0 to ``world_size - 1``; a rank that sent no record did not), else ``"rank 1/2"`` for
    one rank or ``"ranks 0, 2 of 3"`` for several (``merge.ranks_words``: ``ranks 0-3, 6 of 8``).
    ``launched``: a launched world's sub-world, ``(launched rank, node)`` of each of its ranks;
    the words name both numberings, as its failures do (:func:`ranks_named`).
    """
    ranks_of: dict[WarningRecord, list[int]] = {}
    for rank in sorted(per_rank):
        for record in per_rank[rank]:
            seen = ranks_of.setdefault(record, [])
            if rank not in seen:
                seen.append(rank)
    out: list[tuple[WarningRecord, str | None]] = []
    for record, ranks in ranks_of.items():
        if ranks == list(range(world_size)):
            out.append((record, None))
        else:
            out.append((record, ranks_named(ranks, world_size, launched)))
    return out


def ranks_named(ranks: Sequence[int], world_size: int, launched: Sequence[tuple[int, int]]) -> str:
    """``rank 1/2`` or ``ranks 0, 2 of 3``; in a sub-world (``launched``, as in
    :func:`merge_warnings`) with the launched ranks and their nodes: ``rank 1/2 (launched rank 3,
    node 1)``, ``ranks 0, 1 of 2 (launched ranks 2, 3, node 1)``."""
    many = f"{ranks_words(ranks)} of {world_size}"
    words = label(ranks[0], world_size) if len(ranks) == 1 else many
    where = [launched[rank] for rank in ranks if rank < len(launched)]
    if not where or len(where) != len(ranks):
        return words
    nodes = sorted({node for _, node in where})
    node_words = f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {rank_ranges(nodes)}"
    return f"{words} (launched {ranks_words(r for r, _ in where)}, {node_words})"


def _warning(record: WarningRecord, ranks: str | None) -> tuple[type[Warning], Warning]:
    """The rank's warning rebuilt here; a category this process cannot import or build keeps
    its name in a UserWarning's words (and so never reads as a warning of another category)."""
    module, qualname, text, _, _ = record
    prefix = f"[{ranks}] " if ranks else ""
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
        if isinstance(found, type) and issubclass(found, Warning):
            return found, found(prefix + text)
    except Exception:
        pass
    return UserWarning, UserWarning(f"{prefix}{qualname}: {text}")


def forward_warnings(
    item: pytest.Item,
    per_rank: Mapping[int, Sequence[WarningRecord]],
    world_size: int,
    launched: Sequence[tuple[int, int]] = (),
) -> None:
    """The ranks' warnings into this session's warnings summary, each distinct one once
    (``launched``: see :func:`merge_warnings`)."""
    for record, ranks in merge_warnings(per_rank, world_size, launched):
        category, message = _warning(record, ranks)
        item.config.hook.pytest_warning_recorded.call_historic(
            kwargs={
                "warning_message": warnings.WarningMessage(message, category, record[3], record[4]),
                "when": "runtest",
                "nodeid": item.nodeid,
                "location": None,
            }
        )


def warning_record(message: warnings.WarningMessage) -> WarningRecord:
    """What a rank sends of one warning its test raised."""
    category = message.category
    return (
        category.__module__,
        category.__qualname__,
        str(message.message),
        str(message.filename),
        int(message.lineno or 0),
    )
