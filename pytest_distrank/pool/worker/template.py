"""A rank template: a rank with pytest configured and no user code run, that forks fresh ranks.

Runs in the template process (a rank of a pool that serves no test, started by the fork server
like any rank) and, after each fork, in the new rank until it returns into its pytest session.
A test that must run on fresh ranks (``--distrank-isolate``, a class that asks for fresh ranks,
a replay, a harness test's fresh retry) costs a whole pytest start per rank when its ranks start
from nothing: the plugin manager, the entry points, every plugin's configure, the fixture
manager's walk over every plugin (~0.15 s of CPU a rank). A template has done all of that for
its rank, and nothing a user wrote runs in it: :class:`TemplatePlugin` keeps the conftest.py
files from loading (and their command-line options from parsing) and stops at the end of
``pytest_sessionstart``, before collection, having imported only the library modules its
first pool's files import (torch's distributed stack, PyTorch's test harness; as the fork server
does). Each fork then loads the conftests, parses their options, runs their ``pytest_configure``
and ``pytest_sessionstart``, collects its own pool's tests (by node id: :mod:`forkcollect`)
and joins its group, as a rank started afresh does: what a test module or a conftest does at
import or at the session's start is never shared between forks.

What a fork must not keep of its template, and what :func:`become` gives it anew, is listed in
:data:`NOT_INHERITED` (tests/e2e check each). The template reaps its children (SIGCHLD) and
writes each one's exit status into a pipe whose read end the controller holds
(pools/templates.py): the controller's sentinel, as multiprocessing's fork server does.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import signal
import sys
import time
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

import pytest

from ... import _compat
from ..protocol import STATUS_BYTES, Fork, Forked, PhaseFile, RankConfig, Ready, Shutdown
from ..workerinput import xdist_environ
from . import harnessenv
from .forkcollect import OnlyTheirTests, collection_args
from .rankfr import start_responder
from .rankpdb import Relay, install
from .rankproc import detach_from_controller_tree, rank_env

if TYPE_CHECKING:
    from .main import WorkerPlugin

#: What a rank forked from a template gets anew instead of inheriting it from the template.
NOT_INHERITED = (
    "pid, process group, parent-death signal and subreaper setting",
    "the pipe to the controller and the pool's phase array",
    "stdout and stderr (the new rank's log), pytest's fd capture (new temporary files) and "
    "the descriptor pytest's faulthandler plugin dumps to",
    "the rank's terminal report file, faulthandler's file and the flight-recorder thread",
    "the pool's environment variables (its tag, its store) and what it collects (its tests)",
    "pytest's basetemp (tmp_path), config.workerinput and the process's name",
    "SIGCHLD handling (the rank's own handler again) and its siblings' status pipes",
    "everything of the conftest.py files and test modules: a template loads and imports none",
)


def threads() -> int:
    """The process's threads, native ones included (``/proc/self/task``)."""
    return len(os.listdir("/proc/self/task"))


