"""What the checks across ranks compare: a value's leaves, their checksums, and one rank's row
of the table against the reference side.

Runs in rank processes of both modes, inside a test (:mod:`rank.parity`, :mod:`rank.reference`).
torch is imported only when a function is called. The rules:

- A value is flattened into leaves: mappings by key, lists and tuples by position; anything
  else is a leaf. Python numbers (``bool``, ``int``, ``float``, ``complex``) are compared as
  0-dim tensors (``float`` as float64); other plain values (``str``, ``None``, ...) by ``repr``.
- Equal means ``torch.equal``: the same shape, dtype and values; ``-0.0`` equals ``0.0``; NaN
  equals nothing, itself included, unless ``equal_nan``. The device is not compared.
- A DTensor is compared by its local tensor (``to_local()``) when every placement is
  ``Replicate``: then every rank must hold the same values. A sharded or partial DTensor holds
  different values per rank by design and is refused: compare ``x.full_tensor()`` (a collective
  of the test on its mesh) or ``x.to_local()`` explicitly.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .paritytable import Row

if TYPE_CHECKING:
    import torch

#: (a, b) of the checksum's two sums of word * (position * a + b), mod 2**64 (int64 wraps).
_WEIGHTS = (
    (0x9E3779B97F4A7C15 - 2**64, 0x632BE59BD9B4E019),
    (0x2545F4914F6CDD1D, 0x5851F42D4C957F2D),
)
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


class ParityUsageError(ValueError):
    """A check across ranks was called with what it cannot check (a bad group, a sharded
    DTensor, a simulated world): the test's error, not a difference between ranks."""

    #: Named without its module on the report's crash line, as pytest names its ``Failed``.
    __module__ = "builtins"


def flatten(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """(path, leaf) of every leaf of ``value``: ``['w']``, ``[0]``, ``[0]['b']``, or ``""``."""
    import torch

    if isinstance(value, torch.Tensor):
        return [(path, value)]
    if isinstance(value, Mapping):
        out: list[tuple[str, Any]] = []
        for key, item in value.items():
            out += flatten(item, f"{path}[{key!r}]")
        return out
    if isinstance(value, (list, tuple)):
        out = []
        for i, item in enumerate(value):
            out += flatten(item, f"{path}[{i}]")
        return out
    return [(path, value)]


def normalize(path: str, leaf: Any, what: str) -> Any:
    """A leaf as compared: a tensor (numbers become 0-dim tensors, DTensors their local
    tensor, sparse ones dense), or the plain value itself."""
    import torch

    if isinstance(leaf, (bool, int, float, complex)):
        return torch.tensor(leaf, dtype=torch.float64 if type(leaf) is float else None)
    if not isinstance(leaf, torch.Tensor):
        return leaf
    leaf = leaf.detach()
    dtensor = dtensor_type()
    if dtensor is not None and isinstance(leaf, dtensor):
        placements = tuple(leaf.placements)
        if not all(type(p).__name__ == "Replicate" for p in placements):
            names = ", ".join(str(p) for p in placements)
            raise ParityUsageError(
                f"{what}{path} is a DTensor with placements ({names}): its local tensors differ "
                "between ranks by design, so they are not compared. Compare "
                f"{what}{path}.full_tensor() (a collective of the test, on its mesh) or "
                f"{what}{path}.to_local() explicitly."
            )
        leaf = leaf.to_local()
    if leaf.layout != torch.strided:
        leaf = leaf.to_dense()
    return leaf


def dtensor_type() -> Any:
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def kind_words(leaf: Any) -> str:
    """``(4, 8) float32``, ``() int64``, or the type of a plain value."""
    import torch

    if isinstance(leaf, torch.Tensor):
        return f"{tuple(leaf.shape)} {str(leaf.dtype).removeprefix('torch.')}"
    return type(leaf).__name__


def header(leaves: Sequence[tuple[str, Any]]) -> bytes:
    """What must agree before values can be compared: the paths, the kinds, and plain
    values themselves (by ``repr``)."""
    import torch

    parts = []
    for path, leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            parts.append(f"{path}\0{kind_words(leaf)}")
        else:
            parts.append(f"{path}\0{kind_words(leaf)}\0{leaf!r}")
    return "\1".join(parts).encode(errors="backslashreplace")


def canonical(t: torch.Tensor, equal_nan: bool) -> torch.Tensor:
    """``t`` with ``-0.0`` made ``0.0`` and, with ``equal_nan``, every NaN the same NaN."""
    import torch

    if not (t.is_floating_point() or t.is_complex()):
        return t
    t = t + 0  # -0.0 + 0 == +0.0
    if equal_nan:
        t = torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t)
    return t


