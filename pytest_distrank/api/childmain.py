"""The child of ``in_child``: it runs the test's function and writes what came of it.

Runs in the child process :mod:`api.children` starts: a fork of the test's process (the pytest
process, or a rank of a distributed test) entered through :func:`child_main`, or a fresh
interpreter (``start="spawn"``) entered through :func:`spawned`, which imports the test's module
as pytest does (asserts rewritten) and unpickles the arguments. Everything it reports goes
through files of the parent's private folder, named below: no pipe to hold open, nothing lost
when the parent reads after a kill.

Before the function: its own process group (the parent ends the group), death with its parent
(``PR_SET_PDEATHSIG``), a child subreaper (the function's double-forked processes stay below
it), a stack dump on :data:`DUMP_SIGNAL` into the stack file, and its output into the output
files. After it: the processes the function left running are named and killed, the result is
written (atomically), and the child ends with ``os._exit(0)``: no atexit (multiprocessing's
joins a leaked worker forever), no pytest teardown.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import faulthandler
import functools
import os
import pickle
import shutil
import signal
import sys
import traceback
import unittest
import warnings
from collections.abc import Callable
from pathlib import Path
from time import monotonic as _monotonic  # at import: a test's patched clock is not this one's
from time import sleep as _sleep
from typing import Any

import pytest

from .. import _compat
from ..outcome.childverdict import ChildResult
from ..rank import reaper
from .childcall import (
    filters_in,
    find_target,
    run_finalizers,
    subtest_recorder,
    thread_errors_warned,
)

#: The signal the parent sends for the child's stack (a real-time one: no library uses it).
DUMP_SIGNAL = signal.SIGRTMIN + 7
#: The files of the parent's folder, by what they hold.
RESULT, STACK, STDOUT, STDERR, SPEC = "result.json", "stack.txt", "out.txt", "err.txt", "spec"
#: The attribute of an ``in_child`` wrapper that holds the function it wraps.
WRAPPED = "__distrank_in_child__"
#: The signal the child gets when its parent dies (pytest-timeout's thread method ends it with
#: ``os._exit``): it kills its tree, then itself.
PARENT_DIED = signal.SIGRTMIN + 8
_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass
class ChildSpec:
    """What the child needs to know; pickled into the folder for a spawned one."""

    folder: str
    start: str
    parent: int
    #: Send fds 1 and 2 to the folder's output files (off under ``-s``: the terminal).
    redirect: bool
    #: ``--tb`` and ``--showlocals``, for the failure's traceback.
    tbstyle: str = "long"
    showlocals: bool = False
    #: spawn: where the function is, and its arguments (pickled ``(args, kwargs)``).
    module: str = ""
    file: str = ""
    qualname: str = ""
    sys_path: list[str] = dataclasses.field(default_factory=list)
    arguments: bytes = b""
    #: spawn: the test's warning filters (its marks', ``-W``'s), as :func:`filters_out` gives.
    filters: list[tuple[str, Any, str, Any, int]] = dataclasses.field(default_factory=list)


def child_main(
    spec: ChildSpec, fn: Callable[..., Any], args: Any, kwargs: Any, request: Any = None
) -> None:
    """A forked child, from fork to exit."""
    _prepare(spec)
    _finish(spec, run(fn, args, kwargs, spec, request))


def spawned(spec_path: str) -> None:
    """A spawned child (``python -c``), from start to exit."""
    spec: ChildSpec = pickle.loads(Path(spec_path).read_bytes())
    sys.path[:] = spec.sys_path
    _prepare(spec)
    try:
        module = _compat.import_rewritten(spec.module, spec.file)
        fn = find_target(module, spec.qualname, WRAPPED)
        args, kwargs = pickle.loads(spec.arguments)
        filters_in(spec.filters)
    except pytest.fail.Exception as exc:  # the function not found: a message, no traceback
        result = ChildResult("failed", str(exc.msg), f"Failed: {str(exc.msg).splitlines()[0]}")
    except BaseException as exc:  # the module's import, as pytest would show it
        result = ChildResult(
            "failed", "".join(traceback.format_exception(exc)), f"{type(exc).__name__}: {exc}"
        )
    else:
        result = run(fn, args, kwargs, spec)
    _finish(spec, result)


def run(
    fn: Callable[..., Any], args: Any, kwargs: Any, spec: ChildSpec, request: Any = None
) -> ChildResult:
    """Call the function, then the finalizers it added; its outcome as the child reports it,
    with the warnings it raised (for the parent's warnings summary)."""
    me = os.getpid()
    with warnings.catch_warnings(record=True) as caught, thread_errors_warned():
        result = _call(fn, args, kwargs, spec, request)
    if os.getpid() != me:  # a process the function forked fell out of it: not the child
        _fell_out(result)
    warned = tuple(
        (_class_path(w.category), str(w.message), str(w.filename), int(w.lineno or 0))
        for w in caught
    )
    return dataclasses.replace(result, warned=warned) if warned else result


def _call(
    fn: Callable[..., Any], args: Any, kwargs: Any, spec: ChildSpec, request: Any
) -> ChildResult:
    subtests = subtest_recorder(args[0] if args else None)
    try:
        with run_finalizers(request):
            fn(*args, **kwargs)
    except pytest.skip.Exception as exc:
        return ChildResult("skipped", str(exc.msg or "skipped in the child"))
    except unittest.SkipTest as exc:
        return ChildResult("skipped", str(exc) or "skipped in the child")
    except pytest.xfail.Exception as exc:  # before Failed: XFailed is one
        return ChildResult("xfailed", str(exc.msg or "xfailed in the child"))
    except BaseException as exc:
        return _failure(exc, fn, spec)
    if subtests is not None and subtests.failures:
        first = subtests.failures[0][0]
        plural = "s" if len(subtests.failures) != 1 else ""
        crash = f"{len(subtests.failures)} subtest{plural} failed, first {first}"
        text = "\n".join(f"{name}:\n{tb}" for name, tb in subtests.failures)
        return ChildResult("failed", text, crash)
    return ChildResult("passed")


def _fell_out(result: ChildResult) -> None:
    """A process the function forked returned or raised out of it: it exits here, saying so on
    stderr (its failure's traceback too), and writes no result: the child's own stands."""
    with contextlib.suppress(Exception):
        sys.stderr.write(
            f"in_child: pid {os.getpid()}, forked by the test's function, {result.outcome} out "
            "of it; it exits here (the child's own outcome is the test's)\n"
        )
        if result.outcome == "failed":
            sys.stderr.write(result.text + "\n")
        sys.stderr.flush()
    os._exit(70 if result.outcome == "failed" else 0)


def _class_path(cls: type) -> str:
    """``module:qualname`` of a class, for the parent to import and compare."""
    return f"{cls.__module__}:{cls.__qualname__}"


def _failure(exc: BaseException, fn: Callable[..., Any], spec: ChildSpec) -> ChildResult:
    """The traceback as pytest prints a test's, from the function's frame down."""
    excinfo = pytest.ExceptionInfo.from_exception(exc)
    if isinstance(exc, pytest.fail.Exception) and not exc.pytrace:
        message = exc.msg or ""
        return ChildResult("failed", message, f"Failed: {(message.splitlines() or [''])[0]}")
    code = getattr(fn, "__code__", None)
    tb = excinfo.traceback
    if code is not None:
        cut = tb.cut(path=Path(code.co_filename), firstlineno=code.co_firstlineno - 1)
        tb = cut if cut is not tb else tb.filter(_not_ours)  # raised outside it: a finalizer
    excinfo.traceback = tb.filter(excinfo)
    style = spec.tbstyle if spec.tbstyle in ("long", "short", "line", "native") else "long"
    text = str(excinfo.getrepr(style=style, showlocals=spec.showlocals, truncate_locals=True))  # type: ignore[arg-type]
    crash = excinfo.exconly().splitlines()[0] if excinfo.exconly() else type(exc).__name__
    return ChildResult("failed", text, crash, raised=_class_path(type(exc)))


def _not_ours(entry: Any) -> bool:
    """A traceback entry outside the plugin and contextlib (a finalizer's error, run here)."""
    path = str(entry.path)
    return not path.startswith(_PACKAGE) and not path.startswith(contextlib.__file__[:-3])


_PACKAGE = str(Path(__file__).resolve().parents[1])


def _prepare(spec: ChildSpec) -> None:
    """Group, parent death, subreaper, stack dumps, output (the module's docstring)."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    signal.signal(PARENT_DIED, functools.partial(_parent_died, spec.folder))
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, PARENT_DIED, 0, 0, 0)
    if os.getppid() != spec.parent:  # the parent died before the death signal was armed
        os._exit(1)
    reaper.become_subreaper()
    stack = os.open(os.path.join(spec.folder, STACK), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    faulthandler.register(DUMP_SIGNAL, file=stack, all_threads=True, chain=False)
    if spec.redirect and spec.start == "fork":  # a spawned child's were given by Popen
        for fd, name in ((1, STDOUT), (2, STDERR)):
            target = os.open(os.path.join(spec.folder, name), os.O_WRONLY | os.O_APPEND)
            os.dup2(target, fd)
            os.close(target)
        sys.stdout = open(1, "w", buffering=1, errors="replace", closefd=False)
        sys.stderr = open(2, "w", buffering=1, errors="replace", closefd=False)
    if faulthandler.is_enabled() or spec.start == "spawn":  # a crash's stack: to its stderr
        faulthandler.enable(file=sys.stderr, all_threads=True)


def _parent_died(folder: str, signum: int, frame: Any) -> None:
    """The parent is gone (pytest-timeout's thread method ends it with ``os._exit``): nobody
    will end this tree (its processes are this subreaper's) nor remove the folder."""
    reaper.kill_all(reaper.descendants([os.getpid()]))
    shutil.rmtree(folder, ignore_errors=True)
    os._exit(1)


def _finish(spec: ChildSpec, result: ChildResult) -> None:
    """End what the function left running, write the result, exit without atexit."""
    reaper.reap_children()  # adopted orphans that already ended: not "left running"
    left = tuple(end_tree([os.getpid()], include_roots=False))
    reaper.reap_children()
    if left:
        result = dataclasses.replace(result, left=left)
    path = os.path.join(spec.folder, RESULT)
    with open(path + ".part", "wb") as f:
        f.write(result.to_json())
    os.replace(path + ".part", path)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def command_line(pid: int) -> str:
    """``pid 4711: python -m worker`` (the command cut at 120 characters)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        words = "?"
    return f"pid {pid}: {words[:117] + '...' if len(words) > 120 else words}"


def end_tree(roots: list[int], include_roots: bool) -> list[str]:
    """Stop every descendant of ``roots`` (again, until no new one appears: a process that
    forks while being listed is stopped before its child can fork), then kill them all; the
    roots too if ``include_roots``. Their command lines, roots left out."""
    stopped: set[int] = set()
    for pid in roots if include_roots else ():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGSTOP)
    named: list[str] = []
    while True:
        new = reaper.descendants(roots) - stopped
        if not new:
            break
        for pid in sorted(new):
            state = reaper.proc_stat(pid)
            if state is not None and state[0] not in ("Z", "X"):  # an ended one is not running
                named.append(command_line(pid))
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new
    reaper.kill_all(stopped | (set(roots) if include_roots else set()))
    _wait_gone(stopped)
    return named


def _wait_gone(pids: set[int], bound: float = 2.0) -> None:
    """Reap the killed processes that are this one's children; wait (``bound``) until the others
    are gone or zombies, so that nobody names them again as running."""
    end = _monotonic() + bound
    for pid in sorted(pids):
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)  # SIGKILLed: at once
            continue
        while _monotonic() < end:
            state = reaper.proc_stat(pid)
            if state is None or state[0] in ("Z", "X"):
                break
            _sleep(0.01)
