"""``@pytest_distrank.in_child(start="fork", timeout=None, leftovers="warn")``: a test run in a
child process of its own, its outcome carried back into the test's report.

Runs in the process of the decorated test: the pytest process (or an xdist worker) for an
ordinary test, a rank for a distributed one (a rank's test that forks its own child). The
child (:mod:`api.childmain`) runs the test module's own function, with the test's fixture
values; :mod:`api.childproc` starts it, waits with a bound and ends its tree;
:func:`outcome.childverdict.judge` decides what came of it. What the test's report gets: the
child's failure as pytest prints a test's (asserts rewritten), its skip or xfail, its stdout and
stderr in the captured sections, its stack when it did not finish in time, and a failure naming
the signal or exit code of a child that ended without a result: a child runner that never ran
the function cannot pass.

A decorator rather than a fixture: a test's outcome is its function's, so the whole function
runs in the child (a skip there is the test's skip); it is vLLM's shape
(``@fork_new_process_for_each_test``), a one-line change for such suites; and it needs no
plugin loaded (``-p no:distrank`` too). The wrapper asks pytest for ``request`` (added to its
signature when the function does not take it) to know its test and deadline.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import os
import pickle
import shutil
import signal
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest

from .. import _compat
from ..outcome.childverdict import ChildEnd, ChildResult, judge, parse_result
from ..settings import Settings, Value, item_timeout
from .childcall import filters_out, find_target
from .childmain import RESULT, STDERR, STDOUT, WRAPPED, ChildSpec
from .childproc import Child

F = TypeVar("F", bound=Callable[..., Any])
STARTS = ("fork", "spawn")
LEFTOVERS = ("warn", "fail")
#: The deadline assumed where no test's is known (the function called outside a test).
DEFAULT_DEADLINE = 300.0
#: The most of a child's stdout and stderr copied into the test's output, each.
OUTPUT_LIMIT = 1 << 20


def in_child(
    fn: F | None = None,
    *,
    start: str = "fork",
    timeout: float | None = None,
    leftovers: str = "warn",
) -> Any:
    """Run the decorated test (or function) in a child process; its outcome is the test's.

    ``start``: ``"fork"`` (the test's process forked: fixtures' values as they are, closures
    fine) or ``"spawn"`` (a fresh interpreter imports the test's module: the function must be a
    module's or a class's, its arguments must pickle). ``timeout``: seconds before the child is
    stopped, its stack read and its tree killed; default the test's deadline less 10% and 1 s
    (so it ends before the test's own deadline does), ``0`` for none. ``leftovers``:
    processes the function left running are killed and named in a warning (``"warn"``) or fail
    a passing test (``"fail"``).
    """
    if start not in STARTS:
        raise ValueError(f"in_child(start={start!r}): start is one of {', '.join(STARTS)}.")
    if leftovers not in LEFTOVERS:
        raise ValueError(f"in_child(leftovers={leftovers!r}): one of {', '.join(LEFTOVERS)}.")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout < 0
    ):
        raise ValueError(f"in_child(timeout={timeout!r}): seconds >= 0, or None for the default.")

    def decorate(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"in_child decorates a function, not {type(fn).__name__} {fn!r}.")
        signature = inspect.signature(fn)
        takes_request = "request" in signature.parameters

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            request = kwargs.get("request") if takes_request else kwargs.pop("request", None)
            _run(fn, args, kwargs, request, start, timeout, leftovers)

        refused = _refused(fn)
        if refused is not None:
            wrapper = functools.wraps(fn)(refused)
        if not takes_request:
            wrapper.__signature__ = _with_request(signature)  # type: ignore[attr-defined]
        setattr(wrapper, WRAPPED, fn)
        return cast(F, wrapper)

    return decorate(fn) if fn is not None else decorate


def _refused(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """A wrapper that refuses ``fn``, or None: a function whose call is not its run (a
    coroutine's, a generator's) or that reports through its own process's pytest (the
    ``subtests`` fixture) would pass unseen in a child. The wrapper is of ``fn``'s kind, so
    pytest refuses it as it refuses such a test (its own words: an async def fails, a generator
    does not collect); where pytest would run it (an async plugin), it fails saying why."""
    name = getattr(fn, "__qualname__", repr(fn))
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        message = f"in_child on {name}: an async def test is not run in a child; make it a def."

        async def refuse_async(*args: Any, **kwargs: Any) -> None:
            pytest.fail(message, pytrace=False)

        return refuse_async
    if inspect.isgeneratorfunction(fn):
        message = f"in_child on {name}: a generator is not a test; make it a plain def."

        def refuse_generator(*args: Any, **kwargs: Any) -> Iterator[None]:
            pytest.fail(message, pytrace=False)
            yield

        return refuse_generator
    if "subtests" in inspect.signature(fn).parameters:
        message = (
            f"in_child on {name}: the subtests fixture reports through the child's own pytest, "
            "which reports nothing, so its failures would be lost; use "
            "@pytest.mark.parametrize, or leave in_child out."
        )

        def refuse_subtests(*args: Any, **kwargs: Any) -> None:
            pytest.fail(message, pytrace=False)

        return refuse_subtests
    return None


def _with_request(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` with a keyword-only ``request`` (before ``**kwargs``), for pytest to fill."""
    params = list(signature.parameters.values())
    at = next((i for i, p in enumerate(params) if p.kind is p.VAR_KEYWORD), len(params))
    params.insert(at, inspect.Parameter("request", inspect.Parameter.KEYWORD_ONLY))
    return signature.replace(parameters=params)


