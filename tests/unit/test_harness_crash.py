"""Unit: where a harness test's failure is shown (pool/worker/suiterank.py's _crash_site)."""

from __future__ import annotations

import functools
from typing import Any

from pytest_distrank.pool.worker.suiterank import _crash_site


def _method() -> None:  # stands for the test method; its file is this one
    pass


def _traceback(*frames: tuple[str, int]) -> str:
    lines = ["Traceback (most recent call last):"]
    for path, line in frames:
        lines += [f'  File "{path}", line {line}, in somewhere', "    code()"]
    return "\n".join([*lines, "AssertionError: Scalars are not equal!"])


def test_the_last_frame_in_the_tests_own_file_with_the_childs_exception_line() -> None:
    error = _traceback(
        ("/x/torch/testing/_internal/common_distributed.py", 700),
        (__file__, 12),
        ("/x/helpers.py", 3),
        (__file__, 40),
        ("/x/unittest/case.py", 900),
    )
    assert _crash_site(error, _method) == (__file__, 40, "AssertionError: Scalars are not equal!")


def test_a_decorated_method_is_found_through_its_wrappers() -> None:
    @functools.wraps(_method)
    def wrapper(*args: Any) -> None:
        pass

    assert _crash_site(_traceback((__file__, 7)), wrapper) is not None


def test_no_frame_in_the_tests_file_leaves_the_report_alone() -> None:
    assert _crash_site(_traceback(("/x/other.py", 5)), _method) is None
    assert _crash_site("", _method) is None
    assert _crash_site(_traceback((__file__, 5)), object()) is None
