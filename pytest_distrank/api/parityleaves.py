"""What a check across ranks sees of a value: its leaves, each a tensor or an exact plain value.

Runs in rank processes of both modes, inside a test (:mod:`api.parity`, :mod:`api.reference`).
torch is imported only when a function is called; numpy only where the test imported it. The
rules (docs/parity.md, "What each check compares"):

- Containers are walked: mappings by key (the key order is not compared; keys by exact type
  and value), lists and tuples by position (a list equals a tuple with the same items, never a
  mapping: a non-empty mapping leaves a mark, :data:`MAPPING`), dataclass instances by field
  (``.loss``; a mark names the dataclass's type), an ``nn.Module`` by its ``state_dict()``. An
  empty container is a leaf of its own kind: ``{"a": []}`` differs from ``{}``, ``{}`` from
  ``[]`` (:data:`EMPTY` for lists and tuples, :data:`EMPTY_MAPPING`).
- Leaves: tensors (detached; conjugate and negative bits resolved; sparse made dense; a
  replicated DTensor by its local tensor); numpy arrays and numpy scalars as the tensor of their
  dtype, shape and bytes; Python numbers as 0-dim tensors (``bool``, ``int`` as int64, ``float``
  as float64, ``complex`` as complex128; an ``int`` beyond int64 exactly, as a number); ``str``,
  ``bytes``, ``None``, enum members (type, name and value), ``torch.dtype`` and ``torch.device``
  exactly (:class:`Plain`).
- Anything else (iterators and generators, sets, objects of other classes) is refused with a
  :class:`ParityUsageError` naming the leaf's path and type and what to pass instead: nothing is
  ever compared by ``repr``.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

#: A leaf's path in the value, as written in Python: ``['w']``, ``[0]``, ``.loss``, or ``""``.
Leaves = list[tuple[str, Any]]
#: numpy dtype kinds torch holds: bool, signed and unsigned integers, floats, complex.
NUMPY_KINDS = "biufc"
#: What the checks take, for the refusals' messages.
TAKES = (
    "tensors, numpy arrays, numbers, str, bytes, None, enums, and lists, tuples, dicts, "
    "dataclasses and nn.Modules of them"
)


class ParityUsageError(ValueError):
    """A check across ranks was called with what it cannot check (a bad group, a sharded
    DTensor, a value of a type it does not compare, a simulated world): the test's error, not
    a difference between ranks."""

    #: Named without its module on the report's crash line, as pytest names its ``Failed``.
    __module__ = "builtins"


@dataclasses.dataclass(frozen=True)
class Plain:
    """A leaf compared exactly, not as a tensor: its kind (``str``, ``None``, ``enum Color``,
    ``empty`` ...) and its exact text (``'a'``, ``pkg.Color.RED``). Pickles whatever the
    original was, so a failed check can gather it."""

    kind: str
    text: str


#: The leaf an empty list or tuple leaves.
EMPTY = Plain("empty", "")
#: The leaf an empty mapping (``{}``, a module without state) leaves: never equal to ``[]``.
EMPTY_MAPPING = Plain("empty mapping", "")
#: The leaf a non-empty mapping leaves beside its items, at ``<path> (a mapping)``: a list and a
#: mapping with int keys would otherwise leave the same paths (``[0]``).
MAPPING = Plain("mapping", "")
#: What marks a container's shape, not a value: a check of only these compares nothing (and
#: a dataclass's mark, :func:`is_mark`).
MARKS = (EMPTY, EMPTY_MAPPING, MAPPING)
#: The kind of the mark a dataclass instance leaves at ``<path> (a dataclass)``: its type.
DATACLASS = "dataclass"


def is_mark(leaf: Any) -> bool:
    """Whether ``leaf`` marks a container's shape or type, not a value."""
    return leaf in MARKS or (isinstance(leaf, Plain) and leaf.kind == DATACLASS)


def leaves(value: Any, what: str) -> Leaves:
    """(path, leaf) of every leaf of ``value``, each as compared (:func:`normalize`); a
    ParityUsageError names the first leaf the checks cannot compare."""
    return [(p, normalize(p, v, what)) for p, v in flatten(value, what)]


def comparable(found: Sequence[tuple[str, Any]]) -> bool:
    """Whether any leaf holds something to compare (not only containers' marks)."""
    return any(not is_mark(leaf) for _, leaf in found)