def _run(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    request: pytest.FixtureRequest | None,
    start: str,
    timeout: float | None,
    leftovers: str,
) -> None:
    """Start the child, wait for it, copy its output, and raise what came of it."""
    item = _compat.request_item(request) if request is not None else None
    name = item.name if item is not None else getattr(fn, "__qualname__", repr(fn))
    limit = default_timeout(item) if timeout is None else (timeout or None)
    limit = _within_timer(limit)
    config = item.config if item is not None else None
    folder = tempfile.mkdtemp(prefix="distrank-child-")
    spec = ChildSpec(
        folder=folder,
        start=start,
        parent=os.getpid(),
        redirect=config is None or config.getoption("capture", "fd") != "no",
        tbstyle=str(config.getoption("tbstyle", "long")) if config else "long",
        showlocals=bool(config.getoption("showlocals", False)) if config else False,
    )
    child: Child | None = None
    try:
        if start == "spawn":
            _for_spawn(spec, fn, args, kwargs, name)
        child = Child(spec, fn, args, kwargs, request)
        finished = child.wait(limit)
        stopped = 0 if finished else child.stopped_by()
        stack = "" if finished else child.dump_stack(stopped=bool(stopped))
        killed = child.end()
        end = ChildEnd(
            who=f"{name}'s child ({start}, pid {child.pid})",
            status=child.status,
            raw=_read(Path(folder, RESULT)),
            timed_out=not finished,
            timeout=limit,
            stack=stack,
            test_file=inspect.getsourcefile(fn) or "",
            killed=tuple(killed),
            stopped_by=stopped,
        )
        _copy_output(folder)
    finally:
        if child is not None and not child.reaped:  # an interrupt, pytest-timeout's signal
            child.end()
        shutil.rmtree(folder, ignore_errors=True)
    verdict = judge(end, leftovers)
    result = parse_result(end.raw)
    if isinstance(result, ChildResult):
        _warn_again(result.warned)
    if verdict.left and verdict.outcome != "failed":
        code = getattr(fn, "__code__", None)
        warnings.warn_explicit(
            pytest.PytestWarning(f"in_child: {verdict.left}"),
            pytest.PytestWarning,
            end.test_file or "?",
            code.co_firstlineno if code is not None else 0,
        )
    if verdict.outcome == "failed":
        reason = _xfail_matching(item, result)
        if reason is not None:
            pytest.xfail(reason)
        pytest.fail(verdict.message, pytrace=False)
    if verdict.outcome == "skipped":
        raise _compat.skip_exception(verdict.message)
    if verdict.outcome == "xfailed":
        pytest.xfail(verdict.message)


def _within_timer(limit: float | None) -> float | None:
    """``limit``, or less where pytest-timeout's signal timer (armed before the test's setup)
    fires sooner: its time left less 10% and 1 s, so the child is stopped, and its stack read,
    before that timer ends the test without it."""
    if signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN, None):
        return limit
    left = signal.getitimer(signal.ITIMER_REAL)[0]
    if left <= 0:
        return limit
    ours = round(max(left * 0.9 - 1.0, left / 2), 1)
    return ours if limit is None else min(limit, ours)


