"""Properties of the checks across ranks' judgement (api/parityleaves.py, api/paritydata.py),
over generated values. Pure: no ranks, no processes.

Tensors of every dtype torch holds (bfloat16, the float8 types, complex32, uint16/32/64 and the
packed float4 included: hypothesis.extra.numpy has no strategy for them) are made from raw bytes
(``torch.frombuffer(...).view(dtype)``), then paired with a second tensor made from the first the
ways values meet in tests: a copy, a non-contiguous copy, conjugate and negative views of the
same values, zeros with the other sign, NaN with another payload, two elements swapped, one byte
changed, the same bytes as another dtype or shape. Every verdict is checked against an oracle
written without the code under test: element by element, in Python numbers.
"""

from __future__ import annotations

import cmath
import dataclasses
import enum
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from pytest_distrank.api import paritycalls, parityleaves
from pytest_distrank.api import paritydata as data
from pytest_distrank.api.parityleaves import ParityUsageError

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")

FLOAT8 = [getattr(torch, n) for n in dir(torch) if n.startswith("float8_")]
DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex32,
    torch.complex64,
    torch.complex128,
    torch.float4_e2m1fn_x2,
    *FLOAT8,
]
#: Bytes that make special values in some dtype: zeros of either sign, NaN and inf patterns.
SPECIAL = [0x00, 0x80, 0x7F, 0xFF, 0x7C, 0xFC, 0x7E, 0x3C, 0x01]


def size_of(dtype: torch.dtype) -> int:
    return int(torch.empty(0, dtype=dtype).element_size())


shapes: st.SearchStrategy[list[int]] = st.one_of(
    st.just([]),
    st.lists(st.integers(1, 4), min_size=1, max_size=3),
    st.lists(st.integers(0, 2), min_size=1, max_size=2),
)
#: Values written into floating tensors often: zeros of both signs, NaN, infinities.
SPECIAL_VALUES = [float("nan"), -0.0, 0.0, -0.0, 0.0, float("inf"), -float("inf"), 1.0]


