"""Unit tests of the checks across ranks' pure logic: the comparison rules, the checksum, the
guards, the per-rank table and its words (api/paritydata.py, api/paritycalls.py). No ranks."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pytest_distrank.api import paritydata as data
from pytest_distrank.api import parityleaves
from pytest_distrank.api.paritycalls import (
    LeafTable,
    agreement,
    agreement_words,
    first_difference,
    majority,
    message,
    ranks_words,
    table,
)
from pytest_distrank.api.paritydata import Row


def leaves(value: object) -> list[tuple[str, object]]:
    return parityleaves.leaves(value, "x")


def test_values_flatten_by_key_and_position_and_numbers_become_tensors() -> None:
    got = leaves({"w": [torch.ones(2), 3], "s": "a", "f": 1.5})
    assert [p for p, _ in got] == [" (a mapping)", "['w'][0]", "['w'][1]", "['s']", "['f']"]
    assert got[0][1] == parityleaves.MAPPING  # a list with the same paths differs from it
    assert isinstance(got[2][1], torch.Tensor) and isinstance(got[4][1], torch.Tensor)
    assert got[2][1].dtype == torch.int64 and got[4][1].dtype == torch.float64
    assert got[3][1] == parityleaves.Plain("str", "'a'")


@pytest.mark.parametrize(
    ("a", "b", "equal_nan", "same"),
    [
        (torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]), False, True),  # torch.equal
        (torch.tensor([1.0, 2.0]), torch.tensor([2.0, 1.0]), False, False),  # a swap
        (torch.tensor([float("nan")]), torch.tensor([float("nan")]), True, True),
        (torch.tensor([1, 2]), torch.tensor([1.0, 2.0]), False, False),  # dtype
        (torch.zeros(2, 3), torch.zeros(3, 2), False, False),  # shape
        (torch.tensor(True), torch.tensor(True), False, True),
        (torch.ones(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.bfloat16), False, True),
    ],
)
def test_the_checksum_follows_torch_equal(
    a: torch.Tensor, b: torch.Tensor, equal_nan: bool, same: bool
) -> None:
    key_a, key_b = (data.digest(leaves(x), equal_nan)[0] for x in (a, b))
    assert (key_a == key_b) is same


def test_nan_is_flagged_unless_equal_nan() -> None:
    x = leaves(torch.tensor([1.0, float("nan")]))
    assert data.digest(x, equal_nan=False)[1] is True
    assert data.digest(x, equal_nan=True)[1] is False


def test_one_changed_element_of_a_large_tensor_changes_the_checksum() -> None:
    a = torch.randn(1 << 18)
    b = a.clone()
    b[123_456] = torch.nextafter(b[123_456], torch.tensor(float("inf")))
    assert data.digest(leaves(a), False)[0] != data.digest(leaves(b), False)[0]


def test_pack_and_unpack_round_trip_any_dtype() -> None:
    tensors = [
        torch.arange(6.0).reshape(2, 3),
        torch.tensor(True),
        torch.arange(3, dtype=torch.int16),
    ]
    back = data.unpack(data.pack(tensors), tensors)
    assert all(torch.equal(x, y) and x.dtype == y.dtype for x, y in zip(tensors, back, strict=True))


def test_a_row_names_the_first_element_out_of_tolerance() -> None:
    mine = torch.tensor([[1.0, 2.0], [3.0, 4.5]])
    row = data.compare(2, mine, torch.tensor([[1.0, 2.0], [3.0, 4.0]]), exact=False)
    assert (row.index, row.value, row.ref_value, row.mismatched) == ("(1, 1)", "4.5", "4", "1/4")
    assert row.max_abs == 0.5 and row.max_rel == pytest.approx(0.125) and row.differs
    assert data.compare(0, mine, mine.clone(), exact=True).note == "agrees"
    assert data.compare(0, mine, mine[0], exact=True).note == "shape differs"
    a, b = parityleaves.Plain("str", "'a'"), parityleaves.Plain("str", "'b'")
    assert data.compare(0, a, b, exact=True).note == "differs"


def test_default_tolerances_are_torch_testings_and_exact_for_integers() -> None:
    assert data.tolerances(torch.float32, None, None) == (1.3e-6, 1e-5)
    assert data.tolerances(torch.int64, None, None) == (0.0, 0.0)
    assert data.tolerances(torch.float32, 0.1, None) == (0.1, 1e-5)


@pytest.mark.parametrize(
    ("a", "b", "word"),
    [
        (torch.zeros(4), torch.zeros(4), "zeros"),
        (torch.full((4,), 0.5), torch.full((4,), 0.5), "constant"),
        (torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0]), "nan"),
        (torch.tensor(3.0), torch.tensor(3.0), ""),  # one element is no constant
        (torch.arange(4.0), torch.arange(4.0), ""),
    ],
)
def test_guards(a: torch.Tensor, b: torch.Tensor, word: str) -> None:
    found = data.degenerate(a, b, data.GUARDS)
    assert (f"(guard '{word}')" in found) if word else found == ""


def test_an_unknown_guard_is_named() -> None:
    with pytest.raises(data.ParityUsageError, match=r"unknown guard 'zero'.*'zeros'"):
        data.check_guards(("zero",))


def test_guards_none_and_a_tolerance_alone_are_refused() -> None:
    """attack-c 6: guards=None raised a TypeError; rtol without atol paired a chosen tolerance
    with a default one (torch.testing.assert_close refuses it)."""
    with pytest.raises(data.ParityUsageError, match=r"guards=None: pass guards=\(\) for no"):
        data.check_guards(None)  # type: ignore[arg-type]
    with pytest.raises(data.ParityUsageError, match="rtol was given without atol"):
        data.check_tolerances(1e-3, None)
    with pytest.raises(data.ParityUsageError, match="atol was given without rtol"):
        data.check_tolerances(None, 1e-3)
    data.check_tolerances(None, None)
    data.check_tolerances(0.0, 0.0)
    assert data.guard_key("nan") == data.guard_key(["nan"]) == ("nan",)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("kind", ["quantized", "nested", "masked", "lazy"])
def test_tensors_whose_bytes_are_not_their_values_are_refused(kind: str) -> None:
    """attack-c 4, 6: a quantized tensor crashed pack (SIGSEGV) or the digest; nested and
    masked tensors and a Lazy module's parameters raised torch errors."""
    from torch.masked import masked_tensor

    made = {
        "quantized": lambda: torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8),
        "nested": lambda: torch.nested.nested_tensor([torch.ones(2)], layout=torch.jagged),
        "masked": lambda: masked_tensor(torch.ones(2), torch.tensor([True, False])),
        "lazy": lambda: torch.nn.LazyLinear(3),
    }
    words = {
        "quantized": r"x is a quantized tensor: .*int_repr",
        "nested": r"x is a nested tensor: .*unbind",
        "masked": r"x is a MaskedTensor: its mask would not be compared",
        "lazy": r"x\['weight'\] is an uninitialized parameter",
    }
    with pytest.raises(data.ParityUsageError, match=words[kind]):
        leaves(made[kind]())