def _warn_again(warned: tuple[tuple[str, str, str, int], ...]) -> None:
    """The child's warnings, raised again here: pytest's warnings summary lists them."""
    for category, message, filename, lineno in warned:
        cls = _import_class(category)
        if not (isinstance(cls, type) and issubclass(cls, Warning)):
            cls, message = UserWarning, f"{category.replace(':', '.')}: {message}"
        warnings.warn_explicit(message, cls, filename, lineno)


def _xfail_matching(item: pytest.Item | None, result: object) -> str | None:
    """The reason of the test's ``xfail(raises=...)`` mark when the child's exception is of
    one of its classes (pytest's own rule, on the class the child named); else None."""
    if item is None or not isinstance(result, ChildResult) or not result.raised:
        return None
    xfailed = _compat.xfailed(item)
    raises = getattr(xfailed, "raises", None)
    if not isinstance(raises, (type, tuple)):  # None is any failure: pytest's own rule holds
        return None
    cls = _import_class(result.raised)
    if isinstance(cls, type) and issubclass(cls, raises):
        return str(getattr(xfailed, "reason", ""))
    return None


def _import_class(path: str) -> object:
    """``module:qualname`` imported; None when it cannot be."""
    module, _, qualname = path.partition(":")
    try:
        target: object = sys.modules.get(module) or importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
    except Exception:
        return None
    return target


def default_timeout(item: pytest.Item | None) -> float | None:
    """The test's deadline less 10% and 1 s (at least half of it); None for no deadline."""
    deadline = DEFAULT_DEADLINE if item is None else _deadline(item)
    return max(deadline * 0.9 - 1.0, deadline / 2) if deadline > 0 else None


def _deadline(item: pytest.Item) -> float:
    """The test's deadline as the plugin's timeout chain gives it (pytest-timeout's settings
    included); without the plugin loaded, pytest-timeout's marker, else the default."""
    try:
        session: Value[float] = Settings.from_config(item.config).timeout
    except (ValueError, AttributeError, KeyError):  # the plugin's options are not registered
        session = Value(DEFAULT_DEADLINE, "default")
    try:
        return float(item_timeout(item, session).value)
    except ValueError:
        return session.value


def _for_spawn(
    spec: ChildSpec,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    name: str,
) -> None:
    """Where a spawned child finds the function, and its arguments pickled (or a failure naming
    the one that does not pickle)."""
    module = sys.modules.get(fn.__module__)
    file = getattr(module, "__file__", None)
    if "<locals>" in fn.__qualname__ or not file:
        pytest.fail(
            f"in_child(start='spawn') on {name}: {fn.__qualname__} is not a function of a "
            "module or a class, so a fresh interpreter cannot import it; use start='fork'.",
            pytrace=False,
        )
    if find_target(cast(Any, module), fn.__qualname__, WRAPPED) is not fn:
        pytest.fail(
            f"in_child(start='spawn') on {name}: {fn.__module__}.{fn.__qualname__} does not lead "
            "to the test's function, so a spawned child cannot find it; use start='fork'.",
            pytrace=False,
        )
    spec.module, spec.file, spec.qualname = fn.__module__, str(file), fn.__qualname__
    spec.filters = filters_out()
    spec.sys_path = list(sys.path)
    try:
        spec.arguments = pickle.dumps((args, kwargs))
    except Exception:
        for key, value in [*((str(i), a) for i, a in enumerate(args)), *kwargs.items()]:
            try:
                pickle.dumps(value)
            except Exception as exc:
                pytest.fail(
                    f"in_child(start='spawn') on {name}: its argument {key} "
                    f"({type(value).__name__}) cannot be sent to a spawned child: {exc}. Use "
                    "start='fork', or leave that fixture out of the test's arguments.",
                    pytrace=False,
                )
        raise


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _copy_output(folder: str) -> None:
    """The child's stdout and stderr, into the test's (its captured sections)."""
    for name, stream in ((STDOUT, sys.stdout), (STDERR, sys.stderr)):
        path = Path(folder, name)
        try:
            size = path.stat().st_size
            with path.open("rb") as f:
                f.seek(max(0, size - OUTPUT_LIMIT))
                text = f.read().decode(errors="replace")
        except OSError:
            continue
        if text:
            if size > OUTPUT_LIMIT:
                text = f"[in_child: the first {size - OUTPUT_LIMIT} bytes left out]\n{text}"
            stream.write(text)
            stream.flush()