@st.composite
def tensors(draw: st.DrawFn, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A tensor of any dtype and a small shape, its bytes drawn (special bytes often), and in
    floating ones, special values written at drawn places."""
    dtype = dtype or draw(st.sampled_from(DTYPES))
    shape = draw(shapes)
    n = math.prod(shape) * size_of(dtype)
    byte = st.one_of(st.sampled_from(SPECIAL), st.integers(0, 255))
    raw = draw(st.lists(byte, min_size=n, max_size=n))
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if n else torch.empty(0)
    t = flat.to(torch.uint8).view(dtype).reshape(shape)
    if t.numel() and is_float(t) and dtype is not torch.float8_e8m0fnu:
        wide = t.to(torch.complex64 if t.is_complex() else torch.float32).reshape(-1)
        for _ in range(draw(st.integers(0, 3))):
            wide[draw(st.integers(0, t.numel() - 1))] = draw(st.sampled_from(SPECIAL_VALUES))
        t = wide.to(dtype).reshape(shape)
    return t


def is_float(t: torch.Tensor) -> bool:
    return (t.is_floating_point() or t.is_complex()) and not str(t.dtype).startswith("torch.float4")


def python_values(t: torch.Tensor) -> list[Any]:
    """``t``'s elements as Python numbers, by a path that shares nothing with canonical()."""
    t = t.resolve_conj().resolve_neg().contiguous()
    if t.dtype == torch.bool:
        return [v != 0 for v in t.view(torch.uint8).reshape(-1).tolist()]
    if is_float(t):
        wide = torch.complex128 if t.is_complex() else torch.float64
        return list(t.to(wide).reshape(-1).tolist())
    if str(t.dtype).startswith("torch.float4"):
        return list(t.view(torch.uint8).reshape(-1).tolist())
    return list(t.reshape(-1).tolist())


def isnan(v: Any) -> bool:
    return isinstance(v, (float, complex)) and cmath.isnan(v)


def oracle_equal(a: torch.Tensor, b: torch.Tensor, equal_nan: bool) -> bool:
    """torch.equal's rule, element by element: -0.0 == 0.0; NaN equals NaN only under
    equal_nan; the same dtype and shape."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    pairs = zip(python_values(a), python_values(b), strict=True)
    return all((x == y) or (equal_nan and isnan(x) and isnan(y)) for x, y in pairs)


def has_nan(t: torch.Tensor) -> bool:
    return any(isnan(v) for v in python_values(t))


def variants(a: torch.Tensor) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """Ways to make a second value from the first."""

    def copy(t: torch.Tensor) -> torch.Tensor:
        return t.clone()

    def strided(t: torch.Tensor) -> torch.Tensor:  # the same values, other strides
        if t.dim() < 2:
            return t.clone()
        return t.transpose(0, 1).contiguous().transpose(0, 1)

    def conj_view(t: torch.Tensor) -> torch.Tensor:  # a conjugate view of the same values
        return t.conj().resolve_conj().conj() if t.is_complex() else t.clone()

    def neg_view(t: torch.Tensor) -> torch.Tensor:  # a negative view: -(-t)
        if t.dtype not in (torch.float32, torch.float64, torch.complex64, torch.complex128):
            return t.clone()
        return torch._neg_view(torch._neg_view(t).resolve_neg())

    def zeros_flipped(t: torch.Tensor) -> torch.Tensor:  # 0.0 <-> -0.0 (byte 0x80 on top)
        out = t.clone()
        raw = (
            out.reshape(-1).view(torch.uint8).reshape(-1, out.element_size())
            if out.numel()
            else None
        )
        if raw is None or not is_float(t) or t.is_complex() or t.dtype in FLOAT8[-1:]:
            return out
        zero = raw[:, :-1].eq(0).all(1) & ((raw[:, -1] == 0) | (raw[:, -1] == 0x80))
        raw[zero, -1] ^= 0x80
        return out

    def swapped(t: torch.Tensor) -> torch.Tensor:  # the D1 class: a permutation of elements
        flat = t.reshape(-1).clone()
        if flat.numel() >= 2:
            flat.view(torch.uint8).reshape(flat.numel(), -1)[[0, -1]] = (
                flat.view(torch.uint8).reshape(flat.numel(), -1)[[-1, 0]].clone()
            )
        return flat.reshape(t.shape)

    def words_swapped(t: torch.Tensor) -> torch.Tensor:  # the first and last 8 bytes swapped
        out = t.clone()
        raw = out.reshape(-1).view(torch.uint8)
        if raw.numel() >= 16 and raw.numel() % 8 == 0:
            first, last = raw[:8].clone(), raw[-8:].clone()
            raw[:8], raw[-8:] = last, first
        return out

    def byte_changed(t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        if out.numel():
            out.reshape(-1).view(torch.uint8)[0] ^= 0x01
        return out

    def other_shape(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(-1).clone() if t.dim() != 1 else t.reshape(1, -1).clone()

    def other_dtype(t: torch.Tensor) -> torch.Tensor:
        same = [d for d in DTYPES if size_of(d) == t.element_size() and d != t.dtype]
        return t.clone().view(same[0]) if same and t.dim() else t.clone()

    return [copy, strided, conj_view, neg_view, zeros_flipped, swapped, words_swapped,
            byte_changed, other_shape, other_dtype]  # fmt: skip


@st.composite
def pairs(draw: st.DrawFn, only: tuple[str, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """A tensor and one made from it (by the variants named in ``only``, else any), its zeros
    then often given the other sign."""
    a = draw(tensors())
    made = [v for v in variants(a) if not only or v.__name__ in only]
    b = draw(st.sampled_from(made))(a)
    if draw(st.booleans()):
        b = next(v for v in variants(b) if v.__name__ == "zeros_flipped")(b)
    return a, b


def leaves(value: Any) -> list[tuple[str, Any]]:
    return parityleaves.leaves(value, "x")


@given(pairs(), st.booleans())
def test_equality_is_torch_equal_element_by_element(pair: tuple[Any, Any], equal_nan: bool) -> None:
    """Rule: two tensors are equal exactly when they have the same dtype and shape and each
    element equals the other's as Python numbers (-0.0 == 0.0), NaN equal to NaN only under
    equal_nan; views, strides, conjugate and negative bits do not matter."""
    a, b = pair
    assert data.equal(leaves(a), leaves(b), equal_nan) == oracle_equal(a, b, equal_nan)


@given(tensors(), st.booleans())
def test_the_sign_of_zero_does_not_count(a: torch.Tensor, equal_nan: bool) -> None:
    """Rule: -0.0 == 0.0: a value equals its copy with every zero's sign flipped, and their
    digests are equal (unless NaN makes both unequal)."""
    b = next(v for v in variants(a) if v.__name__ == "zeros_flipped")(a)
    expected = oracle_equal(a, b, equal_nan)
    assert data.equal(leaves(a), leaves(b), equal_nan) == expected
    key_a, nan, _ = data.digest(leaves(a), equal_nan)
    assert (key_a == data.digest(leaves(b), equal_nan)[0] and not nan) == expected


@given(pairs(("other_dtype", "other_shape")), st.booleans())
def test_dtype_and_shape_always_count(pair: tuple[Any, Any], equal_nan: bool) -> None:
    """Rule: the same bytes as another dtype or shape are another value: unequal, and their
    digests differ (unless the variant could not change them: a 0-dim tensor's dtype)."""
    a, b = pair
    assume(a.dtype != b.dtype or a.shape != b.shape)
    assert not data.equal(leaves(a), leaves(b), equal_nan)
    assert data.digest(leaves(a), True)[0] != data.digest(leaves(b), True)[0]


@given(pairs(), st.booleans())
def test_digests_are_equal_exactly_for_equal_values(pair: tuple[Any, Any], equal_nan: bool) -> None:
    """Rule: the digest of equal values is equal, the digest of unequal values differs (no
    linear collisions: swaps and sum-keeping changes too); a NaN is flagged unless equal_nan,
    and then the check fails whatever the digests say."""
    a, b = pair
    key_a, nan_a, _ = data.digest(leaves(a), equal_nan)
    key_b, nan_b, _ = data.digest(leaves(b), equal_nan)
    assert nan_a == (not equal_nan and has_nan(a)) and nan_b == (not equal_nan and has_nan(b))
    passes = key_a == key_b and not nan_a and not nan_b
    assert passes == oracle_equal(a, b, equal_nan)


@given(
    pairs(("copy", "swapped", "words_swapped", "byte_changed")), st.integers(-(2**63), 2**63 - 1)
)
def test_the_device_hash_tells_bytes_apart(pair: tuple[Any, Any], key: int) -> None:
    """Rule: the on-device hash (run here on the CPU) of two canonical tensors of the same size
    is equal exactly when their bytes are (not linear: swapped words differ)."""
    a, b = pair
    ca, cb = data.canonical(a, True), data.canonical(b, True)
    assume(ca.numel() * ca.element_size() == cb.numel() * cb.element_size())
    same = data.canonical_bytes(a, True) == data.canonical_bytes(b, True)
    lanes_a = data.device_lanes(ca, (key, ~key)).tolist()
    lanes_b = data.device_lanes(cb, (key, ~key)).tolist()
    assert (lanes_a == lanes_b) == same


@given(pairs(), st.booleans(), st.sampled_from([0.0, 1e-3, 0.5]))
def test_closeness_extends_equality(pair: tuple[Any, Any], equal_nan: bool, tol: float) -> None:
    """Rule: equal values are close at any tolerance; at rtol = atol = 0, close is equal
    (NaN close to NaN only under equal_nan); dtypes without NaN are close only when equal."""
    a, b = pair
    assume(a.dtype == b.dtype and a.shape == b.shape)
    close = bool(data.close(a, b, tol, tol, equal_nan).all())
    if oracle_equal(a, b, equal_nan):
        assert close
    if tol == 0.0 or not is_float(a):
        assert close == oracle_equal(a, b, equal_nan)


@given(pairs(), st.booleans())
def test_the_table_row_agrees_with_the_rule(pair: tuple[Any, Any], equal_nan: bool) -> None:
    """Rule: a failed equality's table marks a rank's row as differing exactly when its leaf
    is unequal by the rule, and counts the differing elements."""
    a, b = pair
    la, lb = leaves(a)[0][1], leaves(b)[0][1]
    row = data.compare(1, la, lb, exact=True, equal_nan=equal_nan)
    assert row.differs == (not oracle_equal(a, b, equal_nan))
    if a.dtype == b.dtype and a.shape == b.shape and a.numel():
        count = sum(
            not (x == y or (equal_nan and isnan(x) and isnan(y)))
            for x, y in zip(python_values(a), python_values(b), strict=True)
        )
        assert row.mismatched == f"{count}/{a.numel()}"


@given(st.lists(tensors(), max_size=4))
def test_packed_tensors_come_back_as_they_were(items: list[torch.Tensor]) -> None:
    """Rule: closeness's broadcast buffer (pack, unpack) returns every tensor's dtype, shape
    and bytes, whatever the dtype and the alignment of what came before."""
    found = [t for _, t in leaves(items)] if items else []
    found = [t for t in found if isinstance(t, torch.Tensor)]
    back = data.unpack(data.pack(found), found)
    for t, u in zip(found, back, strict=True):
        assert (t.dtype, t.shape) == (u.dtype, u.shape)
        assert data.canonical_bytes(t, True) == data.canonical_bytes(u, True)


def only_plain_data(sent: Any) -> bool:
    """Whether ``sent`` is made of str, int, bytes, tuples, lists and Plain only."""
    if isinstance(sent, (str, int, bytes, parityleaves.Plain)):
        return True
    return isinstance(sent, (tuple, list)) and all(only_plain_data(x) for x in sent)


@given(st.lists(st.one_of(tensors(), st.text(max_size=2)), max_size=4))
def test_the_failure_path_sends_plain_data_and_rebuilds_every_leaf(items: list[Any]) -> None:
    """Rule: what a failed check gathers for its table (portable) is str, int and bytes only,
    pickles whatever the dtype (float8, float4, complex32, uint16-64 tensors cannot be pickled
    by torch) or the tensor's subclass, and from_portable gives back every leaf's path, dtype,
    shape and bytes."""
    import pickle

    found = leaves(items)
    sent = paritycalls.portable(found)
    assert only_plain_data(sent)
    back = paritycalls.from_portable(pickle.loads(pickle.dumps(sent)))
    for (p, t), (q, u) in zip(found, back, strict=True):
        assert p == q
        if isinstance(t, torch.Tensor):
            assert (t.dtype, t.shape) == (u.dtype, u.shape)
            assert data.canonical_bytes(t, True) == data.canonical_bytes(u, True)
        else:
            assert t == u


@given(
    st.floats(allow_nan=False, min_value=-1e300, max_value=1e300),
    st.sampled_from([0.0, 1e-16, 1e-13, 1e-10, 1e-7, 1e-3, 1.0]),
    st.floats(allow_nan=False),
    st.booleans(),
)
def test_a_difference_is_shown_with_digits_that_show_it(
    a: float, rel: float, other: float, near: bool
) -> None:
    """Rule: the table shows two different numbers as two different texts (6 significant
    digits, more where 6 would print them alike: float64 1 and 1 + 1e-6 read '1' and '1'), and
    equal numbers alike (but for the sign of zero, which the table shows)."""
    b = a * (1 + rel) if near else other
    assume(a != 0.0 or b != 0.0)
    assert (data.show(a, b) != data.show(b, a)) == (a != b)
    if a == b or f"{a:.6g}" != f"{b:.6g}":
        assert data.show(a, b) == f"{a:.6g}"


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Shade(enum.IntEnum):  # RED == 1 in Python; a member of another type here
    RED = 1
    BLUE = 2


@dataclasses.dataclass
class Step:
    loss: Any
    step: Any


@dataclasses.dataclass
class Other:  # the same fields as Step: still another type
    loss: Any
    step: Any


plain = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.complex_numbers(allow_nan=False),
    st.text(max_size=3),
    st.binary(max_size=3),
    st.sampled_from([*Color, *Shade]),
)


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    # A named function, not a lambda: Hypothesis reads an extend function's source to check it
    # uses its argument, and a multi-line lambda's source is not always found (a deprecation
    # warning, an error under filterwarnings=error).
    return st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from(["a", "b", 0, 1, Color.RED, Shade.RED]), inner, max_size=3),
        st.builds(Step, inner, inner),
        st.builds(Other, inner, inner),
    )


