"""The suite's zygote server: a warm process that inner pytest sessions are forked from.

Runs in its own process (``python tests/zygote_server.py``, started by the client in
``tests/zygote.py``, one per outer pytest process): it imports torch, numpy and pytest once, then
forks one child per process a request names, and each child becomes ``python -m MODULE ARGS``
(``runpy``) as a fresh interpreter would, in its session's folder, environment, ``sys.path``,
umask and standard streams (files, or a pseudo-terminal). Requests come one JSON line at a time
on stdin, each a list of processes forked together (one session, or the processes of one
launched world); the server answers each with their pids, goes on serving while they run, and
reports each one's end (wait status, CPU seconds) on stdout when it reaps it: a request's
processes in their order, as a launcher that waits for each in turn. What a child could
inherit, and how it is kept out, is ``tests/zygote.py``'s docstring.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import sys
from collections.abc import Sequence
from typing import Any

#: ``prctl(PR_SET_CHILD_SUBREAPER, 1)``.
PR_SET_CHILD_SUBREAPER = 36
#: The server's exit code when a child could not be set up (before pytest ran).
SETUP_FAILED = 70


def thread_count(value: str | None) -> int | None:
    """``OMP_NUM_THREADS``'s value as torch reads it at import: a positive count, or None."""
    return int(value) if value is not None and value.isdigit() and int(value) > 0 else None


def read_lines(fd: int, buffer: bytearray, timeout: float | None) -> list[bytes] | None:
    """The whole lines that arrive on ``fd`` within ``timeout`` seconds (None: no bound), the
    start of a line kept in ``buffer``; None once the pipe is closed. (Not a buffered file's
    ``readline``: ``select`` cannot see the lines such a file has read ahead.)"""
    if not select.select([fd], [], [], timeout)[0]:
        return []
    chunk = os.read(fd, 1 << 16)
    if not chunk:
        return None
    buffer += chunk
    *lines, rest = bytes(buffer).split(b"\n")
    buffer[:] = rest
    return lines


def session_path(cwd: str, pythonpath: str, base: Sequence[str]) -> list[str]:
    """``sys.path`` of ``python -m pytest`` started in ``cwd`` with ``PYTHONPATH=pythonpath``."""
    entries = [*(os.path.abspath(p) for p in pythonpath.split(os.pathsep) if p), *base]
    return [cwd, *dict.fromkeys(entries)]  # site removes duplicates before the script's folder


def _exit_like_python(code: object) -> int:
    """Finish as ``Py_Finalize`` would after ``SystemExit(code)``; the exit status."""
    import atexit
    import threading

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads, as at exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            status = status or 120
    return status


def _default_signals(numbers: Sequence[int]) -> None:
    """In the child: ``numbers`` as a fresh interpreter started with them at their defaults
    (``SIG_DFL``, unblocked) has them: SIGINT raises ``KeyboardInterrupt``, the others their
    default action (the server may have inherited them ignored, as a CI job without job control
    does)."""
    for number in numbers:
        handler = signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL
        signal.signal(number, handler)
    if numbers:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(numbers))


def _streams(request: dict[str, Any]) -> None:
    """In the child: stdin, stdout and stderr as the request says. A terminal (a pty's slave)
    becomes all three and the controlling terminal of a session of the child's own (Ctrl-C typed
    there is SIGINT to the child's group, as in a real terminal); else stdin is an empty pipe and
    the outputs go to files."""
    if request.get("terminal"):
        import fcntl
        import termios

        os.setsid()
        fd = os.open(request["terminal"], os.O_RDWR)
        fcntl.ioctl(fd, termios.TIOCSCTTY, 0)
        for target in (0, 1, 2):
            os.dup2(fd, target)
        os.close(fd)
        return
    if request.get("new_session"):
        os.setsid()
    empty, writer = os.pipe()
    os.close(writer)
    os.dup2(empty, 0)
    os.close(empty)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if fd == 2 and request["stderr"] == request["stdout"]:
            os.dup2(1, 2)  # one file, one offset: as 2>&1
            continue
        target = os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)


