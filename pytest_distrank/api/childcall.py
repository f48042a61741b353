"""What ``in_child``'s child does around the test's function: find it and take the test's
warning filters (spawn), run the finalizers the function added, record the failures of its
unittest subtests, and turn its threads' uncaught exceptions into pytest's warning.

Runs in the child process of :mod:`api.childmain` (:func:`find_target` also in the parent, to
refuse before spawning). Each reaches into a private structure, named where it is used: pytest's
setup state (``session._setupstate.stack``: a node's finalizers) and unittest's ``_Outcome``
(``TestCase._outcome.result``: where ``subTest`` reports). If either moves, finalizers added in
the child are not run, or subtests fail unseen, as before this module: nothing else breaks.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest


def find_target(module: ModuleType, qualname: str, marker: str) -> Callable[..., Any]:
    """The function an ``in_child`` wrapper wraps, found from the module's ``qualname``: through
    outer decorators (their ``__wrapped__`` and closures), never the outer decorator itself (a
    spawned child that called it would start ``in_child`` again, and again)."""
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part)
    todo, seen = [(target, 0)], set()
    while todo:
        obj, depth = todo.pop(0)
        if id(obj) in seen or depth > 4:
            continue
        seen.add(id(obj))
        if marker in getattr(obj, "__dict__", {}):
            return getattr(obj, marker)  # type: ignore[no-any-return]
        inner = [getattr(obj, "__wrapped__", None), getattr(obj, "__func__", None)]
        inner += [_cell(c) for c in getattr(obj, "__closure__", None) or ()]
        todo += [(o, depth + 1) for o in inner if callable(o)]
    if getattr(target, "__qualname__", None) == qualname:  # in_child(f) called, not a decorator
        return target  # type: ignore[no-any-return]
    pytest.fail(
        f"in_child(start='spawn'): {module.__name__}.{qualname} is "
        f"{getattr(target, '__qualname__', repr(target))}, a decorator over in_child that does not "
        "keep it reachable, so a spawned child cannot find the test's function. Use "
        "functools.wraps in that decorator, put @in_child outermost, or use start='fork'.",
        pytrace=False,
    )


def filters_out() -> list[tuple[str, Any, str, Any, int]]:
    """The warning filters in force (the test's marks', ``-W``'s), each category as
    ``module:qualname``: a spawned child must not import every module a filter names (torch's
    would cost it seconds)."""
    return [
        (action, message, f"{category.__module__}:{category.__qualname__}", module, lineno)
        for action, message, category, module, lineno in warnings.filters
        if isinstance(category, type)
    ]


def filters_in(filters: list[tuple[str, Any, str, Any, int]]) -> None:
    """The parent's warning filters, in a spawned child (its test module imported): those whose
    category's module is not imported here are left out (no warning of theirs was raised yet)."""
    if not filters:
        return
    kept = []
    for action, message, category, module, lineno in filters:
        owner, _, qualname = category.partition(":")
        cls: Any = sys.modules.get(owner)
        for part in qualname.split("."):
            cls = getattr(cls, part, None)
        if isinstance(cls, type) and issubclass(cls, Warning):
            kept.append((action, message, cls, module, lineno))
    warnings.filters[:] = kept  # type: ignore[index]


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


@contextlib.contextmanager
def run_finalizers(request: Any) -> Iterator[None]:
    """Run, after the body, the finalizers it added to pytest's nodes (``request.addfinalizer``,
    the teardown of a fixture got with ``request.getfixturevalue``), last added first: the child
    ends with ``os._exit``, so pytest's teardown never runs there. A finalizer's error fails the
    test unless the body already failed."""
    stack = _setup_stack(request)
    before = {node: len(entry[0]) for node, entry in stack.items()}
    try:
        yield
    finally:
        errors: list[BaseException] = []
        for node, entry in reversed(list(stack.items())):
            added = entry[0][before.get(node, 0) :]
            del entry[0][before.get(node, 0) :]
            for fin in reversed(added):
                try:
                    fin()
                except BaseException as exc:
                    errors.append(exc)
        if errors and sys.exc_info()[1] is None:
            raise errors[0]


def _setup_stack(request: Any) -> dict[Any, Any]:
    """pytest's ``SetupState.stack`` (node -> (finalizers, exception)); {} where it moved."""
    stack = getattr(getattr(getattr(request, "session", None), "_setupstate", None), "stack", None)
    if not isinstance(stack, dict):
        return {}
    return {n: e for n, e in stack.items() if isinstance(e, tuple) and isinstance(e[0], list)}


class SubtestRecorder:
    """Stands for a TestCase's result: keeps the failed ``self.subTest`` blocks (their report
    would go to the child's own pytest, which reports nothing), passes the rest on."""

    failfast = False

    def __init__(self, result: Any) -> None:
        self._result = result
        #: ``(the subtest's description, its traceback)`` per failed subtest.
        self.failures: list[tuple[str, str]] = []

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        if err is not None:
            excinfo = pytest.ExceptionInfo.from_exc_info(err)
            excinfo.traceback = excinfo.traceback.filter(_not_unittest)
            text = str(excinfo.getrepr(style="short"))
            self.failures.append((f"{subtest}: {excinfo.exconly().splitlines()[0]}", text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)


def _not_unittest(entry: Any) -> bool:
    """A traceback entry outside unittest's own frames (pytest hides them alike)."""
    return not entry.frame.f_globals.get("__unittest")


def subtest_recorder(case: Any) -> SubtestRecorder | None:
    """For a unittest TestCase's method: its result replaced by a recorder; else None."""
    import unittest

    outcome = getattr(case, "_outcome", None) if isinstance(case, unittest.TestCase) else None
    if outcome is None or not hasattr(outcome, "result"):
        return None
    recorder = SubtestRecorder(outcome.result)
    outcome.result = recorder
    outcome.result_supports_subtests = True
    return recorder


@contextlib.contextmanager
def thread_errors_warned() -> Iterator[None]:
    """A thread's uncaught exception, raised as pytest's ``PytestUnhandledThreadExceptionWarning``
    (which the child's warnings carry to the parent): pytest's own hook reports it at the
    test's teardown, which the child never runs."""
    import threading
    import traceback

    def hook(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else "<unknown>"
        error = (args.exc_type, args.exc_value, args.exc_traceback)
        text = "".join(traceback.format_exception(*error))
        warnings.warn(
            pytest.PytestUnhandledThreadExceptionWarning(f"Exception in thread {name}\n\n{text}"),
            stacklevel=1,
        )

    previous, threading.excepthook = threading.excepthook, hook
    try:
        yield
    finally:
        threading.excepthook = previous