def flatten(value: Any, what: str = "value", path: str = "", above: tuple[int, ...] = ()) -> Leaves:
    """(path, raw leaf) of every leaf of ``value``: containers walked, leaves as they are."""
    import torch

    if isinstance(value, torch.Tensor) or _numpy_value(value) or _exact(value):
        return [(path, value)]
    if id(value) in above:
        raise ParityUsageError(f"{what}{path} contains itself: a cycle cannot be compared.")
    above = (*above, id(value))
    if isinstance(value, torch.nn.Module):
        return flatten(value.state_dict(), what, path, above)
    marks: Leaves = []
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [(f".{f.name}", getattr(value, f.name)) for f in dataclasses.fields(value)]
        marks = [(f"{path} (a dataclass)", Plain(DATACLASS, _qualified(type(value))))]
    elif isinstance(value, Mapping):
        items = [(f"[{_key(what, path, key)}]", item) for key, item in value.items()]
        names = sorted(name for name, _ in items)
        twice = next((n for n, m in itertools.pairwise(names) if n == m), None)
        if twice is not None:
            raise ParityUsageError(
                f"{what}{path} has two keys written {twice[1:-1]}: keys are compared by their "
                "repr, so use keys whose repr tells them apart (str, int)."
            )
    elif isinstance(value, (list, tuple)):
        items = [(f"[{i}]", item) for i, item in enumerate(value)]
    else:
        raise ParityUsageError(_refusal(what, path, value))
    if not items and not marks:
        return [(path, EMPTY_MAPPING if isinstance(value, Mapping) else EMPTY)]
    out: Leaves = [(f"{path} (a mapping)", MAPPING)] if isinstance(value, Mapping) else marks
    for name, item in items:
        out += flatten(item, what, path + name, above)
    return out


#: Key types whose repr is exact (for these types exactly, not their subclasses).
_EXACT_KEYS = (str, bytes, bool, int, float, complex, type(None))


def _key(what: str, path: str, key: Any) -> str:
    """A mapping's key as its path writes it, exact in type and value (it names the leaf's
    path, compared across ranks): ``repr`` of a str, bytes, number or None (those types
    exactly: a subclass may print as anything), an enum member as its qualified name, and
    tuples of them."""
    if type(key) in _EXACT_KEYS:
        return repr(key)
    if isinstance(key, enum.Enum):
        return f"{_qualified(type(key))}.{key.name}"
    if type(key) is tuple:
        parts = [_key(what, path, k) for k in key]
        return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
    raise ParityUsageError(
        f"{what}{path} has a key of type {type(key).__qualname__} ({key!r}): keys are compared "
        "by type and value, which is exact only for str, bytes, numbers, None, enums and "
        "tuples of them (those types, not subclasses). Use such keys (e.g. str(key), or "
        "key.item() for a tensor)."
    )


def _qualified(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _numpy_value(value: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic))


def _exact(value: Any) -> bool:
    """Whether ``value`` is a leaf compared exactly (numbers included)."""
    import torch

    exact = (str, bytes, bool, int, float, complex, enum.Enum, torch.dtype, torch.device)
    return value is None or isinstance(value, exact)


def _refusal(what: str, path: str, value: Any) -> str:
    kind = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
    leaf = f"{what}{path}"
    if isinstance(value, Iterator):
        instead = (
            f"pass a list (list({leaf})) or, for a model's parameters, "
            "dict(model.named_parameters()) or model.state_dict()"
        )
        why = "an iterator: it can be read once, and its repr is an address"
    elif isinstance(value, (set, frozenset)):
        why, instead = "unordered: it has no order to compare by", f"pass sorted({leaf})"
    else:
        why = "of a type the checks do not compare (they never compare a repr)"
        instead = f"pass its data: torch.as_tensor({leaf}), a dict of its fields, or a dataclass"
    return f"{leaf} ({kind}) is {why}. The checks compare {TAKES}; {instead}."


def normalize(path: str, leaf: Any, what: str) -> Any:
    """A raw leaf as compared: a tensor (numbers, numpy values, DTensors, sparse tensors and
    views made plain tensors) or a :class:`Plain`."""
    import torch

    if isinstance(leaf, Plain):
        return leaf
    if _numpy_value(leaf):
        return _from_numpy(path, leaf, what)
    if isinstance(leaf, enum.Enum):
        value = leaf.value
        shown = repr(value) if type(value) in _EXACT_KEYS else f"a {type(value).__qualname__}"
        text = f"{_qualified(type(leaf))}.{leaf.name} = {shown}"
        return Plain(f"enum {type(leaf).__qualname__}", text)
    if isinstance(leaf, bool):
        return torch.tensor(leaf)
    if isinstance(leaf, int):
        if -(2**63) <= leaf < 2**63:
            return torch.tensor(int(leaf), dtype=torch.int64)
        return Plain("int", str(int(leaf)))
    if isinstance(leaf, float):
        return torch.tensor(float(leaf), dtype=torch.float64)
    if isinstance(leaf, complex):
        return torch.tensor(complex(leaf), dtype=torch.complex128)
    if not isinstance(leaf, torch.Tensor):
        return _plain(leaf)
    return _tensor(path, leaf, what)


