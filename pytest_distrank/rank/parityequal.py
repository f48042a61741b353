"""Equality across ranks: the rule, as a pure function of two ranks' leaves, and its digest.

Runs in rank processes of both modes, inside a test (:mod:`rank.parity`); torch is imported only
when a function is called. The rule (docs/parity.md): two values are equal when they have the
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
"""

from __future__ import annotations

import ctypes
import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .parityleaves import Plain, header, in_order

if TYPE_CHECKING:
    import torch

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
    wide = WIDEN.get(str(t.dtype).removeprefix("torch."))
    if wide is not None:
        t = t.to(getattr(torch, wide))
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
