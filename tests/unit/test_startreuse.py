"""Unit and property tests of a test's start taken from the previous test's end
(rank/startreuse.py, as rank/leftovers.py uses it): when no code outside the plugin can run
between two tests, and that a change made between them by such code is never credited to the
next test."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.rank import startreuse
from pytest_distrank.rank.leftovers import LeftoverCheck
from pytest_distrank.rank.snapshot import READERS, Snapshot
from pytest_distrank.rank.startreuse import FRESH, quiet_between

ITEM = cast(pytest.Item, types.SimpleNamespace(nodeid="t.py::test"))
thread_names = st.one_of(
    st.sampled_from(["MainThread", "distrank-parent-death", "distrank-flight-recorder"]),
    st.text("abc-", max_size=8),
)
handlers = st.sampled_from(
    [signal.SIG_DFL, signal.SIG_IGN, None, signal.default_int_handler, print, lambda *a: None]
)


@given(
    st.lists(thread_names, max_size=4),
    st.lists(handlers, max_size=4),
    st.booleans(),
    st.integers(0, 2),
)
def test_quiet_only_with_own_threads_no_python_handler_no_tracer_no_gc_callback(
    names: list[str], found: list[Any], tracing: bool, callbacks: int
) -> None:
    threads = [types.SimpleNamespace(name=name) for name in names]
    own = all(n == "MainThread" or n.startswith("distrank-") for n in names)
    python_handlers = any(callable(h) and h is not signal.default_int_handler for h in found)
    expected = own and not python_handlers and not tracing and callbacks == 0
    assert quiet_between(threads, found, tracing, callbacks) == expected


@contextlib.contextmanager
def _threads_only() -> Iterator[None]:
    """Quiet as the marks read it in a rank, but for the threads only: the outer pytest of this
    process has a Python signal handler (pytest-timeout's) and perhaps a tracer (coverage)."""
    original = startreuse.quiet_now
    before = {t.ident for t in threading.enumerate()}  # the outer session's (its zygote's)

    def quiet(snapshot: Snapshot) -> bool:
        threads = [t for ident, t in snapshot.threads.items() if ident not in before]
        return quiet_between(threads, (), False, 0)

    startreuse.quiet_now = quiet
    try:
        yield
    finally:
        startreuse.quiet_now = original


def _drive(wrapper: Any) -> None:
    next(wrapper)
    with contextlib.suppress(StopIteration):
        wrapper.send(None)


def _test(
    check: LeftoverCheck, reuse: bool, during: Callable[[], None] = lambda: None
) -> tuple[str, ...]:
    """One test's start, body and teardown on ``check``; what it left, in words."""
    check.start(ITEM, harness=False, reuse=reuse)
    during()
    _drive(check.pytest_runtest_teardown(ITEM))
    return check.finish()[0]


@contextlib.contextmanager
def _running_thread() -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="a-fixtures-thread", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


#: Changes code outside the plugin could make between two tests, in categories a reused start
#: does not read again; each returns what undoes it.
def _logger_level() -> Callable[[], None]:
    logger = logging.getLogger("startreuse-test")
    old = logger.level
    logger.setLevel(logging.ERROR)
    return lambda: logger.setLevel(old)


def _umask() -> Callable[[], None]:
    old = os.umask(0o077)

    def undo() -> None:
        os.umask(old)

    return undo


CHANGES = {"logger level": _logger_level, "umask": _umask}


@given(
    st.sampled_from(sorted(CHANGES)),
    st.sampled_from(["nothing", "not allowed", "fixture torn down", "thread"]),
)
def test_a_change_between_tests_is_never_credited_to_the_next_test_when_a_mark_says_code_ran(
    change: str, mark: str
) -> None:
    """With a mark broken (the caller says unknown code ran, a fixture was torn down between the
    tests, a thread of a test's or fixture's runs), the next start is read in full: a change
    made between the tests is the start's, not the next test's leftover. With no mark broken
    and no change, the start is the last end."""
    check = LeftoverCheck(0, "restore", (), ())
    with _threads_only():
        assert _test(check, reuse=False) == ()
        assert check.reuse.kept is not None  # the end is kept
        if mark == "nothing":
            assert _test(check, reuse=True) == ()
            assert check.reuse.reused == 1
            return
        undo = CHANGES[change]()
        try:
            if mark == "fixture torn down":  # a wider fixture's finalizer ran between the tests
                check.pytest_fixture_post_finalizer(cast(Any, types.SimpleNamespace()))
            if mark == "thread":
                with _running_thread():
                    assert _test(check, reuse=True) == ()
            else:
                assert _test(check, reuse=mark != "not allowed") == ()
        finally:
            undo()
        assert check.reuse.reused == 0


def test_a_reused_start_reads_what_a_full_snapshot_reads() -> None:
    check = LeftoverCheck(0, "restore", (), ())
    with _threads_only():
        assert _test(check, reuse=False) == ()
        check.start(ITEM, harness=False, reuse=True)
    assert check.reuse.reused == 1
    assert check.expected is not None
    fresh = Snapshot.take()
    assert check.expected.categories().keys() == fresh.categories().keys() == READERS.keys()
    for name in READERS:
        assert check.expected.categories()[name] == fresh.categories()[name], name
    assert set(FRESH) < set(READERS)


def test_a_test_that_left_something_is_not_reused() -> None:
    check = LeftoverCheck(0, "restore", (), ())
    undo: list[Callable[[], None]] = []
    try:
        words = _test(check, reuse=False, during=lambda: undo.append(_umask()))
    finally:
        undo[0]()
    assert words == ("umask 0o077 (not restored)",)
    check.start(ITEM, harness=False, reuse=True)
    assert check.reuse.reused == 0
