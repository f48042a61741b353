"""Unit: what ``in_child`` refuses at decoration (a test whose call is not its run), how a
spawned child finds the function below outer decorators (api/childcall.py), which warning
filters it takes, and the timeout under pytest-timeout's signal timer (api/children.py)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import signal
import types
import unittest
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pytest_distrank import in_child
from pytest_distrank.api.childcall import filters_in, filters_out, find_target, subtest_recorder
from pytest_distrank.api.childmain import WRAPPED
from pytest_distrank.api.children import _within_timer


def test_an_async_test_stays_async_so_pytest_refuses_it() -> None:
    async def test_a() -> None:
        raise AssertionError("never awaited")

    wrapped = in_child(test_a)
    assert inspect.iscoroutinefunction(wrapped)
    with pytest.raises(pytest.fail.Exception, match=r"in_child on .*test_a: an async def test"):
        asyncio.run(wrapped())


def test_a_generator_stays_a_generator_so_pytest_refuses_it() -> None:
    def test_g() -> Iterator[None]:
        yield

    wrapped = in_child(test_g)
    assert inspect.isgeneratorfunction(wrapped)
    with pytest.raises(pytest.fail.Exception, match="a generator is not a test"):
        next(wrapped())


def test_the_subtests_fixture_is_refused_saying_why() -> None:
    def test_s(subtests: object) -> None:
        pass

    with pytest.raises(pytest.fail.Exception, match="the subtests fixture reports through"):
        in_child(test_s)(subtests=None)


def _module(**attrs: Any) -> types.ModuleType:
    module = types.ModuleType("m")
    module.__dict__.update(attrs)
    return module


def test_the_function_is_found_below_outer_decorators_with_or_without_wraps() -> None:
    def test_x() -> None:
        pass

    test_x.__qualname__ = "test_x"  # a module's function
    wrapper = in_child(start="spawn")(test_x)

    def plain(f: Callable[..., Any]) -> Callable[..., Any]:
        def inner(*args: Any) -> Any:
            return f(*args)

        return inner

    def keeping(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def inner(*args: Any) -> Any:
            return f(*args)

        return inner

    for outer in (wrapper, plain(wrapper), keeping(wrapper), plain(plain(wrapper))):
        assert find_target(_module(test_x=outer), "test_x", WRAPPED) is test_x
    assert find_target(_module(test_x=test_x), "test_x", WRAPPED) is test_x  # in_child(f) called


def test_a_decorator_that_hides_the_function_is_refused_naming_it() -> None:
    def hiding(*args: Any) -> None:
        pass

    with pytest.raises(pytest.fail.Exception) as raised:
        find_target(_module(test_x=hiding), "test_x", WRAPPED)
    assert str(raised.value.msg).startswith(
        "in_child(start='spawn'): m.test_x is "
        "test_a_decorator_that_hides_the_function_is_refused_naming_it.<locals>.hiding, a "
        "decorator over in_child that does not keep it reachable"
    )


def test_warning_filters_travel_by_name_and_unimported_categories_are_left_out() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        sent = filters_out()
        sent.append(("error", None, "not_imported_module:SomeWarning", None, 0))
        warnings.resetwarnings()
        filters_in(sent)
        assert warnings.filters[0][:3] == ("error", None, UserWarning)
        assert all(f[2] is not None for f in warnings.filters)
        assert len(warnings.filters) == len(sent) - 1
        with pytest.raises(UserWarning):
            warnings.warn("an error now", UserWarning, stacklevel=1)


def test_a_failed_subtest_is_recorded_not_reported_elsewhere() -> None:
    class Case(unittest.TestCase):  # in the function: pytest would collect it
        def test_sub(self) -> None:
            with self.subTest(i=1):
                self.assertEqual(1, 2)
            with self.subTest(i=2):
                pass

    case: Any = Case("test_sub")
    seen: list[str] = []

    class Result(unittest.TestResult):
        def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
            seen.append(str(subtest))

    original = case._callTestMethod
    recorders: list[Any] = []

    def call(method: Callable[[], None]) -> None:
        recorders.append(subtest_recorder(case))
        original(method)

    case._callTestMethod = call  # unittest's private hook: the recorder set as run() would
    case.run(Result())
    assert seen == []
    assert [name for name, _ in recorders[0].failures] == [f"{case} (i=1): AssertionError: 1 != 2"]
    assert subtest_recorder(object()) is None


def test_the_childs_timeout_ends_before_pytest_timeouts_signal_timer() -> None:
    """The timer counts the test's setup: the child gets what is left less 10% and 1 s."""
    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    try:
        signal.setitimer(signal.ITIMER_REAL, 20.0)
        assert _within_timer(None) == pytest.approx(17.0, abs=0.2)
        assert _within_timer(100.0) == pytest.approx(17.0, abs=0.2)
        assert _within_timer(5.0) == 5.0
        signal.setitimer(signal.ITIMER_REAL, 0)
        assert _within_timer(100.0) == 100.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
