"""Launcher mode, the start and the end of a rank's session: folders, logs, the exit together.

Runs in every rank of a launched world: :func:`open_rank` at configure time (main thread),
:func:`interrupted` when ``pytest.exit()`` or ``KeyboardInterrupt`` ends the session,
:func:`adopt_exit_code` in ``pytest_sessionfinish``, :func:`leave` at interpreter exit or from the
watchdog thread, :func:`lost` wherever the control channel fails.

Folders: every rank of a run agrees on a run id (rank 0 makes it, the store carries it), and uses
``<base>/distrank-<run id>/``. ``<base>`` is ``--basetemp`` when given (each rank's own basetemp
is then ``<basetemp>/rank<N>``), else ``pytest-of-<user>`` in pytest's temp root
(``PYTEST_DEBUG_TEMPROOT``, else the system temp folder). The folder holds ``rank<N>.log`` (the
terminal report of ranks other than 0; stack dumps) and ``shared/`` (the ``shared_tmp_path``
folders: shared by the ranks of one node, or of all nodes when ``<base>`` is on a shared
filesystem).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import getpass
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .. import _compat
from ..stacks import interruption_message
from .channel import LOST_EXIT, Channel, ChannelError
from .gather import publish_stopped
from .rank import leave_if_fork, wait_answering

if TYPE_CHECKING:
    from .plugin import LaunchPlugin

#: Bound on connecting to the control store and agreeing on the run id.
CONNECT_TIMEOUT = 120.0
#: Bound on the final meeting of all ranks before they exit together.
FINAL_WAIT = 30.0


def open_rank(plugin: LaunchPlugin) -> None:
    """Connect, agree on the run's folder, quiet ranks other than 0, start the watchdog."""
    try:
        plugin.channel = Channel(plugin.launch, CONNECT_TIMEOUT)
        run_id = _agree_run_id(plugin, plugin.channel)
    except ChannelError as exc:
        raise pytest.UsageError(str(exc)) from None
    for name, value in plugin.launch.rank_env().items():
        os.environ.setdefault(name, value)
    config = plugin.config
    given = config.option.basetemp
    if given:
        base = Path(os.path.abspath(str(given)))
    else:
        # pytest's own temp root (PYTEST_DEBUG_TEMPROOT, else the system temp folder).
        temproot = os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir()
        base = Path(temproot) / f"pytest-of-{_user()}"
    plugin.root = base / f"distrank-{run_id}"
    plugin.root.mkdir(parents=True, exist_ok=True)
    plugin.log_path = str(plugin.root / f"rank{plugin.rank}.log")
    if given:
        # The ranks of one node share the command line: each gets a basetemp of its own under
        # it (pytest empties a given basetemp, which must not happen under a peer's feet).
        _compat.set_given_basetemp(config, base / f"rank{plugin.rank}")
    if plugin.rank != 0:
        _quiet(plugin)
    from .watchdog import Watchdog

    plugin.watchdog = Watchdog(plugin)
    plugin.watchdog.start()
    atexit.register(_at_exit, plugin)
    if plugin.rank == 0 and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, plugin.on_sigterm)


def _agree_run_id(plugin: LaunchPlugin, channel: Channel) -> str:
    if plugin.rank == 0:
        run_id = uuid.uuid4().hex[:12]
        channel.put("run", run_id)
        return run_id
    if channel.wait_any(["run"], time.monotonic() + CONNECT_TIMEOUT) is None:
        raise ChannelError(
            f"pytest-distrank: {plugin.launch.label()} reached the control store, but rank 0 "
            f"did not register this run within {CONNECT_TIMEOUT:.0f} s; did rank 0 start "
            "pytest with -p distrank (and the same --distrank-launcher)?"
        )
    return str(channel.get("run"))


