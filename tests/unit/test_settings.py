"""Unit tests of the option value parsers (settings.py)."""

from __future__ import annotations

import pytest

from pytest_distrank.settings import parse_backend, parse_bool, parse_positive_int, parse_seconds


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
