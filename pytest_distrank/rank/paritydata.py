"""One rank's row of a failed check's table, against the reference side, and the pieces the
checks move between ranks (packed tensors, portable leaves) or judge with (tolerances, guards).

Runs in rank processes of both modes, inside a test (:mod:`rank.parity`, :mod:`rank.reference`).
torch is imported only when a function is called. What a value's leaves are is
:mod:`rank.parityleaves`; what equal means, and its digest, :mod:`rank.parityequal`. Closeness:
the same shape and dtype, and ``torch.isclose(mine, theirs, rtol, atol, equal_nan)`` for every
element of a floating or complex tensor (float8 and complex32 widened exactly first); tensors of
other dtypes, and plain leaves, must be equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .parityequal import WIDEN, is_float
from .parityleaves import ParityUsageError, Plain, kind_words
from .paritytable import Row

if TYPE_CHECKING:
    import torch

__all__ = ["ParityUsageError", "compare", "degenerate", "pack", "portable", "unpack"]

#: The guards of :func:`degenerate`, in the order they are tried.
GUARDS = ("nan", "zeros", "constant")
#: torch.testing.assert_close's default (rtol, atol) per dtype name; others: exact.
TOLERANCES = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
    "complex32": (1e-3, 1e-5),
    "complex64": (1.3e-6, 1e-5),
    "complex128": (1e-7, 1e-7),
}


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


def pack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors' bytes, one after the other, in one CPU uint8 tensor (to broadcast once)."""
    import torch

    parts = [t.detach().cpu().contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)


