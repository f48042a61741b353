"""Launcher mode, one rank's session: its control channel, folders, log, forks and exit.

Runs in every rank of a launched world. :class:`RankSession` is opened at configure time (main
thread) and lives until the process exits; the watchdog thread reads it, and may end the process
through :meth:`RankSession.leave`.

Folders: every rank of a run agrees on a run id (rank 0 makes it, the store carries it sealed with
the run's secret, :mod:`auth`, which :meth:`RankSession.open` obtains first), and uses
``<base>/distrank-<run id>/``. ``<base>`` is ``--basetemp`` when given (each rank's own basetemp
is then ``<basetemp>/rank<N>``), else ``pytest-of-<user>`` in pytest's temp root
(``PYTEST_DEBUG_TEMPROOT``, else the system temp folder), made and checked by pytest itself
(:func:`base_folder`: refused when another user owns it, as pytest refuses it). The run folder is
0700 and owned by this user (:func:`run_folder`); it holds ``rank<N>.log`` (0600: the terminal
report of ranks other than 0, with the tests' captured output; stack dumps) and ``shared/`` (the
``shared_tmp_path`` folders: shared by the ranks of one node, or of all nodes when ``<base>`` is
on a shared filesystem).

Which thread owns which field:

- set by :meth:`RankSession.open` before the watchdog starts, then only read: ``config``,
  ``launch``, ``rank``, ``world_size``, ``channel``, ``root``, ``log_path``, ``log_stream``,
  ``pid``, ``main_ident``;
- set by the main thread once the plan is known, then only read: ``pids``, ``logs``;
- ``forks``: the main thread (the at-fork hook runs in the thread that forks; tests fork there);
- ``terminated``: the main thread's SIGTERM handler;
- ``exiting`` under ``lock``: the first thread to set it (main thread or watchdog) is the one
  that exits; ``exit_code`` is written only by that thread, or by the main thread at session
  finish, before it leaves;
- ``stopping``: set by :meth:`RankSession.leave`; the watchdog ends when it is set.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import gc
import os
import signal
import stat
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, NoReturn, TextIO

import pytest
from pytest import TestReport

from .. import _compat
from ..rank.hygiene import cap_section, stray_forks
from . import gaveup, keys
from .auth import AuthError, obtain
from .channel import HEARTBEAT_STALE, LOST_EXIT, Channel, ChannelError, Forged
from .env import Launch

#: Bound on connecting to the control store and agreeing on the run id.
CONNECT_TIMEOUT = 120.0
#: Bound on the final meeting of all ranks before they exit together.
FINAL_WAIT = 30.0
#: Bound on a forked process's own connection to the control store, and on what it sends there.
FORK_CONNECT = 10.0
#: Bound on reaping a forked process after SIGKILL.
REAP_WAIT = 2.0
#: How long a rank looks again at a run id that does not verify (see :func:`_agree_run_id`).
RUN_VERIFY = 15.0


class RankSession:
    """One rank of a launched world, from configure time to its exit (see the module docstring
    for which thread owns which field)."""

    def __init__(self, config: pytest.Config, launch: Launch, channel: Channel, root: Path) -> None:
        self.config = config
        self.launch = launch
        self.rank = launch.rank
        self.world_size = launch.world_size
        self.channel = channel
        self.root = root
        #: The run's id, which rank 0 made and the control store carried to every rank.
        self.run_id = root.name.removeprefix("distrank-")
        self.log_path = str(root / f"rank{self.rank}.log")
        self.log_stream: IO[str] | None = None
        #: This rank's own pid: a process the test forked has another.
        self.pid = os.getpid()
        self.main_ident = threading.get_ident()
        #: The ranks' pids and ``host:path`` of their logs, by rank (from rank 0's plan).
        self.pids: tuple[int, ...] = ()
        self.logs: dict[int, str] = {}
        #: Forks made during the running test (os.register_at_fork): only then are they looked for.
        self.forks = 0
        self.terminated = False
        self.lock = threading.Lock()
        self.exiting = False
        self.exit_code: int | None = None
        self.stopping = threading.Event()
        #: A sub-world's view (:meth:`view`): the launched ranks of its members, by its rank.
        self.members: tuple[int, ...] = ()

    def view(self, members: tuple[int, ...]) -> RankSession:
        """This rank as a member of the sub-world ``members`` (launched ranks, by sub-world
        rank) sees it: its rank, size, peers' pids and logs are the sub-world's; everything else
        (the channel, the lock, the log) is this session's. Gathering, early failures, stacks and
        the deadlock watch run on a view unchanged: their keys name the test, so two sub-worlds
        running at once never share one."""
        view = copy.copy(self)
        view.members = members
        view.rank = members.index(self.rank) if self.rank in members else -1  # rank 0's look
        view.world_size = len(members)
        view.pids = tuple(self.pids[r] if r < len(self.pids) else 0 for r in members)
        view.logs = {i: self.logs.get(r, "?") for i, r in enumerate(members)}
        return view

    def launched_rank(self, rank: int) -> int:
        """The launched rank of this view's ``rank``."""
        return self.members[rank] if self.members else rank

    @classmethod
    def open(cls, config: pytest.Config, launch: Launch) -> RankSession:
        """Check the temp folder, connect, agree on the run's folder, quiet ranks other than 0."""
        try:
            # Before connecting: a refused folder ends every rank of the node at once.
            base = base_folder(config)
        except OSError as exc:
            raise pytest.UsageError(_folder_error(launch, exc)) from None
        try:
            auth = obtain(launch, base, os.environ)
        except (AuthError, OSError) as exc:
            raise pytest.UsageError(
                f"pytest-distrank: {launch.label()} has no secret for the control store: {exc}"
            ) from None
        try:
            channel = Channel(launch, CONNECT_TIMEOUT, auth)
            run_id = _agree_run_id(launch, channel)
        except ChannelError as exc:
            if launch.rank == 0:
                auth.forget()
            raise pytest.UsageError(str(exc)) from None
        for name, value in launch.rank_env().items():
            os.environ.setdefault(name, value)
        try:
            root = run_folder(base, run_id)
        except OSError as exc:
            raise pytest.UsageError(_folder_error(launch, exc)) from None
        self = cls(config, launch, channel, root)
        if config.option.basetemp:
            # The ranks of one node share the command line: each gets a basetemp of its own
            # under it (pytest empties a given basetemp, which must not happen under a peer's
            # feet).
            _compat.set_given_basetemp(config, base / f"rank{self.rank}")
        if self.rank != 0:
            self._quiet()
        os.register_at_fork(after_in_parent=self._note_fork)
        atexit.register(self._at_exit)
        if self.rank == 0 and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def _quiet(self) -> None:
        """Ranks other than 0: terminal report to the log, one line on stdout, no junit or
        cache."""
        config = self.config
        stream = open_log(self.log_path, append=False)
        self.log_stream = stream
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if _compat.can_redirect_terminal(reporter):
            _compat.redirect_terminal(reporter, stream)
        print(f"distrank: {self.launch.label()}: report on rank 0; log in {self.log_path}")
        sys.stdout.flush()
        _compat.drop_junit_xml(config)  # one junit file, written by rank 0
        cache = getattr(config, "cache", None)
        if cache is not None:
            # lastfailed/nodeids are rank 0's to write; N ranks writing one cache folder race.
            setattr(cache, "set", lambda key, value: None)  # noqa: B010

    def _note_fork(self) -> None:
        self.forks += 1

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.terminated = True
        raise KeyboardInterrupt(
            f"pytest-distrank: {self.launch.label()} got SIGTERM: the launcher is stopping this "
            "rank (typically because another rank exited or crashed; the launcher's output says "
            "which)"
        )

    def log(self, text: str) -> None:
        """A line in this rank's own report (its log file; rank 0: stderr)."""
        stream = self.log_stream if self.log_stream is not None else sys.stderr
        with contextlib.suppress(OSError, ValueError):
            stream.write(text.rstrip("\n") + "\n")
            stream.flush()

    # -- reports on the wire -------------------------------------------------------------------

    def serialize(self, report: TestReport) -> dict[str, Any]:
        """pytest's own serialization (as pytest-xdist ships reports), huge sections cut."""
        config = self.config
        report.sections = [(title, cap_section(content)) for title, content in report.sections]
        data: dict[str, Any] = config.hook.pytest_report_to_serializable(
            config=config, report=report
        )
        return data

    def deserialize(self, data: dict[str, Any]) -> TestReport:
        """The inverse of :meth:`serialize`, after a trip through JSON (which makes tuples
        lists: a skip's ``longrepr`` must be a tuple again)."""
        for key in ("longrepr", "location"):
            if isinstance(data.get(key), list):
                data[key] = tuple(data[key])
        data["user_properties"] = [tuple(p) for p in data.get("user_properties", [])]
        report = self.config.hook.pytest_report_from_serializable(config=self.config, data=data)
        assert isinstance(report, TestReport)
        return report

    # -- processes the test forked -------------------------------------------------------------

    def leave_if_fork(self, index: int, nodeid: str) -> None:
        """In a process the test forked that came back into the rank's code: say so, and leave.

        It must not run the rank's next steps (its reports, the next test's collectives on the
        rank's group, the rank's control connection): it sends its identity over a connection
        of its own (``stray/<test>/<rank>``, which rank 0 reads after the test and fails it
        with), then ``os._exit(0)`` without the rank's cleanup. No-op in the rank process itself.
        """
        if os.getpid() == self.pid:
            return
        with contextlib.suppress(BaseException):
            channel = self.channel.for_fork(FORK_CONNECT)
            channel.put(keys.stray(index, self.rank), keys.identity(index, nodeid))
            channel.add(keys.stray_count(index), 1)
        os._exit(0)

    def end_forks(self) -> tuple[int, ...]:
        """Processes the test forked that still run the rank's own code: found, killed, reaped.

        Looked for only when the test forked (``os.register_at_fork``). Such a process would run
        the rest of the test again, and its collectives would go through the rank's own group.
        """
        if not self.forks:
            return ()
        self.forks = 0
        found = stray_forks(self.pid)
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + REAP_WAIT
        for pid in found:
            while time.monotonic() < end:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        break
                except ChildProcessError:
                    break
                time.sleep(0.01)
        return found

    # -- the end -------------------------------------------------------------------------------

    def adopt_exit_code(
        self, session: pytest.Session, exitstatus: int, wait: Callable[[list[str]], str]
    ) -> None:
        """Rank 0 publishes its exit code; the others wait for it (with ``wait``, which answers
        rank 0's questions meanwhile) and make it theirs."""
        if self.rank == 0:
            self.exit_code = int(exitstatus)
            with contextlib.suppress(ChannelError):
                self.channel.put(keys.EXIT, self.exit_code)
            return
        try:
            wait([keys.EXIT])
            code = self.channel.get(keys.EXIT, keys.read_exit)
        except ChannelError as exc:
            self.log(f"pytest-distrank: {self.launch.label()}: no exit code from rank 0 ({exc})")
            gaveup.note(self.channel, self.rank, exc, HEARTBEAT_STALE)
            code = LOST_EXIT
        self.exit_code = code
        session.exitstatus = code
        self.log(f"distrank: {self.launch.label()}: exit code {code} (rank 0's)")

    def _at_exit(self) -> None:
        if self.rank == 0:
            self.channel.auth.forget()
        if self.exit_code is not None:
            self.leave(self.exit_code)

    def leave(self, code: int, from_watchdog: bool = False) -> None:
        """Meet every rank one last time, then exit together.

        A non-zero code exits at once (``os._exit``): launchers stop the other ranks as soon as
        one exits non-zero, and torch's interpreter shutdown (~0.5 s) would let them be killed
        with SIGTERM instead of exiting with the same code; atexit handlers registered before
        pytest started (``coverage run``) then do not run. Code 0 exits normally.
        """
        with self.lock:
            if self.exiting:
                if from_watchdog:
                    park()
                return
            self.exiting = True
            self.exit_code = code
        self.stopping.set()
        channel = self.channel
        with contextlib.suppress(ChannelError):
            channel.add(keys.BYE, 1)
            end = time.monotonic() + (2.0 if self.terminated else FINAL_WAIT)
            while channel.add(keys.BYE, 0) < self.world_size and time.monotonic() < end:
                time.sleep(0.01)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
            if self.log_stream is not None:
                self.log_stream.flush()
        if code != 0 or from_watchdog:
            os._exit(code)
        if "torch" in sys.modules:
            gc.freeze()  # spare the interpreter's final collection over torch's objects (~0.5 s)

    def lost(self, exc: ChannelError) -> NoReturn:
        """The control store is gone (rank 0 or the launcher's agent ended): nothing to report
        to."""
        message = (
            f"pytest-distrank: {self.launch.label()}: lost the control channel: {exc}; exiting"
        )
        self.log(message)
        print(message, file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        gaveup.note(self.channel, self.rank, exc, HEARTBEAT_STALE, absent=True)  # rank 0 may wake
        self.exiting = True  # nothing else to tell (liveness.hook_exit)
        os._exit(LOST_EXIT)


def _agree_run_id(launch: Launch, channel: Channel) -> str:
    """Rank 0 draws the run id; the others read it, and from then on every MAC covers it.

    The run id is sealed with an empty run (it is what is being agreed). A rank whose read does
    not verify looks again for ``RUN_VERIFY`` seconds (rank 0 overwrites a value someone else set
    first; a secret file of an earlier launch, read before rank 0 replaced it, is read again).
    """
    auth = channel.auth
    if launch.rank == 0:
        run_id = uuid.uuid4().hex[:12]
        channel.put(keys.RUN, run_id)
        auth.run = run_id
        return run_id
    if channel.wait_any([keys.RUN], time.monotonic() + CONNECT_TIMEOUT) is None:
        raise ChannelError(
            f"pytest-distrank: {launch.label()} reached the control store, but rank 0 "
            f"did not register this run within {CONNECT_TIMEOUT:.0f} s; did rank 0 start "
            "pytest with -p distrank (and the same --distrank-launcher)?"
        )
    end = time.monotonic() + RUN_VERIFY
    while True:
        try:
            auth.run = channel.get(keys.RUN, keys.read_run)
            return auth.run
        except Forged as exc:
            if time.monotonic() >= end:
                raise ChannelError(f"pytest-distrank: {launch.label()}: {exc}") from None
        auth.reread()
        time.sleep(0.05)


def base_folder(config: pytest.Config) -> Path:
    """Where the run folder goes: ``--basetemp`` (made 0700 when missing), else pytest's own
    ``pytest-of-<user>``, made and checked by pytest (:func:`_compat.user_temp_root`). OSError
    when it cannot be used (pytest's message for a folder another user owns)."""
    given = config.option.basetemp
    if not given:
        return _compat.user_temp_root(config)
    base = Path(os.path.abspath(str(given)))
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    return base


def run_folder(base: Path, run_id: str) -> Path:
    """``<base>/distrank-<run id>``, 0700 whatever the umask: made by the first rank of a node (or
    of all nodes, on a shared filesystem), found by the others. OSError unless it is a folder this
    user owns (not a link)."""
    root = base / f"distrank-{run_id}"
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o700)
    info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise OSError(f"{root} is not a folder owned by the current user")
    return root


def open_log(path: str, append: bool) -> TextIO:
    """A rank's log, created 0600 whatever the umask (it holds the tests' captured output); never
    through a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    return open(fd, "a" if append else "w", encoding="utf-8", buffering=1)


def _folder_error(launch: Launch, exc: OSError) -> str:
    return (
        f"pytest-distrank: {launch.label()} cannot use its temporary folder: {exc}\n"
        "Name another one with --basetemp=DIR, or set TMPDIR to a folder of your own."
    )


def park() -> NoReturn:
    """Let another thread finish the process (it ends with ``os._exit``)."""
    while True:
        time.sleep(3600)