def structures(leaf: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(leaf, _containers, max_leaves=6)


def python_equal(a: Any, b: Any) -> bool:
    """The documented rule for plain Python structures: lists and tuples alike by position,
    mappings by key (order aside; keys by exact type and value; never equal to a list, empty or
    not), dataclasses by type and field; numbers by type and value (True, 1 and 1.0 differ;
    -0.0 == 0.0); enum members by type, name and value; others by type and value."""
    if dataclasses.is_dataclass(a) or dataclasses.is_dataclass(b):
        if type(a) is not type(b):
            return False
        fields = [f.name for f in dataclasses.fields(a)]
        return all(python_equal(getattr(a, n), getattr(b, n)) for n in fields)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if not a and not b:
            return True
        return len(a) == len(b) and all(python_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        if not a and not b:
            return True
        typed = {(type(k), k) for k in a} == {(type(k), k) for k in b}
        return typed and all(python_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple, dict)) or isinstance(b, (list, tuple, dict)):
        return False
    number = (bool, int, float, complex)
    if isinstance(a, number) and isinstance(b, number):
        return number_kind(a) == number_kind(b) and a == b
    return type(a) is type(b) and a == b


def number_kind(v: Any) -> Any:
    """A Python number's type, with ints beyond int64 a kind of their own."""
    return "big" if type(v) is int and abs(v) >= 2**63 else type(v)


@given(structures(plain), structures(plain))
def test_plain_structures_follow_the_documented_rule(a: Any, b: Any) -> None:
    """Rule: for values made of Python containers and plain leaves, equality and the digest
    follow python_equal (list == tuple, key order aside, True != 1 != 1.0, an empty container
    differs from none at all, big ints exactly)."""
    same = python_equal(a, b)
    assert data.equal(leaves(a), leaves(b), False) == same
    assert (data.digest(leaves(a), False)[0] == data.digest(leaves(b), False)[0]) == same


class Sneaky(str):  # prints as the int key 1
    def __repr__(self) -> str:
        return "1"


def differ_or_refused(x: Any, y: Any) -> bool:
    try:
        lx, ly = leaves(x), leaves(y)
    except ParityUsageError:
        return True
    same = data.digest(lx, False)[0] == data.digest(ly, False)[0]
    return not data.equal(lx, ly, False) and not same


@given(structures(plain), structures(plain))
def test_the_kind_of_a_container_or_key_counts(a: Any, b: Any) -> None:
    """Rule: the same contents under another kind differ (or are refused), in equality and
    the digest alike: a dataclass of another type with the same fields; a mapping and a list,
    empty ones too; an int key and an IntEnum or str-subclass key that Python or repr takes for
    it; an enum member and another enum's member of the same name. A list and a tuple with the
    same items are equal."""
    pairs = [
        (Step(a, b), Other(a, b)),
        ({}, []),
        ({1: a}, {Shade.RED: a}),
        ({1: a}, {Sneaky("x"): a}),
        ([Color.RED, a], [Shade.RED, a]),
    ]
    for x, y in pairs:
        assert differ_or_refused(x, y), (x, y)
    assert data.equal(leaves([a, b]), leaves((a, b)), False)


@given(st.integers(-3, 3), st.sampled_from([bool, int, float, complex, np.int64, np.float64]))
def test_numbers_differ_by_type(value: int, kind: Callable[[Any], Any]) -> None:
    """Rule: a number equals another exactly when both are the same dtype (bool, int64,
    float64, complex128; numpy scalars by their dtype: numpy.int64 is an int, numpy.float64
    a float) and value: True, 1, 1.0 and 1+0j all differ; -0.0 == 0.0."""
    dtype_of: dict[Any, str] = {bool: "bool", int: "int64", float: "float64"}
    dtype_of |= {complex: "complex128", np.int64: "int64", np.float64: "float64"}
    x = kind(value if kind is not bool else value % 2)
    for other in (bool, int, float, complex, np.int64, np.float64):
        y = other(value if other is not bool else value % 2)
        same = dtype_of[kind] == dtype_of[other] and x == y
        assert data.equal(leaves(x), leaves(y), False) == same


@given(structures(plain))
def test_a_value_equals_itself_and_its_reordered_copy(a: Any) -> None:
    """Rule: a value is equal to itself, and to its copy with every dict's keys reversed."""

    def reorder(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: reorder(v[k]) for k in reversed(list(v))}
        if isinstance(v, (list, tuple)):
            return type(v)(reorder(x) for x in v)
        if isinstance(v, Step):
            return Step(reorder(v.loss), reorder(v.step))
        return v

    assert data.digest(leaves(a), True)[0] == data.digest(leaves(reorder(a)), True)[0]


other_objects = st.sampled_from(
    [
        lambda: (i for i in range(2)),
        lambda: iter([1, 2]),
        lambda: {1, 2},
        lambda: frozenset(),
        lambda: object(),
        lambda: range(3),
        lambda: np.array(["a", "b"]),
        lambda: np.array([object()], dtype=object),
        lambda: Ellipsis,
        lambda: slice(1, 2),
    ]
)


@given(structures(plain), other_objects, st.integers(0, 5))
def test_anything_else_is_refused_naming_its_path_and_type(
    value: Any, make: Callable[[], Any], where: int
) -> None:
    """Rule: a value holding anything but tensors, numpy numbers, plain values and their
    containers is refused with a ParityUsageError naming the leaf's path and type; it is never
    compared (by repr or otherwise)."""
    bad = make()
    holder = [value, {"k": bad}] if where % 2 else (bad, value)
    path = "x[1]['k']" if where % 2 else "x[0]"
    with pytest.raises(ParityUsageError) as caught:
        leaves(holder)
    text = str(caught.value)
    assert text.startswith(path) and ("numpy" in text or type(bad).__name__ in text)


@given(
    tensors(torch.float64) | tensors(torch.int32) | tensors(torch.uint16) | tensors(torch.complex64)
)
def test_numpy_values_compare_as_their_tensors(t: torch.Tensor) -> None:
    """Rule: a numpy array (and scalar) is compared as the tensor of its dtype, shape and
    bytes: equal to that tensor, its digest the tensor's."""
    arr = t.numpy()
    assert data.equal(leaves(arr), leaves(t), True)
    assert data.digest(leaves(arr), True)[0] == data.digest(leaves(t), True)[0]
    if t.numel():
        scalar = arr.reshape(-1)[0]
        assert data.equal(leaves(scalar), leaves(t.reshape(-1)[0]), True)


@given(st.integers(0, 2**16))
def test_a_module_compares_by_its_state_dict(seed: int) -> None:
    """Rule: an nn.Module is compared by its state_dict(): equal to a module of the same
    weights, unequal to one of other weights, and equal to its own state_dict."""
    torch.manual_seed(seed)
    a = torch.nn.Linear(3, 2)
    b = torch.nn.Linear(3, 2)
    b.load_state_dict(a.state_dict())
    assert data.equal(leaves(a), leaves(b), False)
    assert data.equal(leaves(a), leaves(dict(a.state_dict())), False)
    with torch.no_grad():
        b.weight[0, 0] += 1
    assert not data.equal(leaves(a), leaves(b), False)
