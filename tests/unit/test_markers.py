"""Unit tests of marker parsing (markers.py)."""

from __future__ import annotations

import pytest

from pytest_distrank.markers import MarkerError, world_sizes


def mark(*args: object, **kwargs: object) -> pytest.Mark:
    return pytest.mark.world_size(*args, **kwargs).mark


def test_sizes_and_default() -> None:
    assert world_sizes(mark(4), default=2) == (4,)
    assert world_sizes(mark(2, 4), default=2) == (2, 4)
    assert world_sizes(mark(), default=3) == (3,)


@pytest.mark.parametrize("bad", [0, -1, "four", True, 2.0, None])
def test_bad_sizes_name_the_marker_and_value(bad: object) -> None:
    with pytest.raises(MarkerError, match=r"@pytest\.mark\.world_size\(.*\): world size .* is not"):
        world_sizes(mark(bad), default=2)


def test_unknown_keyword() -> None:
    with pytest.raises(MarkerError, match="unknown keyword 'size'"):
        world_sizes(mark(2, size=3), default=2)