def _plain(leaf: Any) -> Plain:
    import torch

    if leaf is None:
        return Plain("None", "None")
    if isinstance(leaf, str):
        return Plain("str", repr(str(leaf)))
    if isinstance(leaf, bytes):
        return Plain("bytes", repr(bytes(leaf)))
    if isinstance(leaf, torch.dtype):
        return Plain("dtype", str(leaf))
    return Plain("device", str(leaf))


def _tensor(path: str, leaf: Any, what: str) -> Any:
    import torch

    refused = _refused_tensor(leaf)
    if refused:
        raise ParityUsageError(f"{what}{path} is {refused}")
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
    if leaf.device.type == "meta":
        raise ParityUsageError(
            f"{what}{path} is a tensor on the meta device: it holds no values to compare. "
            "Compare it where it is materialised (to_empty() and initialised, or on a real device)."
        )
    if leaf.layout != torch.strided:
        leaf = leaf.to_dense()
    return leaf.resolve_conj().resolve_neg()


def _refused_tensor(leaf: Any) -> str:
    """Why the checks do not compare ``leaf`` (a tensor whose bytes are not its values), or
    ``""``."""
    import torch

    if isinstance(leaf, torch.nn.parameter.UninitializedTensorMixin):
        return (
            "an uninitialized parameter (a Lazy module before its first forward): it holds no "
            "values. Run one forward first, or compare after the model is built."
        )
    if type(leaf).__name__ == "MaskedTensor":
        return (
            "a MaskedTensor: its mask would not be compared. Compare "
            "{'data': x.get_data(), 'mask': x.get_mask()}."
        )
    if leaf.is_nested:
        return "a nested tensor: its components differ in shape. Compare list(x.unbind()) instead."
    if leaf.is_quantized:
        return (
            "a quantized tensor: its bytes are not its values. Compare {'int_repr': "
            "x.int_repr(), 'scale': x.q_scale(), 'zero_point': x.q_zero_point()} (per-channel: "
            "q_per_channel_scales() and q_per_channel_zero_points()), or x.dequantize()."
        )
    return ""


def _from_numpy(path: str, leaf: Any, what: str) -> Any:
    import numpy
    import torch

    if isinstance(leaf, numpy.ma.MaskedArray):
        raise ParityUsageError(
            f"{what}{path} is a numpy masked array: its mask would not be compared. Compare "
            f"{{'data': {what}{path}.filled(0), 'mask': numpy.ma.getmaskarray({what}{path})}}."
        )
    array = numpy.asarray(leaf)
    dtype = array.dtype
    if dtype.kind not in NUMPY_KINDS or dtype.names is not None or dtype.itemsize > 16:
        raise ParityUsageError(
            f"{what}{path} is a numpy {'array' if array.ndim else 'scalar'} of dtype {dtype}, "
            "which torch does not hold, so it is not compared. Convert it to one that torch "
            "holds (bool, integers, float16-64, complex64/128), or compare its items as a list."
        )
    if not dtype.isnative:
        array = array.astype(dtype.newbyteorder("="))
    try:
        return torch.from_numpy(numpy.array(array, copy=True, order="C"))
    except TypeError as exc:  # long double and the like
        raise ParityUsageError(
            f"{what}{path} is a numpy value of dtype {dtype}, which torch does not hold ({exc}). "
            "Convert it (astype(numpy.float64) where that loses nothing)."
        ) from None


def dtensor_type() -> Any:
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def kind_words(leaf: Any) -> str:
    """``(4, 8) float32``, ``() int64``, or a plain leaf's kind (``str``, ``empty``)."""
    import torch

    if isinstance(leaf, torch.Tensor):
        return f"{tuple(leaf.shape)} {str(leaf.dtype).removeprefix('torch.')}"
    if isinstance(leaf, Plain):
        return leaf.kind
    return type(leaf).__name__


def in_order(found: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The leaves by path: the order every rank hashes and sends them in (a mapping's key
    order is not compared)."""
    return sorted(found, key=lambda item: item[0])


def header(found: Sequence[tuple[str, Any]]) -> bytes:
    """What must agree before values can be compared: the paths, the kinds, and plain
    values themselves (exactly), in path order."""
    parts = []
    for path, leaf in in_order(found):
        text = f"\0{leaf.text}" if isinstance(leaf, Plain) else ""
        parts.append(f"{path}\0{kind_words(leaf)}{text}")
    return "\1".join(parts).encode(errors="surrogatepass")
