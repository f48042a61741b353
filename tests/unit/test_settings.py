"""Unit tests of the option value parsers (parsing.py)."""

from __future__ import annotations

import pytest

from pytest_distrank.envvars import TEST_WAITS_ENV, seam_wait
from pytest_distrank.parsing import (
    parse_backend,
    parse_bool,
    parse_order,
    parse_positive_int,
    parse_seconds,
    parse_seed,
)


@pytest.mark.parametrize("text", ["gloo", "nccl", "cpu:gloo,cuda:nccl", " mpi "])
def test_backends_accepted(text: str) -> None:
    assert parse_backend(text) == text.strip()


@pytest.mark.parametrize("text", ["", "glooo", "cpu:gloo,cuda:foo"])
def test_backends_refused(text: str) -> None:
    with pytest.raises(ValueError, match="expected one of gloo, nccl"):
        parse_backend(text)


def test_scalar_parsers() -> None:
    assert parse_positive_int(" 8 ") == 8
    with pytest.raises(ValueError):
        parse_positive_int("0")
    assert parse_seconds("0") == 0 and parse_seconds("2.5") == 2.5
    with pytest.raises(ValueError):
        parse_seconds("-1")
    with pytest.raises(ValueError):
        parse_seconds("nan")
    assert parse_bool("yes") and not parse_bool("0")
    with pytest.raises(ValueError):
        parse_bool("maybe")


def test_the_waits_seam_sets_the_fixed_waits_and_refuses_nonsense(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(TEST_WAITS_ENV, raising=False)
    assert seam_wait(5.0) == 5.0
    monkeypatch.setenv(TEST_WAITS_ENV, "0.5")
    assert seam_wait(5.0) == 0.5
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv(TEST_WAITS_ENV, bad)
        with pytest.raises(ValueError, match=f"DISTRANK_TEST_WAITS='{bad}'"):
            seam_wait(5.0)


def test_seeds() -> None:
    assert parse_seed(" 1234 ") == 1234
    assert parse_seed("RANDOM") == "random"
    assert parse_seed("off") is None
    for bad in ("-1", "1.5", "lots", str(2**32)):
        with pytest.raises(ValueError, match="expected a seed"):
            parse_seed(bad)


def test_orders() -> None:
    assert parse_order("reverse") == ("reverse", None)
    assert parse_order("random") == ("random", None)
    assert parse_order("random:7") == ("random", 7)
    for bad in ("sideways", "reverse:3", "random:x", "random:-2"):
        with pytest.raises(ValueError, match="expected collected, reverse, random"):
            parse_order(bad)
