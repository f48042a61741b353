"""The rule of the checks across ranks, leaf by leaf: equality and its digest, closeness, and
one rank's row of a failed check's table against the reference side.

Runs in rank processes of both modes, inside a test (:mod:`api.parity`, :mod:`api.reference`);
torch is imported only when a function is called. What a value's leaves are is
:mod:`api.parityleaves`. Equality (docs/parity.md): two values are equal when they have the
same leaf paths and, path by path, plain leaves are equal (kind and exact text) and tensors have
the same shape and dtype and equal elements, as ``torch.equal`` says: ``-0.0 == 0.0``, and a NaN
(a complex element NaN in either part) equals nothing, itself included, unless ``equal_nan``.
The device is not compared. Elements are compared through their *canonical bytes* (zeros
signed ``+``, every NaN the same NaN under ``equal_nan``, bools 0 or 1, float8 and complex32
widened exactly to float32 and complex64), so the rule and the digest cannot disagree.

The digest hashes every leaf's canonical bytes: on the CPU with blake2b (a cryptographic hash:
two values with equal digests are equal); on an accelerator, on the device (no copy to the host),
with two 64-bit lanes of a keyed non-linear mix of each 8-byte word and its position
(:func:`device_lanes`): equal values always give equal digests; unequal ones collide with a
probability of about 2**-128 for values not built to collide (it is no cryptographic hash).

Closeness: the same shape and dtype, and ``torch.isclose(mine, theirs, rtol, atol, equal_nan)``
for every element of a floating or complex tensor (float8 and complex32 widened exactly first);
tensors of other dtypes, and plain leaves, must be equal.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .parityleaves import ParityUsageError, Plain, header, in_order, kind_words

if TYPE_CHECKING:
    import torch

__all__ = ["ParityUsageError", "Row", "compare", "degenerate", "digest", "equal", "pack", "unpack"]

#: Dtypes widened (exactly) before their values are canonical: torch has no arithmetic on them.
WIDEN = {
    "float8_e4m3fn": "float32",
    "float8_e4m3fnuz": "float32",
    "float8_e5m2": "float32",
    "float8_e5m2fnuz": "float32",
    "float8_e8m0fnu": "float32",
    "complex32": "complex64",
}
#: splitmix64's constants, as signed int64 (torch's int64 multiplication wraps).
_MIX = (0xBF58476D1CE4E5B9 - 2**64, 0x94D049BB133111EB - 2**64)
_GOLDEN = 0x9E3779B97F4A7C15 - 2**64


def is_float(t: torch.Tensor) -> bool:
    """Whether ``t``'s dtype has signed zeros and NaN semantics the rule follows."""
    name = str(t.dtype).removeprefix("torch.")
    return (t.is_floating_point() or t.is_complex()) and not name.startswith("float4")


def canonical(t: torch.Tensor, equal_nan: bool) -> torch.Tensor:
    """``t``'s values in a form whose bytes are equal exactly when the values are equal by the
    rule (NaN aside without ``equal_nan``): ``-0.0`` made ``0.0``, with ``equal_nan`` every NaN
    the same NaN, bools 0 or 1; float8 and complex32 first widened exactly. On ``t``'s device."""
    import torch

    if t.dtype == torch.bool:
        return t.view(torch.uint8) != 0
    if not is_float(t):
        return t
    widened = WIDEN.get(str(t.dtype).removeprefix("torch."))
    if widened is not None:
        t = t.to(getattr(torch, widened))
    t = t + 0  # -0.0 + 0 == +0.0, in both parts of a complex number
    if equal_nan:
        t = torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t)
    return t


def has_nan(t: torch.Tensor) -> bool:
    import torch

    return is_float(t) and bool(torch.isnan(canonical(t, False)).any().item())


def canonical_bytes(t: torch.Tensor, equal_nan: bool) -> bytes:
    """The canonical bytes of ``t`` (copied to the host): for the rule and tests."""
    c = canonical(t, equal_nan).cpu().contiguous()
    return bytes(_raw(c)) if c.numel() else b""


