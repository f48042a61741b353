"""A one-process reference for a distributed test: ``reference(fn, *args)`` runs ``fn`` at world
size 1, ``rank_inputs(seed, shape, rank=r)`` draws any rank's inputs, and
``assert_close_to_reference(dist_out, ref_out)`` compares (exported by :mod:`pytest_distrank`).

Runs in rank processes of both modes, inside a test. The reference runs in the rank itself, not
in a process of its own: ``fn`` may be a closure or a lambda over the test's model, its
arguments and result need not pickle, it runs on the test's device with the rank's random state,
and it costs no process start. For its duration torch.distributed's world is a one-rank world
(gloo over an in-process store; NCCL too where the test's world has it) swapped in for the
test's (:func:`_compat.one_rank_world`): ``fn`` reaches it through the default group
as ``dist.*``, DDP and FSDP2 do. The test's groups, their sequence numbers and group counter are
not touched, and the test's world is back when ``reference`` returns or raises. Call it with
nothing of the test's in flight (no unwaited async collective).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .. import _compat
from ..rank import seeding
from . import paritydata as data
from .paritycalls import Across, LeafTable, current_test, first_difference, message, ranks_words
from .paritydata import Row
from .parityleaves import ParityUsageError, comparable, dtensor_type, kind_words, leaves

if TYPE_CHECKING:
    import torch

T = TypeVar("T")
#: The guards :func:`assert_close_to_reference` applies unless told otherwise.
DEFAULT_GUARDS = ("nan", "zeros", "constant")
#: The functions :func:`reference` is running, outermost first (nesting is refused).
_INSIDE: list[Any] = []


def reference(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` run at world size 1 in this rank, and its result.

    Inside, ``dist.get_rank()`` is 0, ``dist.get_world_size()`` 1, and the default group a
    one-rank group: a distributed ``fn`` (DDP, FSDP2's ``fully_shard``, DTensor, plain
    collectives) computes what one process computes. DTensors in the result come back as full
    tensors (``full_tensor()`` at size 1). Every rank may call it (each computes the same
    reference), or one rank alone: it takes no part of the test's collectives.
    """
    __tracebackhide__ = True
    if _INSIDE:
        raise ParityUsageError(
            f"reference({_name(fn)}) inside reference({_name(_INSIDE[-1])}) in "
            f"{current_test() or 'this test'}: the outer function already runs at world size 1, "
            f"so call {_name(fn)}(...) directly there; reference() cannot be nested (each call "
            "swaps in a one-rank world of its own)."
        )
    _INSIDE.append(fn)
    try:
        with _compat.one_rank_world():
            return _full(fn(*args, **kwargs))  # type: ignore[no-any-return]
    finally:
        _INSIDE.pop()


def _name(fn: Any) -> str:
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


# Why not torch's "fake" backend, whose size-1 collectives are exact too: DDP's reducer expects
# a tensor from its all_reduce future, and the fake group's future holds None (an internal
# assert in c10d/comm.cpp on torch 2.13). A real one-rank gloo group costs ~1 ms more.


def _full(value: Any) -> Any:
    dtensor = dtensor_type()
    if dtensor is not None and isinstance(value, dtensor):
        return value.full_tensor()
    if isinstance(value, Mapping):
        return type(value)({k: _full(v) for k, v in value.items()})  # type: ignore[call-arg]
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_full(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_full(v) for v in value)
    return value


def _this_rank() -> int:
    rank = os.environ.get("RANK", "")
    if rank.isdigit():
        return int(rank)
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def rank_inputs(
    seed: int | str | None = None,
    shape: int | Sequence[int] = (),
    *,
    rank: int | None = None,
    dtype: torch.dtype | None = None,
    device: Any = None,
) -> torch.Tensor:
    """A tensor of ``shape`` drawn for ``rank`` (default: this rank): the same for the same
    seed, shape, dtype and rank on every rank and in every session, different per rank.

    ``seed=None`` takes the test's own: the session seed (``--distrank-seed``) and the test's
    node id, as the per-rank seeding does; any rank can compute any rank's tensor, so the
    reference builds the global batch: ``torch.cat([rank_inputs(s, n, rank=r) for r in
    range(world_size)])``. Floating and complex dtypes are normal, integers in ``[0, 100)``,
    bools fair coins; drawn on the CPU, then moved to ``device``.
    """
    import torch

    r = _this_rank() if rank is None else int(rank)
    if r < 0:
        raise ParityUsageError(f"rank_inputs(rank={rank}): a rank is 0 or more")
    if seed is None:
        key = seeding.current_test_seed()
        if key is None:
            raise ParityUsageError(
                f"rank_inputs() in {current_test() or 'this test'} without a seed: the session "
                "has none (--distrank-seed=off, or outside a distributed test). Pass one: "
                "rank_inputs(1234, shape)."
            )
        number = seeding.seed_of(key[0], f"{key[1]}\0rank_inputs", r)
    else:
        number = seeding.seed_of(0, f"rank_inputs\0{seed!r}", r)
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = dtype or torch.get_default_dtype()
    generator = torch.Generator().manual_seed(number)
    if dtype.is_floating_point or dtype.is_complex:
        out = torch.randn(dims, generator=generator, dtype=dtype)
    elif dtype == torch.bool:
        out = torch.rand(dims, generator=generator) < 0.5
    else:
        out = torch.randint(0, 100, dims, generator=generator, dtype=dtype)
    return out if device is None else out.to(device)


