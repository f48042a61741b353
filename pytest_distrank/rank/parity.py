"""Assertions across ranks: ``assert_equal_across_ranks``, ``assert_close_across_ranks``,
``assert_differs_across_ranks`` (exported by :mod:`pytest_distrank`).

Runs in rank processes of both modes, inside a test: every rank of the group calls the
assertion at the same point, and every rank gets the same verdict (each builds it from the same
gathered facts), so a difference on one rank fails the test on every rank at once and leaves no
peer waiting. The collectives run on the plugin's twin of the group (:mod:`rank.ownedgroups`,
gloo, CPU tensors), never on the test's groups.

Cost on the passing path: equality, one ``all_gather`` of three int64 (a 128-bit checksum of
every leaf, computed on the tensors' own device, and a NaN flag); difference, of the checksum
alone; closeness, an ``all_gather`` of two int64 (the shapes and dtypes), one ``broadcast`` of
rank 0's tensors packed in one buffer, and an ``all_gather`` of one int64 (each rank's
verdict). On failure the ranks gather everything (``all_gather_object``) to build the per-rank
table. What is compared, and how DTensors are, is :mod:`rank.paritydata`'s docstring.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

from . import paritydata as data
from .ownedgroups import twin
from .paritydata import ParityUsageError
from .paritytable import (
    LeafTable,
    Row,
    agreement,
    agreement_words,
    first_difference,
    majority,
    message,
    ranks_words,
)


def current_test() -> str:
    """The running test's node id (pytest's ``PYTEST_CURRENT_TEST``), or ``""``."""
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]


class Across:
    """The ranks of one check: the test's group, its members, this rank's place, the twin."""

    def __init__(self, check: str, group: Any) -> None:
        __tracebackhide__ = True
        import torch.distributed as dist

        self.check = check
        if not (dist.is_available() and dist.is_initialized()):
            raise ParityUsageError(
                f"{check} in {current_test() or 'this test'}: torch.distributed has no default "
                "process group in this rank, so there are no ranks to compare. Run it in a test "
                "marked @pytest.mark.world_size(n), after init_process_group() under "
                "init_process_group=False."
            )
        me = dist.get_rank()
        if group is None:
            group = dist.group.WORLD
        if group is dist.GroupMember.NON_GROUP_MEMBER:
            raise ParityUsageError(
                self._not_member(
                    me,
                    "torch gave it GroupMember.NON_GROUP_MEMBER: it was not in new_group's ranks",
                )
            )
        if not isinstance(group, dist.ProcessGroup):
            hint = " (a DeviceMesh: pass mesh.get_group(dim))" if hasattr(group, "mesh") else ""
            raise ParityUsageError(
                f"{check}(group=...) on rank {me} in {current_test() or 'this test'}: group must "
                "be a torch.distributed.ProcessGroup this rank is a member of, or None for the "
                f"default group, not {type(group).__name__}{hint}."
            )
        try:
            self.ranks = list(dist.get_process_group_ranks(group))
        except (ValueError, KeyError, RuntimeError) as exc:
            raise ParityUsageError(
                self._not_member(me, f"torch knows no such group: {exc}")
            ) from None
        if me not in self.ranks:
            raise ParityUsageError(self._not_member(me, f"its ranks are {self.ranks}"))
        self.size = len(self.ranks)
        self.index = self.ranks.index(me)
        if self.size > 1 and "fake" in str(dist.get_backend(group)).lower():
            raise ParityUsageError(
                f"{check} in {current_test() or 'this test'}: this is a simulated world "
                "(simulate marker): one process stands for every rank, so there are no other "
                "ranks' values to compare. Check the same test at a real world size "
                "(@pytest.mark.world_size), where the assertion runs on every rank."
            )
        self.pg = twin(self.ranks) if self.size > 1 else None

    def _not_member(self, me: int, why: str) -> str:
        return (
            f"{self.check}(group=...) on rank {me} in {current_test() or 'this test'}: this rank "
            f"is not a member of that group ({why}). Call the assertion only on the group's "
            "ranks (e.g. `if rank in group_ranks:`), or pass group=None for every rank."
        )

    def gather_ints(self, values: Sequence[int]) -> list[list[int]]:
        import torch
        import torch.distributed as dist

        mine = torch.tensor(list(values), dtype=torch.int64)
        out = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(out, mine, group=self.pg)
        return [t.tolist() for t in out]

    def gather_objects(self, value: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, value, group=self.pg)
        return out

    def broadcast_from_first(self, buffer: Any) -> None:
        import torch.distributed as dist

        dist.broadcast(buffer, src=self.ranks[0], group=self.pg)


def _leaves(value: Any, name: str) -> list[tuple[str, Any]]:
    return [(p, data.normalize(p, v, name)) for p, v in data.flatten(value)]


def _begin(
    check: str, value: Any, group: Any, name: str
) -> tuple[Across, list[tuple[str, Any]]] | None:
    """The check's ranks (the group checked first: a bad one is this rank's usage error) and
    this rank's leaves of ``value``; None when the group has one rank: nothing to compare."""
    __tracebackhide__ = True
    across = Across(check, group)
    leaves = _leaves(value, name)
    return None if across.size == 1 else (across, leaves)


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
        for pos, leaves in enumerate(per_rank):
            rank = across.ranks[pos]
            if path not in leaves:
                rows.append(Row(rank, "missing", note="missing here"))
            elif pos == ref:
                rows.append(Row(rank, data.kind_words(leaves[path]), note="reference"))
            elif theirs is None:
                rows.append(Row(rank, data.kind_words(leaves[path]), note="not on the reference"))
            else:
                rows.append(data.compare(rank, leaves[path], theirs, exact=exact, **tolerance))
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
    for row, leaves in zip(rows, per_rank, strict=True):
        leaf = leaves.get(path)
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