def _child(request: dict[str, Any], base: Sequence[str]) -> None:
    """In the forked child: become ``python -m MODULE ARGS`` (pytest, or a launcher such as
    ``torch.distributed.run``) in the session's setting; never returns."""
    status = SETUP_FAILED
    try:
        threads = request["env"].get("OMP_NUM_THREADS")
        if threads != os.environ.get("OMP_NUM_THREADS") and (count := thread_count(threads)):
            import torch

            torch.set_num_threads(count)  # libgomp read the server's value when torch loaded it
        if request.get("umask") is not None:
            os.umask(request["umask"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _streams(request)
        _default_signals(request.get("signals", ()))
        os.closerange(3, 1024)
        sys.path[:] = session_path(request["cwd"], request["env"].get("PYTHONPATH", ""), base)
        module = request.get("module", "pytest")
        sys.argv = [module, *request["args"]]
        import runpy

        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code: object = 0
        except SystemExit as stop:
            code = stop.code
        except Exception:  # uncaught (torchrun's ChildFailedError): as the interpreter does
            import traceback

            traceback.print_exc()
            code = 1
        status = _exit_like_python(code)
    except BaseException:
        import traceback

        traceback.print_exc()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    os._exit(status)


def _children() -> set[int]:
    """The server's child processes (orphans re-parented to it included), from each of its
    threads' ``children`` file."""
    found: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as children:
                found.update(int(pid) for pid in children.read().split())
        except OSError:
            continue
    return found


def _reap(worlds: list[list[int]]) -> dict[int, tuple[int, float]]:
    """Reap what ended below the server: the processes of each request (``worlds``, each one's
    pids not yet reaped) in their order, as a launcher that waits for each in turn (a process
    that ended before the one ahead of it stays a zombie until then: a rank may read its exit
    status in ``/proc``), and orphans re-parented to the server. For each request's process
    reaped, its wait status and the CPU seconds (user + system) of it and of every process it
    waited for; ``worlds`` keeps what is left."""
    ended: dict[int, tuple[int, float]] = {}
    for world in worlds:
        while world:
            pid, status, usage = os.wait4(world[0], os.WNOHANG)
            if not pid:
                break
            ended[world.pop(0)] = status, usage.ru_utime + usage.ru_stime
    worlds[:] = [world for world in worlds if world]
    held = {pid for world in worlds for pid in world}
    for pid in _children() - held:
        with contextlib.suppress(ChildProcessError):
            os.wait4(pid, os.WNOHANG)
    return ended


def serve() -> None:
    """The server's loop: requests on stdin, replies on stdout, until stdin is closed."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    import numpy  # noqa: F401
    import torch
    import torch.distributed
    import torch.multiprocessing  # noqa: F401

    gc.collect()
    gc.freeze()  # a child's collections skip what the server imported (~0.1 s of CPU a session)
    # What sys.path is beyond the script's folder and PYTHONPATH: the interpreter's own.
    own = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in sys.path[1:] if p not in own]

    def reply(message: dict[str, Any]) -> None:
        sys.stdout.buffer.write(json.dumps(message).encode() + b"\n")
        sys.stdout.buffer.flush()

    worlds: list[list[int]] = []
    buffer = bytearray()
    while True:
        lines = read_lines(0, buffer, 0.02 if worlds else 0.2)
        for pid, (status, cpu) in _reap(worlds).items():
            reply({"ended": pid, "status": status, "cpu": cpu})
        if lines is None:
            return
        for line in lines:
            sys.stdout.flush()
            sys.stderr.flush()
            pids = []
            for request in json.loads(line):  # the processes of one world start together
                pid = os.fork()
                if pid == 0:
                    _child(request, base)
                pids.append(pid)
            worlds.append(list(pids))
            reply({"pids": pids})


if __name__ == "__main__":
    serve()
