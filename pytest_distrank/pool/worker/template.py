"""A rank template: a rank that configured pytest and collected, and forks fresh ranks (#40).

Runs in the template process (a rank of a pool that serves no test, started by the fork server
like any rank) and, after each fork, in the new rank until it returns into its pytest session.
A test that must run on fresh ranks (``--distrank-isolate``, a class that asks for fresh ranks,
a replay, a harness test's fresh retry) costs a pytest start and a collection per rank when its
ranks start from nothing; forked from a template that already has both, a fresh rank costs a
fork and the process group's start.

A template is exactly rank *r* of its kind of pool before its process group starts: its own
environment, command line and collection. What a fork must not keep of it, and what this module
(:func:`fork_ranks`) and :func:`become` give the child anew, is listed in
:data:`NOT_INHERITED` (tests/e2e check each).

The template reaps its children (SIGCHLD) and writes each one's exit status into a pipe whose
read end the controller holds (pools/templates.py): the controller's sentinel, as
multiprocessing's fork server does for its children.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any, Protocol

import pytest

from ... import _compat
from ..protocol import STATUS_BYTES, Fork, Forked, PhaseFile, RankConfig, Shutdown
from ..workerinput import xdist_environ
from . import harnessenv
from .rankfr import start_responder
from .rankpdb import Relay, install
from .rankproc import detach_from_controller_tree, rank_env


class Rank(Protocol):
    """What :func:`become` sets anew on the rank's worker plugin (main.WorkerPlugin)."""

    config: pytest.Config | None
    cfg: RankConfig
    conn: Connection
    pid: int
    log_fd: int
    phases: Any
    relay: Relay

    def redirect_terminal(self, config: pytest.Config) -> None: ...

    def arm_faulthandler(self) -> None: ...


#: What a rank forked from a template gets anew instead of inheriting it from the template.
NOT_INHERITED = (
    "pid, process group, parent-death signal and subreaper setting",
    "the pipe to the controller and the pool's phase array",
    "stdout and stderr (the new rank's log) and pytest's fd capture (new temporary files)",
    "the rank's terminal report file, faulthandler's file and the flight-recorder thread",
    "the pool's environment variables (its tag, its store; what imports set stays)",
    "pytest's basetemp (tmp_path), config.workerinput and the process's name",
    "SIGCHLD handling (the rank's own handler again) and its siblings' status pipes",
)


def threads() -> int:
    """The process's threads, native ones included (``/proc/self/task``)."""
    return len(os.listdir("/proc/self/task"))


def unforkable(baseline: int) -> str:
    """Why this template must not fork ("" when it may): threads that collection started. A
    fork keeps only the forking thread: a lock another thread held stays locked in the child,
    and OpenMP's pool (a module-level parallel torch op starts it) hangs the child's first
    parallel op."""
    grown = threads() - baseline
    if grown <= 0:
        return ""
    return (
        f"{grown} more thread{'s' if grown > 1 else ''} after collection than at its start "
        "(a parallel torch op or a thread started at import or collection): a fork would keep "
        "none of them"
    )


def fork_ranks(conn: Connection, refuse: str = "") -> tuple[RankConfig, Connection]:
    """Serve :class:`Fork` requests; return only in a new child, as (its config, its pipe).

    The template itself never returns: it exits on :class:`Shutdown` (once every child it
    forked is gone) or when the controller's pipe closes. With ``refuse``, it forks nothing
    and answers each request with why.
    """
    children: dict[int, int] = {}  # pid -> write end of its status pipe

    def reap(signum: int = 0, frame: object = None) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd = children.pop(pid, None)
            if fd is not None:
                code = os.waitstatus_to_exitcode(status)
                with contextlib.suppress(OSError):
                    os.write(fd, code.to_bytes(STATUS_BYTES, "little", signed=True))
                os.close(fd)

    theirs = signal.signal(signal.SIGCHLD, reap)  # a conftest's handler: its forks get it back
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(0)  # the controller is gone: so are the children (parent-death signal)
        if isinstance(message, Shutdown):
            while children:  # its children's pools stop first; their status must be written
                signal.sigtimedwait({signal.SIGCHLD}, 1.0)
                reap()
            os._exit(0)
        assert isinstance(message, Fork), message
        rank_fd = reduction.recv_handle(conn)
        status_fd = reduction.recv_handle(conn)
        if refuse:
            os.close(rank_fd)
            os.close(status_fd)
            conn.send(Forked(0, refuse))
            continue
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, theirs if theirs is not None else signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            conn.close()
            os.close(status_fd)
            for fd in children.values():
                os.close(fd)
            return message.cfg, Connection(rank_fd)
        children[pid] = status_fd
        os.close(rank_fd)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        reap()  # a child that died at once
        conn.send(Forked(pid))


def become(plugin: Rank, cfg: RankConfig, conn: Connection) -> None:
    """A fork of a template becomes a fresh rank of ``cfg``'s pool (``plugin``: the worker
    plugin of its pytest session): what it must not keep of the template (:data:`NOT_INHERITED`)
    it gets anew here."""
    config = plugin.config
    assert config is not None
    detach_from_controller_tree(os.getppid())  # its group, parent-death signal, subreaper
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:  # the template's capture files: give them back, take new ones
        capman.stop_global_capturing()
    sys.stdout.flush()
    sys.stderr.flush()
    plugin.log_fd = os.open(cfg.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(plugin.log_fd, 1)
    os.dup2(plugin.log_fd, 2)
    if capman is not None:
        capman.start_global_capturing()
    # What the pool's variables change, and nothing else: what the rank's own imports and
    # conftest set stays, as it would in a rank started afresh.
    old = {**rank_env(plugin.cfg), **xdist_environ(plugin.cfg.workerinput)}
    new = {**rank_env(cfg), **xdist_environ(cfg.workerinput)}
    for name in old.keys() - new.keys():
        os.environ.pop(name, None)
    os.environ.update({k: v for k, v in new.items() if old.get(k) != v})
    harnessenv.remember(cfg.env)
    start_responder(cfg.log_path)
    _compat.set_basetemp(config, str(cfg.cmdline.options["basetemp"]))
    if hasattr(config, "workerinput"):
        config.workerinput = cfg.workerinput
    plugin.cfg, plugin.conn, plugin.pid = cfg, conn, os.getpid()
    multiprocessing.current_process().name = f"distrank-pool{cfg.pool_id}-rank{cfg.rank}"
    plugin.phases = PhaseFile(cfg.phases_path)
    plugin.relay = Relay(conn, cfg.rank, cfg.world_size)
    install(plugin.relay)
    plugin.redirect_terminal(config)
    plugin.arm_faulthandler()