def assert_equal_across_ranks(
    value: Any, group: Any = None, *, equal_nan: bool = False, name: str = "value"
) -> None:
    """Every rank of ``group`` (default: the default group) holds an equal ``value``: tensors
    (any dtype and device), nested lists, tuples and dicts of them, plain Python values.

    Equal is ``torch.equal``: the same shape, dtype and values, ``-0.0 == 0.0``, NaN unequal to
    everything unless ``equal_nan``. Every rank of the group must call it; every rank gets the
    same verdict. On failure an ``AssertionError`` with a table of every rank against the rank
    of the largest group of agreeing ranks.
    """
    __tracebackhide__ = True
    check = "assert_equal_across_ranks"
    begun = _begin(check, value, group, name)
    if begun is None:
        return
    across, leaves = begun
    checksum, nan = data.digest(leaves, equal_nan)
    got = across.gather_ints([*checksum, int(nan)])
    keys = [tuple(g[:2]) for g in got]
    if len(set(keys)) == 1 and not any(g[2] for g in got):
        return
    gathered = across.gather_objects(data.portable(leaves))
    groups = [[across.ranks[p] for p in g] for g in agreement(keys)]
    ref_pos = across.ranks.index(majority(groups)[0])
    tables = _tables(across, gathered, ref_pos, exact=True, name=name, equal_nan=equal_nan)
    ref = across.ranks[ref_pos]
    nan_ranks = [across.ranks[p] for p, g in enumerate(got) if g[2]]
    if len(groups) == 1:
        headline = (
            f"{name} holds NaN on {ranks_words(nan_ranks)}, and NaN equals nothing "
            "(torch.equal); pass equal_nan=True to count NaN as equal to NaN."
        )
    else:
        headline = (
            f"{name} differs between ranks: {agreement_words(groups)}. Each rank is compared "
            f"with rank {ref} (of the largest group of agreeing ranks)."
        )
    differing = sorted({r for g in groups if ref not in g for r in g})
    advice = (
        _advice(differing, "equal")
        if differing
        else (
            "What to do: find where the NaN comes from (torch.autograd.set_detect_anomaly, or "
            "torch.isnan checks after each step); pass equal_nan=True if NaN is expected there."
        )
    )
    _raise(check, headline, tables, advice, ref)


