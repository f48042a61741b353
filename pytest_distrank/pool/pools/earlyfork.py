"""The fork server forked from pytest as it starts: torch imported once, for pytest and ranks.

Runs in the controller (pool mode): :func:`fork_early` from plugin.py's
``pytest_load_initial_conftests``, :func:`adopt` at the fork server's start (forkserver.py),
:func:`discard` at the session's end. :func:`_serve` runs in the process it forks, which becomes
multiprocessing's fork server and ends with ``os._exit``.

Why: the fork server multiprocessing starts is a fresh interpreter that imports torch, pytest and
its plugins (~1.7 s of CPU in every session), while pytest imports torch too when it collects the
test files. Forked from pytest before conftest.py files, pytest's capture, coverage and every
plugin's configure, the server holds what a fresh one would (pytest, its plugins, torch) without
importing it again; the ranks fork from it as before.

When: the plugin is named on the command line (``-p distrank``, also through ``addopts`` or
``PYTEST_ADDOPTS``: a plugin merely installed does not import torch into every pytest run), the
start method is ``forkserver``, and this process will run pool ranks itself: not a launched rank,
not pytest-xdist's controller (its workers fork their own), not ``--collect-only`` or ``--help``,
not an in-process pytest run inside a test. Otherwise, or if the fork fails, the server starts as
before (``forkserver-late``), beside collection.

What the fork gets anew before it waits (:func:`_fresh_state`): no Python signal handler (SIGINT
ignored until it serves; its ranks get a fresh interpreter's), no timer, no trace or profile
function, every inherited descriptor but its own pointed at /dev/null (an xdist worker's
channel, a log file: the fork must hold none of them open), new ``sys.stdout`` and
``sys.stderr`` (pytest's may hold unflushed output or another thread's lock), and no module
from outside the interpreter's library folders (a project's ``-p`` plugin is imported again by
each rank, with its import-time state). It then waits for :func:`adopt`, which binds its socket
in the session's folder and sends the modules still to import (the first test file's harness
modules, ``--distrank-preload``): it imports them beside collection. :func:`finish`, at the first
pool start, sends what the other test files added and the heap freeze, and closes the pipe: only
then does the server serve. EOF before any module (the session ended first) ends it.

What it keeps from pytest: the modules imported so far (pytest, its plugins, torch) and the
environment as pytest started, before conftest.py files ran: a variable torch reads when it is
imported (``OMP_NUM_THREADS``, ``TORCH_CPP_LOG_LEVEL``) set in conftest.py comes too late for
the ranks and for pytest; set it in the environment, or use ``--distrank-start-method=
forkserver-late``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib
import io
import json
import os
import signal
import socket
import sys
import sysconfig
import threading
import time
import traceback
import warnings
from typing import NoReturn

import pytest

from ... import _compat

#: Options that make a session run no test (pytest's own dests).
NO_TESTS = ("collectonly", "help", "version", "markers", "showfixtures", "show_fixtures_per_test")


@dataclasses.dataclass
class _Early:
    """The forked server, until :func:`adopt` hands it to multiprocessing."""

    pid: int
    go: int  # write end: the modules to import, then EOF
    alive: int  # write end of the server's "alive" pipe (multiprocessing's)
    listener: socket.socket  # bound and listening in adopt()


_early: list[_Early] = []
#: The write end of the adopted server's pipe, until :func:`finish` closes it.
_adopted: list[int] = []
#: The pool-mode sessions of this process between their configure and unconfigure: a
#: ``pytest.main`` inside a test of one is nested in it (it must not fork the process that
#: runs that test, nor stop what the outer session started).
open_sessions: list[object] = []


def wanted(config: pytest.Config, start_method: str, launched: bool) -> bool:
    """Whether this session forks its fork server from pytest now (see the module)."""
    if start_method != "forkserver" or launched or config.invocation_params.plugins:
        return False  # plugins handed to pytest.main: a rank's session, or one inside a test
    if open_sessions:
        return False  # pytest.main inside a test of this process's session
    ns = config.known_args_namespace
    if not any(p in ("distrank", "pytest_distrank.plugin") for p in getattr(ns, "plugins", [])):
        return False
    if any(getattr(ns, dest, False) for dest in NO_TESTS):
        return False
    xdist_controller = bool(getattr(ns, "numprocesses", None) or getattr(ns, "tx", None))
    return not (xdist_controller and "PYTEST_XDIST_WORKER" not in os.environ)


def fork_early(modules: list[str]) -> None:
    """Import ``modules`` (torch ...) here, then fork the server; never raises. A failed import
    or fork leaves nothing: the server then starts as multiprocessing starts it."""
    if _early:
        return
    try:
        for name in modules:
            importlib.import_module(name)
    except Exception:
        return  # the late server meets the same import error and reports it
    from multiprocessing import forkserver  # noqa: F401  (imported here, not in the fork)

    for stream in (sys.stdout, sys.stderr):  # what pytest printed so far, printed once
        with contextlib.suppress(Exception):
            stream.flush()
    listener = socket.socket(socket.AF_UNIX)
    go_r, go_w = os.pipe()
    alive_r, alive_w = os.pipe()
    try:
        with warnings.catch_warnings():  # 3.12+: "multi-threaded, fork() may deadlock" (xdist)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        for fd in (go_r, go_w, alive_r, alive_w):
            os.close(fd)
        listener.close()
        return
    if pid == 0:
        _serve(go_r, listener.fileno(), alive_r)
    os.close(go_r)
    os.close(alive_r)
    _early.append(_Early(pid, go_w, alive_w, listener))
    atexit.register(discard)  # however the session ends, the fork is reaped by pytest


def adopt(modules: list[str]) -> bool:
    """Make the early server multiprocessing's fork server: bind its socket (in the folder
    ``use_socket_folder`` chose), send ``modules`` to import now; it serves after
    :func:`finish`. False when there is none, or it died: multiprocessing then starts one."""
    if not _early:
        return False
    early = _early.pop()
    try:
        if _compat.reap_if_exited(early.pid):
            raise OSError(f"the early fork server (pid {early.pid}) exited")
        address = _compat.new_socket_address()
        early.listener.bind(address)
        os.chmod(address, 0o600)
        early.listener.listen()
        _write_all(early.go, json.dumps(modules).encode() + b"\n")
    except OSError:
        _end(early)
        return False
    _adopted.append(early.go)
    early.listener.close()  # the server's copy serves
    _compat.adopt_fork_server(str(address), early.alive, early.pid)
    return True


def finish(modules: list[str]) -> bool:
    """Send the adopted server its last modules to import (the other test files' harness
    modules, the heap freeze, in order); it serves once it has imported them. False if none
    was adopted, or this was done already; never raises (a dead server fails the pool start
    that waits for it)."""
    if not _adopted:
        return False
    go = _adopted.pop()
    with contextlib.suppress(OSError):
        _write_all(go, json.dumps(modules).encode() + b"\n")
    os.close(go)
    return True


def discard() -> None:
    """The session ends without having used the early server: it reads EOF and exits; reaped."""
    while _early:
        _end(_early.pop())


def _end(early: _Early, bound: float = 5.0) -> None:
    """Close its pipes (it exits at EOF) and reap it; killed if it has not exited within
    ``bound`` seconds (stopped, or stuck)."""
    for fd in (early.go, early.alive):
        with contextlib.suppress(OSError):
            os.close(fd)
    early.listener.close()
    deadline = time.monotonic() + bound
    while not _compat.reap_if_exited(early.pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(early.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(early.pid, 0)
            return
        time.sleep(0.01)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _serve(go: int, listener: int, alive: int) -> NoReturn:
    """The forked server: fresh state, wait for :func:`adopt`, import, serve forks; never
    returns (``os._exit``: pytest's atexit handlers and buffers are the controller's)."""
    code = 0
    try:
        _fresh_streams()
        # Ctrl-C is the controller's to handle until the server serves; multiprocessing's loop
        # then ignores it and gives each rank the handler found: a fresh interpreter's.
        sigint = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _fresh_state(keep={go, listener, alive})
        _forget_local_modules()
        got, pending = False, b""
        while chunk := os.read(go, 65536):  # one JSON list a line: imported as it comes
            got, (*lists, pending) = True, (pending + chunk).split(b"\n")
            for names in lists:
                for name in json.loads(names):
                    with contextlib.suppress(ImportError):  # as multiprocessing's server does
                        importlib.import_module(name)
        if not got:
            _exit(0)  # the session ended first
        os.close(go)
        from multiprocessing import forkserver

        signal.signal(signal.SIGINT, signal.default_int_handler if callable(sigint) else sigint)
        forkserver.main(listener, alive, [])
    except SystemExit:
        pass
    except BaseException:
        code = 1
        with contextlib.suppress(Exception):
            os.write(2, f"pytest-distrank's fork server failed:\n{traceback.format_exc()}".encode())
    _exit(code)


def _exit(code: int) -> NoReturn:
    os._exit(code)


#: pytest's streams as the fork found them: kept, never used, never finalized (see below).
_ABANDONED: list[object] = []


def _fresh_streams() -> None:
    """New ``sys.stdout`` and ``sys.stderr`` over fds 1 and 2: the fork's copies of pytest's
    may hold output pytest has not flushed yet (every rank would print it again when it
    flushes) or a lock another thread of pytest held at the fork (the first flush would wait
    forever). Kept referenced, so that no finalizer flushes them."""
    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        _ABANDONED.append(old)
        new = io.TextIOWrapper(
            io.FileIO(1 if name == "stdout" else 2, "w", closefd=False),
            encoding=getattr(old, "encoding", None) or "utf-8",
            errors=getattr(old, "errors", None) or "backslashreplace",
            line_buffering=True,
        )
        setattr(sys, name, new)
        setattr(sys, f"__{name}__", new)


def _forget_local_modules() -> None:
    """Modules from outside the interpreter's library folders (a ``-p`` plugin module of the
    project, what it imported) are imported again by each rank, as with a fresh server: their
    import-time state (an open file, a thread) would otherwise reach the ranks dead. pytest,
    its installed plugins, torch and this plugin stay."""
    paths = sysconfig.get_paths()
    folders = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    roots = {os.path.realpath(p) for p in (*folders, sys.prefix, sys.base_prefix, sys.exec_prefix)}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file or name in ("__main__", "__mp_main__") or name.startswith("pytest_distrank"):
            continue
        real = os.path.realpath(file)
        if not any(real.startswith(root + os.sep) for root in roots):
            _ABANDONED.append(sys.modules.pop(name))


def _fresh_state(keep: set[int]) -> None:
    """What the fork must not keep from pytest (see the module)."""
    for sig in signal.valid_signals():  # a handler of pytest's (or a plugin's) goes; an
        with contextlib.suppress(OSError, ValueError, RuntimeError):  # inherited SIG_IGN stays
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
    for timer in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF):
        signal.setitimer(timer, 0)
    signal.set_wakeup_fd(-1)
    sys.settrace(None)
    sys.setprofile(None)
    threading.settrace(None)
    threading.setprofile(None)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd > 2 and fd not in keep and fd != devnull:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
                os.dup2(devnull, fd)
    os.close(devnull)