def unforkable(baseline: int) -> str:
    """Why this template must not fork ("" when it may): threads that its plugins started. A
    fork keeps only the forking thread: a lock another thread held stays locked in the child,
    and OpenMP's pool (a parallel torch op starts it) hangs the child's first parallel op."""
    grown = threads() - baseline
    if grown <= 0:
        return ""
    return (
        f"{grown} more thread{'s' if grown > 1 else ''} at the session's start than before it "
        "(a plugin started a thread or ran a parallel torch op): a fork would keep none of them"
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


class TemplatePlugin:
    """The template's hooks: no conftest.py loaded, forks served at the session's start."""

    def __init__(self, rank: WorkerPlugin) -> None:
        self.rank = rank
        #: Its threads before its pytest session: with more at the session's start it does not
        #: fork (:func:`unforkable`).
        self.threads_at_start = threads()
        #: The whole command line pytest parses (addopts included), conftest options too.
        self.args: list[str] = []
        self.noconftest = False
        #: What a fork collects; registered here, once: registering it in each fork (pytest
        #: looks for fixtures in every plugin it registers) cost each fork 1 ms of CPU.
        self.collection = OnlyTheirTests()

    @pytest.hookimpl(tryfirst=True)
    def pytest_load_initial_conftests(
        self, early_config: pytest.Config, parser: pytest.Parser, args: list[str]
    ) -> None:
        """No conftest loads here; the options only they know are left out of the template's
        parse (each fork parses the whole command line again once its conftests added them).
        pytest parses this same ``args`` list next."""
        namespace = early_config.known_args_namespace
        self.args, self.noconftest = list(args), namespace.noconftest
        namespace.noconftest = True
        unknown = set(parser.parse_known_and_unknown_args(list(args))[1])
        args[:] = [arg for arg in args if arg not in unknown]

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """The template is ready: serve forks. Returns only in a fork, which then loads its
        conftests and goes on to collect as a fresh rank."""
        rank = self.rank
        for name in rank.cfg.preload:  # library code its forks would each import (an RPC file's
            with contextlib.suppress(Exception):  # harness: ~0.3 s of CPU a rank)
                importlib.import_module(name)
        refuse = unforkable(self.threads_at_start)
        session.config.pluginmanager.register(self.collection, "distrank-fork-collection")
        rank.conn.send(Ready(rank.cfg.rank, os.getpid(), (), (), time.process_time()))
        become(rank, *fork_ranks(rank.conn, refuse))
        self.collection.aim(rank.cfg.nodeids)
        session.config.pluginmanager.unregister(self)
        self._load_conftests(session)

    def _load_conftests(self, session: pytest.Session) -> None:
        """What a rank started afresh did before its configure: its initial conftests, their
        options; then their ``pytest_configure`` and ``pytest_sessionstart``."""
        config = session.config
        before = set(vars(config.option))
        capman = config.pluginmanager.getplugin("capturemanager")
        config.known_args_namespace.noconftest = self.noconftest

        def parse_their_options() -> None:
            added = set(vars(config.option)) - before
            if added:
                parsed = _compat.config_parser(config).parse(self.args)  # a namespace of its own
                for dest in added:
                    setattr(config.option, dest, getattr(parsed, dest))

        if capman is not None:  # as pytest loads them: capturing their import-time output
            capman.resume_global_capture()
        try:
            new = _compat.load_conftests_late(config, parse_their_options)
        finally:
            if capman is not None:
                capman.suspend_global_capture()
        if new:
            old = [p for p in config.pluginmanager.get_plugins() if p not in new]
            config.pluginmanager.subset_hook_caller("pytest_sessionstart", old)(session=session)


def become(rank: WorkerPlugin, cfg: RankConfig, conn: Connection) -> None:
    """A fork of a template becomes a fresh rank of ``cfg``'s pool: what it must not keep of
    the template (:data:`NOT_INHERITED`) it gets anew here."""
    config = rank.config
    assert config is not None
    detach_from_controller_tree(os.getppid())  # its group, parent-death signal, subreaper
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:  # the template's capture files: give them back, take new ones
        capman.stop_global_capturing()
    sys.stdout.flush()
    sys.stderr.flush()
    rank.log_fd = os.open(cfg.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(rank.log_fd, 1)
    os.dup2(rank.log_fd, 2)
    _compat.point_faulthandler_plugin(config, rank.log_fd)
    if capman is not None:
        capman.start_global_capturing()
        capman.suspend_global_capture()
    # What the pool's variables change, and nothing else (what the plugins' imports set stays).
    old = {**rank_env(rank.cfg), **xdist_environ(rank.cfg.workerinput)}
    new = {**rank_env(cfg), **xdist_environ(cfg.workerinput)}
    for name in old.keys() - new.keys():
        os.environ.pop(name, None)
    os.environ.update({k: v for k, v in new.items() if old.get(k) != v})
    harnessenv.remember(cfg.env)
    start_responder(cfg.log_path)
    _compat.set_basetemp(config, str(cfg.cmdline.options["basetemp"]))
    if hasattr(config, "workerinput"):
        config.workerinput = cfg.workerinput
    config.args = collection_args(cfg.nodeids, cfg.files, str(config.rootpath))
    rank.files = frozenset(cfg.files)
    rank.real_files = frozenset(os.path.realpath(f) for f in cfg.files)
    rank.cfg, rank.conn, rank.pid = cfg, conn, os.getpid()
    multiprocessing.current_process().name = f"distrank-pool{cfg.pool_id}-rank{cfg.rank}"
    rank.phases = PhaseFile(cfg.phases_path)
    rank.relay = Relay(conn, cfg.rank, cfg.world_size)
    install(rank.relay)
    rank.redirect_terminal(config)
    rank.arm_faulthandler()