def assert_close_across_ranks(
    value: Any,
    group: Any = None,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool = False,
    name: str = "value",
) -> None:
    """Every rank of ``group`` holds a ``value`` close to rank 0's (the group's first rank):
    the same structure, shapes and dtypes, and ``torch.isclose(mine, rank0, rtol, atol,
    equal_nan)`` for every element. ``rtol``/``atol`` default to torch.testing.assert_close's
    for the dtype (integers and bools: exact). Plain values other than numbers must be equal.
    """
    __tracebackhide__ = True
    check = "assert_close_across_ranks"
    begun = _begin(check, value, group, name)
    if begun is None:
        return
    across, leaves = begun
    shape = hashlib.blake2b(data.header(leaves), digest_size=16).digest()
    halves = [int.from_bytes(shape[i : i + 8], "little", signed=True) for i in (0, 8)]
    got = across.gather_ints(halves)
    ok = len({tuple(g) for g in got}) == 1
    if ok:
        tensors = [v for _, v in leaves if _is_tensor(v)]
        buffer = data.pack(tensors)
        across.broadcast_from_first(buffer)
        if across.index != 0:
            theirs = data.unpack(buffer, tensors)
            pairs = zip(tensors, theirs, strict=True)
            ok = all(_close(m, t, rtol, atol, equal_nan) for m, t in pairs)
        ok = all(g[0] for g in across.gather_ints([int(ok)]))
        if ok:
            return
    gathered = across.gather_objects(data.portable(leaves))
    tables = _tables(
        across, gathered, 0, exact=False, name=name, rtol=rtol, atol=atol, equal_nan=equal_nan
    )
    differing = sorted({row.rank for t in tables for row in t.rows if row.differs})
    first = across.ranks[0]
    headline = (
        f"{name} is not close to rank {first}'s on {ranks_words(differing)}"
        if differing
        else f"{name} holds NaN (pass equal_nan=True to count NaN as close to NaN)"
    )
    _raise(check, headline + ".", tables, _advice(differing, "close"), first)


def assert_differs_across_ranks(
    value: Any, group: Any = None, *, pairwise: bool = True, name: str = "value"
) -> None:
    """No two ranks of ``group`` hold equal ``value`` (with ``pairwise=False``: not every
    rank holds the same one): the guard against a parity check that passes only because every
    rank had the same input. Equal as in :func:`assert_equal_across_ranks`, NaN equal to NaN.
    """
    __tracebackhide__ = True
    check = "assert_differs_across_ranks"
    begun = _begin(check, value, group, name)
    if begun is None:
        return
    across, leaves = begun
    checksum, _ = data.digest(leaves, equal_nan=True)
    got = across.gather_ints(checksum)
    groups = [[across.ranks[p] for p in g] for g in agreement([tuple(g) for g in got])]
    if (all(len(g) == 1 for g in groups)) if pairwise else len(groups) > 1:
        return
    kinds = across.gather_objects(", ".join(data.kind_words(v) for _, v in leaves) or "empty")
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


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _close(mine: Any, theirs: Any, rtol: float | None, atol: float | None, nan: bool) -> bool:
    import torch

    theirs = theirs.to(mine.device)
    if not (mine.is_floating_point() or mine.is_complex()):
        return bool(torch.equal(mine, theirs))
    r, a = data.tolerances(mine.dtype, rtol, atol)
    return bool(torch.isclose(mine, theirs, rtol=r, atol=a, equal_nan=nan).all().item())


def _advice(ranks: Sequence[int], how: str) -> str:
    who = ranks_words(ranks) if ranks else "the ranks named"
    return (
        f"What to do: find why {who} computed something else (an input or seed that differs, a "
        "collective it missed, a buffer not synchronised); every rank ran this check and failed "
        "with this message."
        + (" Loosen rtol/atol only if the difference is rounding." if how == "close" else "")
    )
