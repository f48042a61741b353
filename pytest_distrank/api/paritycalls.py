"""The ranks of one check across ranks: their exchanges (:class:`Across`: the test's group, its
members, this rank's place, the twin, the collectives every check runs on it), what travels, and
the words of a failed check (which ranks agree, the per-rank table, the message).

Runs in rank processes of both modes, inside a test (:mod:`api.parity`, :mod:`api.reference`).
A check's first exchange has one width whatever the check and carries a digest of the call (the
check, its name and the arguments that decide the verdict): ranks that made other calls fail
together there, named. A rank whose own part fails says so in the exchange its peers are in.
The failure path gathers str, int and bytes only (:func:`portable`), and every rank builds the
same message from the same gathered facts (:class:`paritydata.Row` values), so every rank
raises the same error. torch is imported only when a function runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import pickle
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, NoReturn

from ..rank.ownedgroups import twin
from .paritydata import Row
from .parityleaves import ParityUsageError


def current_test() -> str:
    """The running test's node id (pytest's ``PYTEST_CURRENT_TEST``), or ``""``."""
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]


#: How many ints a check's first exchange carries besides its status and call digest.
FIRST_WIDTH = 4


class Across:
    """The ranks of one check: the test's group, its members, this rank's place, the twin."""

    def __init__(self, check: str, group: Any, **arguments: Any) -> None:
        __tracebackhide__ = True
        import torch.distributed as dist

        self.check = check
        #: The call as every rank must make it: the check and the arguments that decide the
        #: verdict. The first exchange carries its digest (:meth:`_exchange`).
        self.call = f"{check}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"
        self.opened = False
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
        self.pg = twin(self.ranks, check) if self.size > 1 else None

    def _not_member(self, me: int, why: str) -> str:
        return (
            f"{self.check}(group=...) on rank {me} in {current_test() or 'this test'}: this rank "
            f"is not a member of that group ({why}). Call the assertion only on the group's "
            "ranks (e.g. `if rank in group_ranks:`), or pass group=None for every rank."
        )

    def agree(self, values: Sequence[int]) -> list[list[int]]:
        """Every rank's ``values`` (the same count on every rank), once every rank's own part
        succeeded; where one failed (:meth:`fail_together`), this rank fails too."""
        __tracebackhide__ = True
        got = self._exchange(1, values)
        if not all(g[0] for g in got):
            self._settle(None)
        return [g[1:] for g in got]

    def fail_together(self, error: Exception, width: int) -> NoReturn:
        """This rank's part failed with ``error``: say so in the :meth:`agree` its peers are
        in (``width`` values), then raise it; the peers raise naming this rank."""
        __tracebackhide__ = True
        self._exchange(0, [0] * width)
        self._settle(error)

    def _exchange(self, status: int, values: Sequence[int]) -> list[list[int]]:
        """``[status, *values]`` of every rank. The check's first exchange has one width
        whatever the check (:data:`FIRST_WIDTH` values) and carries the digest of
        :attr:`call`: ranks that called different checks, or one check with other names or
        arguments, fail here together, before any collective whose size the check decides."""
        __tracebackhide__ = True
        if self.opened:
            return self.gather_ints([status, *values])
        self.opened = True
        key = hashlib.blake2b(self.call.encode(), digest_size=16).digest()
        halves = [int.from_bytes(key[i : i + 8], "little", signed=True) for i in (0, 8)]
        padding = [0] * (FIRST_WIDTH - len(values))
        got = self.gather_ints([status, *halves, *values, *padding])
        if len({tuple(g[1:3]) for g in got}) > 1:
            self._calls_differ()
        return [[g[0], *g[3 : 3 + len(values)]] for g in got]

    def _calls_differ(self) -> NoReturn:
        __tracebackhide__ = True
        calls: list[str] = self.gather_objects(self.call)
        groups = agreement(calls)
        ref = majority([[self.ranks[p] for p in g] for g in groups])[0]
        ref_call = calls[self.ranks.index(ref)]
        lines = "\n".join(
            f"  rank {r} called {c} where rank {ref} called {ref_call}"
            for r, c in zip(self.ranks, calls, strict=True)
            if c != ref_call
        )
        raise ParityUsageError(
            f"A check across ranks in {current_test() or 'this test'}: the group of ranks "
            f"{', '.join(map(str, self.ranks))} did not make the same call, so their values "
            f"were not compared:\n{lines}\nEvery rank must call the same check with the same "
            "name and arguments at the same point (checks pair by the order of the calls)."
        )

    def _settle(self, error: Exception | None) -> NoReturn:
        __tracebackhide__ = True
        words = f"{type(error).__name__}: {error}" if error is not None else None
        said = self.gather_objects(words)
        if error is not None:
            raise error
        failed = [(self.ranks[p], text) for p, text in enumerate(said) if text is not None]
        who = ranks_words(r for r, _ in failed)
        usage = all(text.startswith(ParityUsageError.__name__) for _, text in failed)
        lines = "\n".join(f"  rank {r}: {text}" for r, text in failed)
        raise (ParityUsageError if usage else RuntimeError)(
            f"{self.check} failed in {current_test() or 'this test'}: {who} could not take part "
            f"(its error below, and in its own report), so nothing was compared; every rank of "
            f"the group fails here.\n{lines}"
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

    def gather_leaves(self, found: Sequence[tuple[str, Any]]) -> list[list[tuple[str, Any]]]:
        """Every rank's leaves, for the failure's table. What travels is str, int and bytes
        (:func:`portable`); a rank that cannot send its leaves says so in the same
        gather, and every rank fails naming it, so no peer is left waiting."""
        __tracebackhide__ = True
        try:
            sent: tuple[str | None, Any] = (None, portable(found))
            pickle.dumps(sent)
        except Exception as exc:
            sent = (f"{type(exc).__name__}: {exc}", [])
        every = self.gather_objects(sent)
        failed = [(self.ranks[p], err) for p, (err, _) in enumerate(every) if err is not None]
        if failed:
            lines = "\n".join(f"  rank {r}: {err}" for r, err in failed)
            raise RuntimeError(
                f"{self.check} failed in {current_test() or 'this test'}: the values differ "
                f"between ranks, but {ranks_words(r for r, _ in failed)} could not send its "
                f"values for the table:\n{lines}"
            )
        return [from_portable(leaves) for _, leaves in every]

    def broadcast_from_first(self, buffer: Any) -> None:
        import torch.distributed as dist

        dist.broadcast(buffer, src=self.ranks[0], group=self.pg)


#: A tensor as it travels to the failure's table: its dtype's name, its shape, its bytes.
Wire = tuple[str, tuple[int, ...], bytes]


def portable(leaves: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The leaves as :func:`from_portable` rebuilds them, made of str, int and bytes only (and
    :class:`Plain`, two strings), so that ``all_gather_object`` pickles them whatever the dtype
    (torch cannot pickle float8, float4, complex32 or uint16-64 tensors) or the tensor's
    subclass: each tensor as a :data:`Wire`."""
    import torch

    out: list[tuple[str, Any]] = []
    for path, leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            t = leaf.detach().cpu().as_subclass(torch.Tensor).contiguous()
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
            leaf = (str(t.dtype).removeprefix("torch."), tuple(t.shape), raw)
        out.append((path, leaf))
    return out


def from_portable(sent: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The leaves :func:`portable` sent, tensors rebuilt on the CPU."""
    import torch

    out: list[tuple[str, Any]] = []
    for path, leaf in sent:
        if isinstance(leaf, tuple):
            name, shape, raw = leaf
            flat = (
                torch.frombuffer(bytearray(raw), dtype=torch.uint8)
                if raw
                else torch.empty(0, dtype=torch.uint8)
            )
            leaf = flat.view(getattr(torch, name)).reshape(shape)
        out.append((path, leaf))
    return out


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
