"""Private CPython multiprocessing access: the fork server's pid, socket folder and pipes.

Runs in pool mode's controller (the fork server's start and end) and in each forked rank (the fork
server's alive pipe); through :mod:`pytest_distrank._compat`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any


def mp_process_config() -> dict[str, Any]:
    """multiprocessing's per-process settings (``current_process()._config``, holding ``tempdir``
    where its sockets go); if renamed, fork server starts fail with AttributeError."""
    from multiprocessing import process

    config: dict[str, Any] = process.current_process()._config  # type: ignore[attr-defined]
    return config


def forkserver_pid() -> int:
    """The running fork server's pid (``forkserver._forkserver._forkserver_pid``, unguarded as
    always); if renamed, every fork server pool start fails."""
    from multiprocessing import forkserver

    return int(forkserver._forkserver._forkserver_pid)  # type: ignore[attr-defined]


def adopt_fork_server(address: str, alive_fd: int, pid: int) -> None:
    """Make a server this process forked multiprocessing's fork server (earlyfork.py): the
    fields ``ensure_running`` fills when it spawns one; ``ensure_running`` then finds it alive.
    If renamed, AttributeError reaches the caller and every pool start fails, as with
    :func:`forkserver_pid`."""
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver
    with server._lock:
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_fd
        server._forkserver_pid = pid


def new_socket_address() -> str:
    """A fresh ``AF_UNIX`` path in multiprocessing's temp folder (``arbitrary_address``, as
    ``ensure_running`` makes one); if renamed, AttributeError fails the pool start."""
    from multiprocessing import connection

    return str(connection.arbitrary_address("AF_UNIX"))  # type: ignore[attr-defined]


def reap_if_exited(pid: int) -> bool:
    """Whether child ``pid`` has exited (reaped now if so); a pid that is not a child counts
    as exited."""
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done != 0


def kill_fork_server() -> None:
    """SIGKILL a fork server that never got ready (its private pid); if the attribute goes,
    AttributeError reaches the caller, as it always did."""
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver
    with contextlib.suppress(ProcessLookupError, TypeError):
        os.kill(server._forkserver_pid, signal.SIGKILL)


def stop_fork_server() -> None:
    """Forget a killed fork server (``_stop``: its pipe, its zombie, its socket); when missing,
    nothing is forgotten and the next start may find a stale server."""
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver
    with contextlib.suppress(OSError, AttributeError):
        server._stop()  # closes the server's pipe, reaps it, unlinks its socket


def resource_tracker_running() -> bool:
    """Whether this process has started multiprocessing's resource tracker (its pipe is open);
    if renamed, False."""
    from multiprocessing import resource_tracker

    return getattr(resource_tracker._resource_tracker, "_fd", None) is not None


def stop_resource_tracker(bound: float = 5.0) -> None:
    """Stop multiprocessing's resource tracker of this process and reap it: the fork server's
    start made this process its parent, and left running it outlives pytest by a moment and
    dies an orphan, reaped by init or not at all. Its pipe is closed (the tracker exits at EOF);
    a process that still holds the pipe's other copy (an orphan of a killed fork server) keeps
    it alive, so it is waited for ``bound`` seconds, then killed. When renamed, nothing is
    stopped (the tracker then ends with the process, as before)."""
    from multiprocessing import resource_tracker

    tracker: Any = resource_tracker._resource_tracker
    with contextlib.suppress(OSError, AttributeError, ChildProcessError), tracker._lock:
        fd, pid = tracker._fd, tracker._pid
        if fd is None or pid is None:
            return
        tracker._fd = tracker._pid = None
        os.close(fd)
        deadline = time.monotonic() + bound
        while os.waitpid(pid, os.WNOHANG)[0] == 0:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return
            time.sleep(0.01)


def close_fork_server_alive_fd() -> None:
    """Close a forked rank's copy of the fork server's alive pipe (``_forkserver_alive_fd``); if
    renamed, nothing is closed and ranks outlive a dead controller until PDEATHSIG fires."""
    from multiprocessing import forkserver

    server: Any = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None


def executor_worker(thread: Any) -> bool:
    """Whether ``thread`` is a worker of a ``concurrent.futures.ThreadPoolExecutor``
    (``Thread._target`` is ``concurrent.futures.thread._worker``): it waits for work as long as
    its executor lives, and interpreter exit shuts it down. If renamed, such workers count as any
    other thread a test left running."""
    from concurrent.futures import thread as futures_thread

    target = getattr(thread, "_target", None)
    return target is not None and target is getattr(futures_thread, "_worker", None)


def foreign_thread(thread: Any) -> bool:
    """Whether ``thread`` is a thread Python did not start (``threading._DummyThread``: a C++
    thread, such as RPC's or gloo's, that called into Python): it cannot be joined, and no test
    started it. If renamed, such threads count as daemon threads a test left running."""
    import threading

    dummy = getattr(threading, "_DummyThread", None)
    return dummy is not None and isinstance(thread, dummy)


def environ_data() -> dict[Any, Any]:
    """A copy of the process environment as ``os.environ`` keeps it (encoded: bytes on POSIX,
    ``os.environ._data``, private): 0.2 us against 26 us for ``dict(os.environ)``, which decodes
    every name and value. If renamed, the decoded copy is taken."""
    data = getattr(os.environ, "_data", None)
    return dict(data) if isinstance(data, dict) else dict(os.environ)