def blake(t: torch.Tensor) -> bytes:
    """blake2b (16 bytes) of a CPU tensor's bytes, read in place where it is contiguous."""
    c = t.contiguous()
    return hashlib.blake2b(_raw(c) if c.numel() else b"", digest_size=16).digest()


def _raw(t: torch.Tensor) -> Any:
    """The bytes of a contiguous, non-empty CPU tensor, in place (the caller keeps ``t``)."""
    return (ctypes.c_char * (t.numel() * t.element_size())).from_address(t.data_ptr())


def leaf_equal(a: Any, b: Any, equal_nan: bool) -> bool:
    """One leaf of each side, equal by the rule."""
    import torch

    if isinstance(a, Plain) or isinstance(b, Plain):
        return bool(a == b)
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not equal_nan and (has_nan(a) or has_nan(b)):
        return False
    return canonical_bytes(a, equal_nan) == canonical_bytes(b, equal_nan)


def equal(a: Sequence[tuple[str, Any]], b: Sequence[tuple[str, Any]], equal_nan: bool) -> bool:
    """Two values' leaves (:func:`parityleaves.leaves`), equal by the rule."""
    left, right = dict(a), dict(b)
    if left.keys() != right.keys():
        return False
    return all(leaf_equal(left[p], right[p], equal_nan) for p in left)


def words(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes as int64 words (zero-padded), on its device."""
    import torch

    raw = t.contiguous().reshape(-1).view(torch.uint8)
    pad = -raw.numel() % 8
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    return raw.view(torch.int64)


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """A logical right shift of int64 (torch's ``>>`` is arithmetic: mask the sign copies)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 (wrapping): a bijection that scatters every bit."""
    x = x ^ _shr(x, 30)
    x = x * _MIX[0]
    x = x ^ _shr(x, 27)
    x = x * _MIX[1]
    return x ^ _shr(x, 31)


def device_lanes(t: torch.Tensor, keys: tuple[int, int]) -> torch.Tensor:
    """Two int64 hash lanes of ``t``'s bytes, on its device: for each lane,
    ``sum(mix(word[i] ^ mix(i * golden + key)))`` (wrapping). Not linear in the words: a swap
    of two words, or changes that keep their sum, change it."""
    import torch

    w = words(t)
    pos = torch.arange(w.numel(), device=w.device, dtype=torch.int64) * _GOLDEN
    lanes = [mix(w ^ mix(pos + key)).sum() for key in keys]
    return torch.stack(lanes)


def digest(found: Sequence[tuple[str, Any]], equal_nan: bool) -> tuple[list[int], bool, int]:
    """A 128-bit digest of the leaves (paths, kinds, plain values and every tensor's canonical
    bytes) as two int64; whether a tensor holds NaN (always False under ``equal_nan``); and the
    hash each tensor leaf took, as bits (1: on its device), so that ranks whose leaves lie on
    different devices know their digests cannot be compared."""
    import torch

    h = hashlib.blake2b(header(found), digest_size=16)
    seed = h.copy().digest()
    keys = (
        int.from_bytes(seed[:8], "little", signed=True),
        int.from_bytes(seed[8:], "little", signed=True),
    )
    nan = False
    where = 0
    ordered = in_order(found)
    for i, (_, leaf) in enumerate(p for p in ordered if isinstance(p[1], torch.Tensor)):
        c = canonical(leaf, equal_nan)
        if c.device.type == "cpu":
            nan = nan or (not equal_nan and is_float(c) and bool(torch.isnan(c).any()))
            h.update(blake(c))
            continue
        where |= 1 << (i % 63)
        flag = torch.isnan(c).any() if not equal_nan and is_float(c) else torch.tensor(False)
        lanes = device_lanes(c, keys)
        numbers = torch.cat([lanes, flag.to(lanes.device, torch.int64).reshape(1)]).tolist()
        nan = nan or bool(numbers[2])  # one copy of 24 bytes per leaf, no copy of the tensor
        h.update(b"".join(n.to_bytes(8, "little", signed=True) for n in numbers[:2]))
    raw = h.digest()
    return [int.from_bytes(raw[i : i + 8], "little", signed=True) for i in (0, 8)], nan, where


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
