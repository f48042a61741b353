"""Unit tests of marker parsing (markers.py) and settings helpers (settings.py, pool/pool.py)."""

from __future__ import annotations

import pytest

from pytest_distrank.markers import MarkerError, world_sizes
from pytest_distrank.settings import parse_backend, parse_bool, parse_positive_int, parse_seconds
from pytest_distrank.stacks import main_thread_frames, signal_name, where_blocked


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


def test_signal_names() -> None:
    assert signal_name(-11) == "SIGSEGV(-11)"
    assert signal_name(-9) == "SIGKILL(-9)"
    assert signal_name(3) == "exit code 3"


DUMP = """\
Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f0000000002 (most recent call first):
  File "/site-packages/torch/distributed/distributed_c10d.py", line 5356 in barrier
  File "/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/proj/test_x.py", line 12 in test_x
  File "/site-packages/_pytest/python.py", line 187 in pytest_pyfunc_call
  File "/pkg/pytest_distrank/pool/worker.py", line 161 in rank_main
"""


def test_main_thread_is_the_one_running_rank_main() -> None:
    frames = main_thread_frames(DUMP)
    assert frames[0] == ("/site-packages/torch/distributed/distributed_c10d.py", 5356, "barrier")
    assert frames[-1][2] == "rank_main"


def test_where_blocked_names_the_innermost_and_the_test_frame() -> None:
    text = where_blocked(DUMP, "/proj/test_x.py")
    assert text.startswith(
        "blocked in barrier at torch/distributed/distributed_c10d.py:5356, called from test_x at "
    )
    assert text.endswith("test_x.py:12")
    assert where_blocked("", "/proj/test_x.py").startswith("no stack")
