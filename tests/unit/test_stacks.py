"""Unit tests of signal names and of where a rank is blocked, read from a stack dump (stacks.py)."""

from __future__ import annotations

from pytest_distrank.outcome.stacks import (
    collective_entered,
    main_thread_frames,
    signal_name,
    where_blocked,
)


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


def test_collective_entered_names_the_call_and_the_test_line() -> None:
    text = collective_entered(DUMP, "/proj/test_x.py")
    assert text.startswith("barrier, called from test_x at ")  # the path is shortened
    assert text.endswith("/proj/test_x.py:12")


def test_collective_entered_is_empty_outside_torch_distributed() -> None:
    outside = DUMP.replace("/site-packages/torch/distributed/distributed_c10d.py", "/proj/x.py")
    outside = outside.replace("/site-packages/torch/distributed/c10d_logger.py", "/proj/y.py")
    assert collective_entered(outside, "/proj/test_x.py") == ""
