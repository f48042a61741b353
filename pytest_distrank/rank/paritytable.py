"""The words of a failed check across ranks: which ranks agree, the per-rank table, the message.

Runs in rank processes of both modes, inside a test, after a check of :mod:`rank.parity` or
:mod:`rank.reference` found a difference: every rank builds the same message from the same
gathered facts, so every rank raises the same error. Pure Python (no torch): the facts come in as
:class:`Row` values, computed by :mod:`rank.paritydata`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Iterable, Sequence

#: Columns of the table, in order: (title, Row attribute).
COLUMNS = (
    ("rank", "rank"),
    ("shape, dtype", "kind"),
    ("max abs err", "max_abs"),
    ("max rel err", "max_rel"),
    ("differing", "mismatched"),
    ("first at", "index"),
    ("value", "value"),
    ("{there}", "ref_value"),
    ("", "note"),
)
#: Leaves shown with a table of their own; the others are listed by name.
TABLES_SHOWN = 3


@dataclasses.dataclass
class Row:
    """One rank's facts about one leaf, against the reference side (another rank or the
    one-process reference). None: not applicable (shown as ``-``)."""

    rank: int
    #: ``(4, 8) float32``, ``str``, or ``missing`` (the leaf is not in this rank's value).
    kind: str
    max_abs: float | None = None
    max_rel: float | None = None
    #: Elements that differ (outside the tolerance), and of how many: ``3/1024``.
    mismatched: str | None = None
    #: The first differing element's index, e.g. ``(2, 17)``.
    index: str | None = None
    value: str | None = None
    ref_value: str | None = None
    #: ``reference``, ``agrees``, ``shape differs`` ...
    note: str = ""

    @property
    def differs(self) -> bool:
        return self.note not in ("reference", "agrees")


def agreement(keys: Sequence[Hashable]) -> list[list[int]]:
    """The ranks (positions of ``keys``) that hold equal keys, grouped, each group in rank order,
    the groups in the order of their lowest rank."""
    groups: dict[Hashable, list[int]] = {}
    for rank, key in enumerate(keys):
        groups.setdefault(key, []).append(rank)
    return list(groups.values())


def majority(groups: Sequence[Sequence[int]]) -> list[int]:
    """The largest group; of groups as large, the one with the lowest rank."""
    best = groups[0]
    for group in groups:
        if len(group) > len(best) or (len(group) == len(best) and group[0] < best[0]):
            best = group
    return list(best)


def ranks_words(ranks: Iterable[int]) -> str:
    """``0, 1, 3`` or ``0-3`` for a run of four or more; ``rank 2`` alone."""
    ordered = sorted(ranks)
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    if len(ordered) >= 4 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"ranks {ordered[0]}-{ordered[-1]}"
    return "ranks " + ", ".join(str(r) for r in ordered)


def agreement_words(groups: Sequence[Sequence[int]]) -> str:
    """``ranks 0, 1, 3 agree; rank 2 differs from them`` or ``every rank holds its own value``."""
    if len(groups) == 1:
        return f"{ranks_words(groups[0])} agree"
    if all(len(g) == 1 for g in groups):
        return "no two ranks agree"
    return "; ".join(
        f"{ranks_words(g)} agree" if len(g) > 1 else f"{ranks_words(g)} alone" for g in groups
    )


def number(value: float | None) -> str:
    """A table cell for an error: ``-``, ``0``, ``inf``, ``nan`` or 3 significant digits."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.3g}"


def cell(row: Row, attribute: str) -> str:
    value = getattr(row, attribute)
    if attribute in ("max_abs", "max_rel"):
        return number(value)
    if value is None:
        return "-"
    return str(value)


def table(rows: Sequence[Row], there: str = "rank 0") -> str:
    """The per-rank table, columns padded; columns empty on every row are left out. ``there``
    names the reference side (``rank 0``, ``the reference``) in the title of its values."""
    columns = [
        (title.format(there=f"value on {there}"), attr)
        for title, attr in COLUMNS
        if attr in ("rank", "kind", "note") or any(getattr(r, attr) is not None for r in rows)
    ]
    cells = [[title for title, _ in columns]]
    cells += [[cell(row, attr) for _, attr in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip()
        for line in cells
    )


@dataclasses.dataclass
class LeafTable:
    """The rows of one leaf that differs somewhere."""

    path: str
    rows: list[Row]


def message(
    check: str,
    test: str,
    headline: str,
    tables: Sequence[LeafTable],
    advice: str,
    extra: Sequence[str] = (),
    there: str = "rank 0",
) -> str:
    """The error every rank raises: what failed where, the tables, what to do."""
    where = f" in {test}" if test else ""
    lines = [f"{check} failed{where}: {headline}", *extra]
    for leaf in tables[:TABLES_SHOWN]:
        lines += ["", f"{leaf.path}:", table(leaf.rows, there)]
    rest = [leaf.path for leaf in tables[TABLES_SHOWN:]]
    if rest:
        lines += ["", f"also differ ({len(rest)}): {', '.join(rest)}"]
    lines += ["", advice]
    return "\n".join(lines)


def differing_ranks(tables: Sequence[LeafTable]) -> list[int]:
    """The ranks with a differing row in any table, in rank order."""
    return sorted({row.rank for leaf in tables for row in leaf.rows if row.differs})


def first_difference(tables: Sequence[LeafTable], there: str = "rank 0") -> str:
    """``x['w'] differs on rank 2 at (3, 1): 0.5 there, 0.25 on rank 0`` for the first
    differing row, or ``""``."""
    for leaf in tables:
        for row in leaf.rows:
            if not row.differs:
                continue
            if row.index is not None:
                return (
                    f"{leaf.path} differs on rank {row.rank} at {row.index}: "
                    f"{row.value} there, {row.ref_value} on {there}"
                )
            ref = next((r.kind for r in leaf.rows if r.note.startswith("reference")), "")
            theirs = f"; {ref} on {there}" if ref and row.note.endswith("differs") else ""
            return f"{leaf.path} on rank {row.rank}: {row.note}, {row.kind}{theirs}"
    return ""