def unpack(buffer: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors :func:`pack` packed, shaped and typed as ``like`` (on the CPU)."""
    out = []
    at = 0
    for t in like:
        n = t.numel() * t.element_size()
        chunk = buffer[at : at + n]
        if at % t.element_size():  # a view needs an offset aligned to the dtype's size
            chunk = chunk.clone()
        out.append(chunk.view(t.dtype).reshape(t.shape))
        at += n
    return out


def tolerances(dtype: Any, rtol: float | None, atol: float | None) -> tuple[float, float]:
    """(rtol, atol): the given ones, else torch.testing.assert_close's defaults for ``dtype``
    (0, 0 for integer and bool dtypes: exact)."""
    default = TOLERANCES.get(str(dtype).removeprefix("torch."), (0.0, 0.0))
    return (default[0] if rtol is None else rtol, default[1] if atol is None else atol)


def show(value: Any, other: Any = None) -> str:
    """A number as the table shows it: 6 significant digits, or as many more (up to 17,
    every digit a float64 has) as tell it apart from ``other``, the value it differs from."""
    if not isinstance(value, (float, complex)):
        return repr(value)
    for digits in (6, 9, 12, 17):
        text = f"{value:.{digits}g}"
        if other is None or value == other or text != f"{other:.{digits}g}":
            return text
    return text


def show_pair(mine: torch.Tensor, ref: torch.Tensor, flat: int) -> tuple[str, str]:
    """Element ``flat`` of ``mine`` and of ``ref``, each shown with enough digits to tell them
    apart (:func:`show`)."""
    try:
        a, b = mine.reshape(-1)[flat].item(), ref.reshape(-1)[flat].item()
    except (RuntimeError, TypeError):  # packed dtypes (float4)
        return show_element(mine, flat), show_element(ref, flat)
    return show(a, b), show(b, a)


def _index(flat: int, shape: Sequence[int]) -> str:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return "(" + ", ".join(str(i) for i in reversed(out)) + ("," if len(out) == 1 else "") + ")"


def wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in a dtype torch compares and subtracts in, exactly: float64 or complex128 for
    floating and complex dtypes, int64 for the others (uint64 by its bits)."""
    import torch

    if is_float(t):
        return t.to(torch.complex128 if t.is_complex() else torch.float64)
    if t.dtype == torch.uint64:
        return t.view(torch.int64)
    if str(t.dtype).startswith("torch.float4"):
        return t.view(torch.uint8).to(torch.int64)
    return t.to(torch.int64)


def close(
    mine: torch.Tensor, theirs: torch.Tensor, rtol: float | None, atol: float | None, nan: bool
) -> torch.Tensor:
    """Element by element: ``mine`` is close to ``theirs`` (same shape and dtype; on
    ``mine``'s device): ``torch.isclose`` for floating and complex dtypes, else equal."""
    import torch

    if not is_float(mine):
        return wide(mine) == wide(theirs)
    r, a = tolerances(mine.dtype, rtol, atol)
    widened = WIDEN.get(str(mine.dtype).removeprefix("torch."))
    if widened is not None:
        mine, theirs = mine.to(getattr(torch, widened)), theirs.to(getattr(torch, widened))
    return torch.isclose(mine, theirs, rtol=r, atol=a, equal_nan=nan)


def show_element(t: torch.Tensor, flat: int) -> str:
    """Element ``flat`` of ``t`` (flat index), or its byte where torch has no ``item()``."""
    import torch

    try:
        return show(t.reshape(-1)[flat].item())
    except (RuntimeError, TypeError):  # packed dtypes (float4)
        return f"0x{int(t.reshape(-1).view(torch.uint8)[flat].item()):02x}"


def compare(
    rank: int,
    mine: Any,
    ref: Any,
    *,
    exact: bool,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool = False,
) -> Row:
    """One rank's row for one leaf against the reference side's leaf."""
    import torch

    kind = kind_words(mine)
    if not isinstance(mine, torch.Tensor) or not isinstance(ref, torch.Tensor):
        same = isinstance(mine, Plain) and mine == ref
        note = "agrees" if same else ("type differs" if kind != kind_words(ref) else "differs")
        return Row(rank, kind, value=_text(mine), ref_value=_text(ref), note=note)
    if mine.shape != ref.shape:
        return Row(rank, kind, note="shape differs")
    if mine.dtype != ref.dtype:
        return Row(rank, kind, note="dtype differs")
    mine, ref = mine.cpu(), ref.cpu()
    a, b = wide(mine), wide(ref)
    if exact or not is_float(mine):
        bad = a != b
        if equal_nan and is_float(mine):
            bad &= ~(torch.isnan(a) & torch.isnan(b))
    else:
        bad = ~close(mine, ref, rtol, atol, equal_nan)
    total = mine.numel()
    count = int(bad.sum().item())
    if total == 0:
        return Row(rank, kind, mismatched="0/0", note="agrees")
    a, b = a.to(torch.complex128 if a.is_complex() else torch.float64), b.to(a.dtype)
    diff = (a - b).abs()
    rel = diff / b.abs()
    rel = torch.where(diff == 0, torch.zeros_like(rel), rel)
    row = Row(
        rank,
        kind,
        max_abs=float(diff.max().item()),
        max_rel=float(rel.max().item()),
        mismatched=f"{count}/{total}",
        note="agrees" if count == 0 else "differs",
    )
    if count:
        flat = int(bad.reshape(-1).nonzero()[0].item())
        row.index = _index(flat, mine.shape)
        row.value, row.ref_value = show_pair(mine, ref, flat)
    return row


def _text(leaf: Any) -> str:
    return leaf.text if isinstance(leaf, Plain) else kind_words(leaf)


def degenerate(mine: Any, ref: Any, guards: Sequence[str]) -> str:
    """The first guard that both sides trip, in words (``""`` when none): ``nan`` (both hold
    NaN), ``zeros`` (both all zeros), ``constant`` (both one value repeated, more than one
    element)."""
    import torch

    if not (isinstance(mine, torch.Tensor) and isinstance(ref, torch.Tensor)):
        return ""
    if mine.numel() == 0 or ref.numel() == 0:
        return ""
    for guard in guards:
        if guard == "nan" and bool(_has_nan(mine) and _has_nan(ref)):
            return "both sides hold NaN (guard 'nan')"
        if guard == "zeros" and bool((mine == 0).all() and (ref == 0).all()):
            return "both sides are all zeros (guard 'zeros')"
        if (
            guard == "constant"
            and mine.numel() > 1
            and bool((mine == mine.reshape(-1)[0]).all() and (ref == ref.reshape(-1)[0]).all())
        ):
            value = show(mine.reshape(-1)[0].item())
            return f"both sides hold one value repeated, {value} here (guard 'constant')"
    return ""


def _has_nan(t: torch.Tensor) -> bool:
    import torch

    return bool((t.is_floating_point() or t.is_complex()) and torch.isnan(t).any().item())


def check_tolerances(rtol: float | None, atol: float | None) -> None:
    """rtol and atol go together, as in torch.testing.assert_close: one without the other would
    pair a chosen tolerance with a default one the caller did not see."""
    if (rtol is None) != (atol is None):
        given, missing = ("rtol", "atol") if atol is None else ("atol", "rtol")
        raise ParityUsageError(
            f"{given} was given without {missing}: pass both or neither (as "
            "torch.testing.assert_close requires); the defaults for the dtype are in "
            "docs/parity.md."
        )


def guard_key(guards: Any) -> Any:
    """``guards`` as the call's digest shows it: a tuple where it is one in any spelling
    (``"nan"``, ``["nan"]``, ``("nan",)``); else as given (:func:`check_guards` refuses it)."""
    if isinstance(guards, str):
        return (guards,)
    try:
        return tuple(guards)
    except TypeError:
        return guards


def check_guards(guards: Sequence[str] | str) -> tuple[str, ...]:
    """The guards as a tuple, each one of :data:`GUARDS` (a ValueError names a bad one)."""
    if guards is None:
        raise ParityUsageError("guards=None: pass guards=() for no guards")
    if isinstance(guards, str):
        guards = (guards,)
    bad = [g for g in guards if g not in GUARDS]
    if bad:
        raise ParityUsageError(
            f"unknown guard {bad[0]!r}: the guards are {', '.join(map(repr, GUARDS))} "
            "(pass guards=() for none)"
        )
    return tuple(guards)