def _rows(
    me: int,
    dist_out: Any,
    ref_out: Any,
    name: str,
    allow_empty: bool,
    rtol: float | None,
    atol: float | None,
    equal_nan: bool,
    guards: Sequence[str],
) -> list[tuple[str, Row]]:
    """This rank's row for every leaf of either side, against the reference's."""
    data.check_tolerances(rtol, atol)
    mine = dict(leaves(dist_out, name))
    theirs = dict(leaves(ref_out, name))
    if not allow_empty and not comparable([*mine.items(), *theirs.items()]):
        note = "compares nothing: no leaf on either side (pass allow_empty=True if meant)"
        return [("", Row(me, "empty", note=note))]
    rows: list[tuple[str, Row]] = []
    for path in [*mine, *(p for p in theirs if p not in mine)]:
        if path not in theirs:
            rows.append((path, Row(me, kind_words(mine[path]), note="not in the reference")))
            continue
        if path not in mine:
            rows.append((path, Row(me, "missing", note="missing here")))
            continue
        a, b = mine[path], theirs[path]
        row = data.compare(me, a, b, exact=False, rtol=rtol, atol=atol, equal_nan=equal_nan)
        guard = data.degenerate(a, b, guards)
        if guard and not row.differs:
            row.note = guard
        rows.append((path, row))
    return rows


def assert_close_to_reference(
    dist_out: Any,
    ref_out: Any,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool = False,
    guards: Sequence[str] | str = DEFAULT_GUARDS,
    group: Any = None,
    allow_empty: bool = False,
    name: str = "output",
) -> None:
    """Each rank's ``dist_out`` is close to ``ref_out`` (its part of :func:`reference`'s
    result): the same structure, shapes and dtypes, ``torch.isclose`` everywhere (``rtol`` and
    ``atol`` default to torch.testing.assert_close's for the dtype), and no guard tripped: with
    the default ``guards``, a leaf fails where both sides hold NaN (``nan``), are all zeros
    (``zeros``) or one value repeated (``constant``), however close they are.

    Takes what :func:`assert_equal_across_ranks` takes. A rank whose ``dist_out`` and
    ``ref_out`` both have no leaf fails ("compares nothing") unless ``allow_empty``. Every rank
    of ``group`` calls it and gets the same verdict (one small ``all_gather``); failures show a
    table of every rank against the reference.
    """
    __tracebackhide__ = True
    check = "assert_close_to_reference"
    arguments = dict(rtol=rtol, atol=atol, equal_nan=equal_nan, guards=data.guard_key(guards))
    across = Across(check, group, name=name, allow_empty=allow_empty, **arguments)
    me = across.ranks[across.index]
    try:
        chosen = data.check_guards(guards)
        rows = _rows(me, dist_out, ref_out, name, allow_empty, rtol, atol, equal_nan, chosen)
    except Exception as exc:
        if across.size == 1:
            raise
        across.fail_together(exc, 1)
    ok = not any(row.differs for _, row in rows)
    if across.size > 1:
        ok = all(g[0] for g in across.agree([int(ok)]))
    if ok:
        return
    every = across.gather_objects(rows) if across.size > 1 else [rows]
    tables: dict[str, LeafTable] = {}
    for rank_rows in every:
        for path, row in rank_rows:
            tables.setdefault(path, LeafTable(f"{name}{path}", [])).rows.append(row)
    shown = [t for t in tables.values() if any(row.differs for row in t.rows)]
    failing = sorted({row.rank for t in shown for row in t.rows if row.differs})
    guarded = all("(guard '" in row.note for t in shown for row in t.rows if row.differs)
    there = "the reference"
    empty = all(row.note.startswith("compares nothing") for t in shown for row in t.rows)
    if empty:
        headline = (
            f"{name} compares nothing on {ranks_words(failing)}: neither dist_out nor ref_out "
            "holds a tensor or value (empty dicts, lists or modules), so any code would pass."
        )
        advice = (
            "What to do: check that both values are built; pass allow_empty=True where an "
            "empty value is what the test expects."
        )
    elif guarded:
        headline = (
            f"{name} matches the reference on {ranks_words(failing)} only vacuously: "
            + next(row.note for t in shown for row in t.rows if row.differs)
            + ". Such a pair would match whatever the code computes."
        )
        advice = (
            "What to do: give the model inputs and weights that make its outputs vary "
            "(pytest_distrank.rank_inputs), or pass guards=() (or fewer guards) where the "
            "value is degenerate by design."
        )
    else:
        headline = f"{name} is not close to the reference on {ranks_words(failing)}."
        advice = (
            "What to do: the rows name each rank's largest error and its first element out of "
            "tolerance; check that each rank compares its own part of the reference (its batch "
            "slice or shard), then the step that differs."
        )
    first = first_difference(shown, there)
    raise AssertionError(
        message(check, current_test(), headline, shown, advice, [first] if first else [], there)
    )