def test_the_checks_errors_are_exported() -> None:
    """attack-c 6: the documented errors could not be caught by name without a private import."""
    import pytest_distrank
    from pytest_distrank.rank import ownedgroups

    assert pytest_distrank.ParityUsageError is parityleaves.ParityUsageError
    assert pytest_distrank.TwinMeetingError is ownedgroups.TwinMeetingError
    assert {"ParityUsageError", "TwinMeetingError"} <= set(pytest_distrank.__all__)


def test_an_enum_member_is_compared_by_its_value_too() -> None:
    """attack-c r6: rank 0's Mode.A = 1 and rank 1's Mode.A = 2 (another definition of the same
    class) compared by name only, and passed."""
    import enum

    first: Any = enum.Enum("Mode", {"A": 1})  # type: ignore[misc]
    second: Any = enum.Enum("Mode", {"A": 2})  # type: ignore[misc]
    second.__module__ = first.__module__
    assert not data.equal(leaves(first.A), leaves(second.A), False)
    leaf = leaves(first.A)[0][1]
    assert isinstance(leaf, parityleaves.Plain) and leaf.text.endswith(".Mode.A = 1")


def test_agreement_and_majority() -> None:
    groups = agreement(["a", "a", "b", "a"])
    assert groups == [[0, 1, 3], [2]] and majority(groups) == [0, 1, 3]
    assert majority(agreement(["a", "b", "b", "a"])) == [0, 3]  # a tie: the lowest rank's
    assert agreement_words([[0, 1, 3], [2]]) == "ranks 0, 1, 3 agree; rank 2 alone"
    assert agreement_words([[0], [1]]) == "no two ranks agree"
    assert ranks_words([3, 0, 1, 2]) == "ranks 0-3" and ranks_words([5]) == "rank 5"


def test_the_table_and_message() -> None:
    rows = [
        Row(0, "(2,) float32", note="reference"),
        Row(1, "(2,) float32", 0.5, 0.25, "1/2", "(1,)", "2.5", "2", "differs"),
    ]
    text = table(rows)
    assert text.splitlines()[0].split() == [
        "rank", "shape,", "dtype", "max", "abs", "err", "max", "rel", "err", "differing",
        "first", "at", "value", "value", "on", "rank", "0",
    ]  # fmt: skip
    assert text.splitlines()[2].split()[-1] == "differs"
    leaf = LeafTable("x['w']", rows)
    assert first_difference([leaf]) == "x['w'] differs on rank 1 at (1,): 2.5 there, 2 on rank 0"
    msg = message("assert_equal_across_ranks", "t.py::test_a", "x differs.", [leaf], "Do this.")
    assert msg.startswith("assert_equal_across_ranks failed in t.py::test_a: x differs.\n")
    assert msg.endswith("\nDo this.") and "x['w']:" in msg


def test_a_sharded_dtensor_is_refused_with_what_to_compare() -> None:
    class Shard:
        pass

    class FakeDTensor(torch.Tensor):  # type: ignore[misc]
        placements = (Shard(),)

    t = torch.ones(2).as_subclass(FakeDTensor)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parityleaves, "dtensor_type", lambda: FakeDTensor)
        with pytest.raises(data.ParityUsageError, match=r"x\.full_tensor\(\)"):
            parityleaves.normalize("", t, "x")


def test_keys_without_an_exact_repr_are_refused() -> None:
    """Keys name the leaves' paths: two tensor keys print alike (tensor(1.)) though they differ."""
    with pytest.raises(
        data.ParityUsageError, match=r"x has a key of type Tensor \(tensor\(1\.\)\)"
    ):
        leaves({torch.tensor(1.0): torch.ones(1)})
    paths = [p for p, _ in leaves({("a", 1): 1, None: 2, 1.5: 3})]
    assert paths == [" (a mapping)", "[('a', 1)]", "[None]", "[1.5]"]


def test_a_list_differs_from_a_mapping_with_the_same_paths() -> None:
    assert not data.equal(leaves([5]), leaves({0: 5}), False)
    assert data.equal(leaves([5]), leaves((5,)), False)


def test_a_masked_numpy_array_is_refused() -> None:
    """numpy.asarray drops the mask: compared as an array, two masks would agree."""
    import numpy as np

    with pytest.raises(data.ParityUsageError, match=r"x\['m'\] is a numpy masked array"):
        leaves({"m": np.ma.masked_array([1.0, 2.0], mask=[False, True])})