def words(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes as int64 words (zero-padded), on its device."""
    import torch

    raw = t.contiguous().reshape(-1).view(torch.uint8)
    pad = -raw.numel() % 8
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    return raw.view(torch.int64)


def digest(leaves: Sequence[tuple[str, Any]], equal_nan: bool) -> tuple[list[int], bool]:
    """A 128-bit checksum of the leaves (header and every tensor's bytes, canonical) as two
    int64, and whether a tensor holds NaN (always False under ``equal_nan``).

    Each tensor's words are summed three ways on its own device (plain, and weighted by two
    linear functions of the position, mod 2**64): one changed word, or two swapped, changes the
    sums; one ``tolist`` per check brings them back (no copy of the tensor to the host).
    """
    import torch

    sums = []
    nan = []
    for _, leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            continue
        c = canonical(leaf, equal_nan)
        w = words(c)
        pos = torch.arange(1, w.numel() + 1, device=w.device, dtype=torch.int64)
        parts = [w.sum()] + [(w * (pos * a + b)).sum() for a, b in _WEIGHTS]
        sums.append(torch.stack(parts))
        if not equal_nan and (c.is_floating_point() or c.is_complex()):
            nan.append(torch.isnan(c).any().reshape(1))
    numbers: list[int] = torch.cat(sums).tolist() if sums else []
    has_nan = bool(torch.cat(nan).any().item()) if nan else False
    h = hashlib.blake2b(header(leaves), digest_size=16)
    h.update(b"".join(n.to_bytes(8, "little", signed=True) for n in numbers))
    raw = h.digest()
    return [int.from_bytes(raw[i : i + 8], "little", signed=True) for i in (0, 8)], has_nan


def portable(leaves: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The leaves with tensors on the CPU, to be gathered by ``all_gather_object``."""
    import torch

    return [(p, v.cpu() if isinstance(v, torch.Tensor) else v) for p, v in leaves]


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


def show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, complex):
        return f"{value:.6g}"
    return repr(value)


def _index(flat: int, shape: Sequence[int]) -> str:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return "(" + ", ".join(str(i) for i in reversed(out)) + ("," if len(out) == 1 else "") + ")"


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
        same = type(mine) is type(ref) and repr(mine) == repr(ref)
        note = "agrees" if same else ("type differs" if kind != kind_words(ref) else "differs")
        return Row(rank, kind, value=show(mine), ref_value=show(ref), note=note)
    if mine.shape != ref.shape:
        return Row(rank, kind, note="shape differs")
    if mine.dtype != ref.dtype:
        return Row(rank, kind, note="dtype differs")
    mine, ref = mine.cpu(), ref.cpu()
    wide = torch.complex128 if mine.is_complex() else torch.float64
    a, b = mine.to(wide), ref.to(wide)
    if exact:
        bad = ~(mine == ref)
        if equal_nan and (mine.is_floating_point() or mine.is_complex()):
            bad &= ~(torch.isnan(mine) & torch.isnan(ref))
    else:
        r, t = tolerances(mine.dtype, rtol, atol)
        bad = ~torch.isclose(a, b, rtol=r, atol=t, equal_nan=equal_nan)
    total = mine.numel()
    count = int(bad.sum().item())
    if total == 0:
        return Row(rank, kind, mismatched="0/0", note="agrees")
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
        row.value = show(mine.reshape(-1)[flat].item())
        row.ref_value = show(ref.reshape(-1)[flat].item())
    return row


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


def check_guards(guards: Sequence[str] | str) -> tuple[str, ...]:
    """The guards as a tuple, each one of :data:`GUARDS` (a ValueError names a bad one)."""
    if isinstance(guards, str):
        guards = (guards,)
    bad = [g for g in guards if g not in GUARDS]
    if bad:
        raise ParityUsageError(
            f"unknown guard {bad[0]!r}: the guards are {', '.join(map(repr, GUARDS))} "
            "(pass guards=() for none)"
        )
    return tuple(guards)