def _quiet(plugin: LaunchPlugin) -> None:
    """Ranks other than 0: terminal report to the log, one line on stdout, no junit or cache."""
    config = plugin.config
    stream = open(plugin.log_path, "w", encoding="utf-8", buffering=1)
    plugin.log_stream = stream
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if _compat.can_redirect_terminal(reporter):
        _compat.redirect_terminal(reporter, stream)
    print(f"distrank: {plugin.launch.label()}: report on rank 0; log in {plugin.log_path}")
    sys.stdout.flush()
    _compat.drop_junit_xml(config)  # one junit file, written by rank 0
    cache = getattr(config, "cache", None)
    if cache is not None:
        # lastfailed/nodeids are rank 0's to write; N ranks writing one cache folder race.
        setattr(cache, "set", lambda key, value: None)  # noqa: B010


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def adopt_exit_code(plugin: LaunchPlugin, session: pytest.Session, exitstatus: int) -> None:
    """Rank 0 publishes its exit code; the others wait for it and make it theirs."""
    channel = plugin.channel
    if channel is None:
        return
    if plugin.rank == 0:
        plugin.exit_code = int(exitstatus)
        with contextlib.suppress(ChannelError):
            channel.put("exit", plugin.exit_code)
        return
    try:
        wait_answering(plugin, ["exit"])
        code = int(channel.get("exit"))
    except ChannelError as exc:
        plugin.log(f"distrank: {plugin.launch.label()}: no exit code from rank 0 ({exc})")
        code = LOST_EXIT
    plugin.exit_code = code
    session.exitstatus = code
    plugin.log(f"distrank: {plugin.launch.label()}: exit code {code} (rank 0's)")


def interrupted(plugin: LaunchPlugin, exc: BaseException) -> None:
    """``pytest.exit()`` or ``KeyboardInterrupt`` ended this rank's session (main thread).

    In a distributed test the ranks are no longer in step: fixtures are not torn down (their
    teardown may wait on a peer). A rank other than 0 tells rank 0, which fails the test with
    why and where and ends the run; rank 0 reports its own interruption as pytest does, and its
    exit code (published at session finish) releases the other ranks.
    """
    cur = plugin.current
    leave_if_fork(plugin, cur.index if cur else plugin.index, cur.item.nodeid if cur else "")
    with plugin.lock:
        taken = cur is not None and cur.taken_over
        if cur is not None:
            cur.done = True
    if taken:
        park()  # the watchdog reports the test and ends the process
    plugin.current = None
    if plugin.terminated or plugin.exiting or (cur is None and plugin.rank == 0):
        return
    plugin.aborted = plugin.aborted or cur is not None
    if plugin.rank == 0 or plugin.channel is None:
        return
    where = cur.item.nodeid if cur is not None else "a pause between tests"
    message = interruption_message(exc, where)
    plugin.log(
        f"distrank: {plugin.launch.label()}: {message.splitlines()[0]}; this rank's session "
        "ends; rank 0 fails the test and ends the run"
    )
    with contextlib.suppress(ChannelError):
        publish_stopped(plugin, cur, message)


def _at_exit(plugin: LaunchPlugin) -> None:
    if plugin.exit_code is not None:
        leave(plugin, plugin.exit_code)


def leave(plugin: LaunchPlugin, code: int, from_watchdog: bool = False) -> None:
    """Meet every rank one last time, then exit together.

    A non-zero code exits at once (``os._exit``): launchers stop the other ranks as soon as one
    exits non-zero, and torch's interpreter shutdown (~0.5 s) would let them be killed with
    SIGTERM instead of exiting with the same code; atexit handlers registered before pytest
    started (``coverage run``) then do not run. Code 0 exits normally.
    """
    with plugin.lock:
        if plugin.exiting:
            if from_watchdog:
                park()
            return
        plugin.exiting = True
    if plugin.watchdog is not None:
        plugin.watchdog.stop()
    channel = plugin.channel
    if channel is not None:
        with contextlib.suppress(ChannelError):
            channel.add("bye", 1)
            end = time.monotonic() + (2.0 if plugin.terminated else FINAL_WAIT)
            while channel.add("bye", 0) < plugin.world_size and time.monotonic() < end:
                time.sleep(0.01)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
        if plugin.log_stream is not None:
            plugin.log_stream.flush()
    if code != 0 or from_watchdog:
        os._exit(code)
    if "torch" in sys.modules:
        gc.freeze()  # spare the interpreter's final collection over torch's objects (~0.5 s)


def lost(plugin: LaunchPlugin, exc: ChannelError) -> None:
    """The control store is gone (rank 0 or the launcher's agent ended): nothing to report to."""
    message = f"distrank: {plugin.launch.label()}: lost the control channel: {exc}; exiting"
    plugin.log(message)
    print(message, file=sys.stderr, flush=True)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(LOST_EXIT)


def park() -> None:
    """Let another thread finish the process (it ends with ``os._exit``)."""
    while True:
        time.sleep(3600)
