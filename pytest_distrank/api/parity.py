"""Assertions across ranks: ``assert_equal_across_ranks``, ``assert_close_across_ranks``,
``assert_differs_across_ranks`` (exported by :mod:`pytest_distrank`).

Runs in rank processes of both modes, inside a test: every rank of the group calls the
assertion at the same point, and every rank gets the same verdict (each builds it from the same
gathered facts), so a difference on one rank fails the test on every rank at once and leaves no
peer waiting. The collectives run on the plugin's twin of the group (:mod:`rank.ownedgroups`,
gloo, CPU tensors), never on the test's groups.

Every check begins with one ``all_gather`` of a status and a few int64 (:meth:`Across.agree`):
an exception in this rank's own part (a value it cannot compare, a crash while hashing) is
sent there, so every rank fails together, naming the rank and its error, before any collective
whose size depends on the value. Cost on the passing path: equality and difference, that one
``all_gather`` (a 128-bit digest of every leaf, :mod:`api.paritydata`); closeness, that one
(a hash of the leaves' paths, shapes and dtypes), one ``broadcast`` of rank 0's tensors packed
in one buffer, and an ``all_gather`` of each rank's verdict. On failure the ranks gather every
value to build the per-rank table. What a value's leaves are is :mod:`api.parityleaves`;
the ranks of a check and its exchanges, :mod:`api.paritycalls`.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence
from typing import Any

from . import paritydata as data
from .paritycalls import (
    Across,
    LeafTable,
    agreement,
    agreement_words,
    current_test,
    first_difference,
    majority,
    message,
    ranks_words,
)
from .paritydata import Row
from .parityleaves import (
    ParityUsageError,
    comparable,
    header,
    in_order,
    is_mark,
    kind_words,
    leaves,
)


def _tables(
    across: Across,
    gathered: list[list[tuple[str, Any]]],
    ref: int,
    *,
    exact: bool,
    name: str,
    **tolerance: Any,
) -> list[LeafTable]:
    """One table per leaf that differs on some rank, every rank against position ``ref``."""
    per_rank = [dict(leaves) for leaves in gathered]
    paths = list(per_rank[ref])
    paths += [p for leaves in per_rank for p in leaves if p not in paths]
    tables = []
    for path in paths:
        rows = []
        theirs = per_rank[ref].get(path)
        for pos, held in enumerate(per_rank):
            rank = across.ranks[pos]
            if path not in held:
                rows.append(Row(rank, "missing", note="missing here"))
            elif pos == ref:
                rows.append(Row(rank, kind_words(held[path]), note="reference"))
            elif theirs is None:
                rows.append(Row(rank, kind_words(held[path]), note="not on the reference"))
            else:
                rows.append(data.compare(rank, held[path], theirs, exact=exact, **tolerance))
        nan = _nan_only(rows, per_rank, path, exact, tolerance)
        if nan or any(row.differs for row in rows):
            tables.append(LeafTable(f"{name}{path}", rows))
    return tables


def _nan_only(
    rows: list[Row], per_rank: list[dict[str, Any]], path: str, exact: bool, tol: dict[str, Any]
) -> bool:
    """Whether the leaf holds NaN somewhere while NaN counts as unequal (then the reference's
    own row says so)."""
    import torch

    if tol.get("equal_nan"):
        return False
    found = False
    for row, held in zip(rows, per_rank, strict=True):
        leaf = held.get(path)
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.isnan().any():
            found = True
            if row.note == "reference":
                row.note = "reference; holds NaN (never equal)"
    return found


def _raise(check: str, headline: str, tables: list[LeafTable], advice: str, ref: int) -> None:
    __tracebackhide__ = True
    there = f"rank {ref}"
    first = first_difference(tables, there)
    raise AssertionError(
        message(check, current_test(), headline, tables, advice, [first] if first else [], there)
    )


def _one_rank(check: str, across: Across, value: Any, name: str) -> bool:
    """On a one-rank group: this rank's leaves checked (a usage error is still one), a warning
    that nothing was compared, and True (the check passes); False on a larger group."""
    if across.size > 1:
        return False
    leaves(value, name)
    warnings.warn(
        f"{check} in {current_test() or 'this test'} ran on a one-rank group (rank "
        f"{across.ranks[0]}): there is no other rank to compare {name} with, so it compared "
        "nothing and passed. Run the test at a world size of 2 or more for the check to mean "
        "something.",
        UserWarning,
        stacklevel=3,
    )
    return True


def _nothing(check: str, got: list[list[int]], name: str, allow_empty: bool) -> None:
    """Fail on every rank when no rank's value has a leaf (``got[r][0]``: it has one) and the
    ranks' empty shapes agree (``got[r][1:3]``: their digest; ``{}`` on one rank and ``[]`` on
    another differ, and the table says so)."""
    __tracebackhide__ = True
    if allow_empty or any(g[0] for g in got) or len({tuple(g[1:3]) for g in got}) > 1:
        return
    raise AssertionError(
        f"{check} failed in {current_test() or 'this test'}: {name} compares nothing: it holds "
        "no tensor or value on any rank (an empty dict, list or tuple, or a module without "
        "parameters or buffers), so any code would pass. Check that the value is built; pass "
        "allow_empty=True where an empty value is what the test expects."
    )


def assert_equal_across_ranks(
    value: Any,
    group: Any = None,
    *,
    equal_nan: bool = False,
    allow_empty: bool = False,
    name: str = "value",
) -> None:
    """Every rank of ``group`` (default: the default group) holds an equal ``value``: tensors
    (any dtype and device), numpy arrays, numbers, ``str``, ``bytes``, ``None``, enums, and
    lists, tuples, dicts, dataclasses and ``nn.Module``s (by ``state_dict()``) of them.

    Equal is ``torch.equal`` leaf by leaf: the same paths, shapes, dtypes and values,
    ``-0.0 == 0.0``, NaN unequal to everything unless ``equal_nan`` (docs/parity.md says what
    else). Every rank of the group must call it; every rank gets the same verdict. A value with
    no leaf on any rank fails ("compares nothing") unless ``allow_empty``; on a one-rank group
    it passes with a warning. On failure an ``AssertionError`` with a table of every rank
    against the rank of the largest group of agreeing ranks.
    """
    __tracebackhide__ = True
    check = "assert_equal_across_ranks"
    across = Across(check, group, name=name, equal_nan=equal_nan, allow_empty=allow_empty)
    if _one_rank(check, across, value, name):
        return
    try:
        found = leaves(value, name)
        key, nan, _ = data.digest(found, equal_nan)
    except Exception as exc:
        across.fail_together(exc, 4)
    got = across.agree([int(comparable(found)), *key, int(nan)])
    _nothing(check, got, name, allow_empty)
    keys = [tuple(g[1:3]) for g in got]
    if len(set(keys)) == 1 and not any(g[3] for g in got):
        return
    gathered = across.gather_leaves(found)
    groups = [[across.ranks[p] for p in g] for g in agreement(classes(gathered))]
    ref_pos = across.ranks.index(majority(groups)[0])
    tables = _tables(across, gathered, ref_pos, exact=True, name=name, equal_nan=equal_nan)
    if not tables:
        return  # equal by the rule: digests differ where leaves lie on different devices
    ref = across.ranks[ref_pos]
    if len(groups) == 1:
        nan_ranks = [across.ranks[p] for p, g in enumerate(got) if g[3]]
        headline = (
            f"{name} holds NaN on {ranks_words(nan_ranks)}, and NaN equals nothing "
            "(torch.equal); pass equal_nan=True to count NaN as equal to NaN."
        )
        advice = (
            "What to do: find where the NaN comes from (torch.autograd.set_detect_anomaly, or "
            "torch.isnan checks after each step); pass equal_nan=True if NaN is expected there."
        )
    else:
        headline = (
            f"{name} differs between ranks: {agreement_words(groups)}. Each rank is compared "
            f"with rank {ref} (of the largest group of agreeing ranks)."
        )
        advice = _advice(sorted({r for g in groups if ref not in g for r in g}), "equal")
    _raise(check, headline, tables, advice, ref)


def assert_close_across_ranks(
    value: Any,
    group: Any = None,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool = False,
    allow_empty: bool = False,
    name: str = "value",
) -> None:
    """Every rank of ``group`` holds a ``value`` close to rank 0's (the group's first rank):
    the same leaves, shapes and dtypes, and ``torch.isclose(mine, rank0, rtol, atol,
    equal_nan)`` for every element. ``rtol``/``atol`` default to torch.testing.assert_close's
    for the dtype (integers and bools: exact). Plain values must be equal. Takes what
    :func:`assert_equal_across_ranks` takes; ``allow_empty`` and one-rank groups alike.
    """
    __tracebackhide__ = True
    import torch

    check = "assert_close_across_ranks"
    across = Across(
        check, group, name=name, rtol=rtol, atol=atol, equal_nan=equal_nan, allow_empty=allow_empty
    )
    if across.size == 1:  # on more ranks, in this rank's own part (below): all fail together
        data.check_tolerances(rtol, atol)
    if _one_rank(check, across, value, name):
        return
    try:
        data.check_tolerances(rtol, atol)
        found = leaves(value, name)
        shape = hashlib.blake2b(header(found), digest_size=16).digest()
        tensors = [v for _, v in in_order(found) if isinstance(v, torch.Tensor)]
        size = sum(t.numel() * t.element_size() for t in tensors)
        first = across.index == 0
        buffer = data.pack(tensors) if first else torch.empty(size, dtype=torch.uint8)
    except Exception as exc:
        across.fail_together(exc, 3)
    halves = [int.from_bytes(shape[i : i + 8], "little", signed=True) for i in (0, 8)]
    got = across.agree([int(comparable(found)), *halves])
    _nothing(check, got, name, allow_empty)
    ok = len({tuple(g[1:]) for g in got}) == 1
    if ok:
        across.broadcast_from_first(buffer)
        try:
            if not first:
                pairs = zip(tensors, data.unpack(buffer, tensors), strict=True)
                ok = all(_close(m, t, rtol, atol, equal_nan) for m, t in pairs)
        except Exception as exc:
            across.fail_together(exc, 1)
        ok = all(g[0] for g in across.agree([int(ok)]))
        if ok:
            return
    gathered = across.gather_leaves(found)
    tables = _tables(
        across, gathered, 0, exact=False, name=name, rtol=rtol, atol=atol, equal_nan=equal_nan
    )
    differing = sorted({row.rank for t in tables for row in t.rows if row.differs})
    first_rank = across.ranks[0]
    headline = (
        f"{name} is not close to rank {first_rank}'s on {ranks_words(differing)}"
        if differing
        else f"{name} holds NaN (pass equal_nan=True to count NaN as close to NaN)"
    )
    _raise(check, headline + ".", tables, _advice(differing, "close"), first_rank)


def assert_differs_across_ranks(
    value: Any, group: Any = None, *, pairwise: bool = True, name: str = "value"
) -> None:
    """No two ranks of ``group`` hold equal ``value`` (with ``pairwise=False``: not every
    rank holds the same one): the guard against a parity check that passes only because every
    rank had the same input. Equal as in :func:`assert_equal_across_ranks`, NaN equal to NaN.
    Refused on a one-rank group (it cannot show that ranks differ); a value with no leaf on any
    rank fails.
    """
    __tracebackhide__ = True
    check = "assert_differs_across_ranks"
    across = Across(check, group, name=name, pairwise=pairwise)
    if across.size == 1:
        raise ParityUsageError(
            f"{check} in {current_test() or 'this test'} on a one-rank group (rank "
            f"{across.ranks[0]}): one rank cannot show that ranks differ. Run the test at a "
            "world size of 2 or more, or leave the check out where the world has one rank."
        )
    try:
        found = leaves(value, name)
        key, _, where = data.digest(found, equal_nan=True)
    except Exception as exc:
        across.fail_together(exc, 4)
    got = across.agree([int(comparable(found)), *key, where])
    _nothing(check, got, name, allow_empty=False)
    if len({g[3] for g in got}) == 1:
        keys: list[Any] = [tuple(g[1:3]) for g in got]
    else:  # leaves on different devices hash differently: compare the values themselves
        keys = classes(across.gather_leaves(found))
    groups = [[across.ranks[p] for p in g] for g in agreement(keys)]
    if (all(len(g) == 1 for g in groups)) if pairwise else len(groups) > 1:
        return
    kinds = across.gather_objects(
        ", ".join(kind_words(v) for _, v in found if not is_mark(v)) or "empty"
    )
    rows = []
    for pos, rank in enumerate(across.ranks):
        same = next(g for g in groups if rank in g)
        others = [r for r in same if r != rank]
        note = f"equal to {ranks_words(others)}" if others else "its own value"
        rows.append(Row(rank, kinds[pos], note=note))
    same_groups = [g for g in groups if len(g) > 1]
    headline = (
        f"{name} is the same on {'; '.join(ranks_words(g) for g in same_groups)}: a check that "
        "ranks agree would pass on such values whatever the code does."
    )
    advice = (
        "Give each rank its own input: pytest_distrank.rank_inputs(seed, shape) draws different "
        "numbers per rank (and any rank's for the one-process reference); a seed set alike on "
        "every rank (torch.manual_seed(0)) is the usual cause."
    )
    raise AssertionError(message(check, current_test(), headline, [LeafTable(name, rows)], advice))


def classes(every: Sequence[Sequence[tuple[str, Any]]]) -> list[int]:
    """For each rank's leaves, the first rank whose leaves are equal to them (NaN equal to
    NaN): ranks with the same number hold equal values."""
    return [
        next(q for q in range(p + 1) if data.equal(every[q], mine, equal_nan=True))
        for p, mine in enumerate(every)
    ]


def _close(mine: Any, theirs: Any, rtol: float | None, atol: float | None, nan: bool) -> bool:
    return bool(data.close(mine, theirs.to(mine.device), rtol, atol, nan).all().item())


def _advice(ranks: Sequence[int], how: str) -> str:
    who = ranks_words(ranks) if ranks else "the ranks named"
    return (
        f"What to do: find why {who} computed something else (an input or seed that differs, a "
        "collective it missed, a buffer not synchronised); every rank ran this check and failed "
        "with this message."
        + (" Loosen rtol/atol only if the difference is rounding." if how == "close" else "")
    )
