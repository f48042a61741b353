"""The rank side: one rank process of a pool, serving "run this test" from the controller.

Runs in each rank process (started by the fork server, or spawned). Depends on nothing else of
the plugin except :mod:`protocol`, :mod:`reaper`, :mod:`stacks` (stdlib only) and the rank-only
:mod:`ranklogs`. A rank process:

1. detaches from the fork server (so it dies with the controller: the fork server's alive pipe would
   keep it up), moves into its own process group (Ctrl-C is the controller's to handle), sends its
   output to a per-rank log;
2. runs its own pytest session over the files that hold its pool's tests, with arguments the
   controller built (``-p distrank``, the controller's rootdir, ``-o addopts=`` ...);
3. after collection, connects to the controller's store once, initialises the process group once,
   calls ``pytest_distrank_rank_setup`` and says :class:`~protocol.Ready`;
4. serves :class:`~protocol.RunTest` messages by running the test's real pytest protocol, and
   sends its phase reports, serialized by pytest's own hooks;
5. on :class:`~protocol.Shutdown` (or when the controller's end of the pipe closes) tears down what
   is left and leaves with ``os._exit``: torch's interpreter shutdown costs ~0.5 s.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import faulthandler
import importlib
import os
import pickle
import signal
import sys
import traceback
import warnings
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _pytest._io import TerminalWriter

from . import ranklogs, reaper
from .protocol import (
    Collectives,
    CountCollectives,
    Fatal,
    PassedPhase,
    Phase,
    RankConfig,
    Ready,
    Reports,
    RunTest,
    Shutdown,
    Stopped,
    WarningRecord,
    compact_passed,
    phase_slots,
)
from .stacks import interruption_message

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

#: Set to a folder to write a cProfile dump of every rank's pytest session there (bench/ uses it).
PROFILE_ENV = "DISTRANK_PROFILE_RANKS"
#: Plugins that act on the whole test in the controller and must not act again in a rank:
#: pytest-rerunfailures would rerun a test on one rank alone (flaky marker), out of step with
#: its peers' collectives.
CONTROLLER_ONLY_PLUGINS = ("rerunfailures",)
#: Signal on which every rank dumps the stacks of all its threads into its log.
DUMP_SIGNAL = signal.SIGUSR1
_PR_SET_PDEATHSIG = 1
STORE_TIMEOUT = timedelta(seconds=300)
MASTER_ADDR = "127.0.0.1"
#: The port of the store rank 0 serves for the plugin (MASTER_PORT, unless a test changed it).
PLUGIN_PORT_ENV = "DISTRANK_MASTER_PORT"
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
#: Captured output sections longer than this are cut to their head and tail before sending.
SECTION_LIMIT = 256 * 1024


@dataclasses.dataclass
class RankContext:
    """What the fixtures of a rank process read: who this rank is, its store and group."""

    cfg: RankConfig
    store: Any
    pg: Any | None
    test: RunTest = dataclasses.field(default_factory=lambda: RunTest(-1, "", None, ""))
    #: On rank 0: the TCPStore server behind MASTER_PORT (kept alive while it is in use).
    master_server: Any = None

    @property
    def rank(self) -> int:
        return self.cfg.rank

    @property
    def world_size(self) -> int:
        return self.cfg.world_size

    @property
    def local_rank(self) -> int:
        return self.cfg.local_rank

    @property
    def backend(self) -> str:
        return self.cfg.backend

    def device(self) -> torch.device:
        import torch

        if "nccl" in self.cfg.backend:
            return torch.device("cuda", self.cfg.local_rank)
        return torch.device("cpu")

    def test_store(self) -> dist.Store:
        import torch.distributed as dist

        return dist.PrefixStore(f"test{self.test.index}/", self.store)


RANK_CONTEXT = pytest.StashKey[RankContext]()


def _detach_from_controller_tree(expected_parent: int) -> None:
    """Die with the controller, and keep Ctrl-C out.

    The fork server hands every child a copy of the write end of its "alive" pipe; while a rank
    holds it, the fork server never sees the controller die. Close it, and ask the kernel to
    SIGKILL this rank when its parent (the fork server, or the controller under spawn) dies.
    """
    from multiprocessing import forkserver

    server: Any = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != expected_parent:
        os._exit(1)  # the parent died before prctl took effect
    reaper.become_subreaper()  # orphans of what the tests start stay findable (reaper.py)
    # Own process group: the terminal's SIGINT goes to the controller only, and the controller
    # can kill this rank together with any processes it starts.
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)


def _rank_env(cfg: RankConfig) -> dict[str, str]:
    env = dict(cfg.env)
    env.pop("PYTEST_ADDOPTS", None)
    env.update(
        RANK=str(cfg.rank),
        WORLD_SIZE=str(cfg.world_size),
        LOCAL_RANK=str(cfg.local_rank),
        LOCAL_WORLD_SIZE=str(cfg.world_size),
        GROUP_RANK="0",
        ROLE_RANK=str(cfg.rank),
        ROLE_WORLD_SIZE=str(cfg.world_size),
        MASTER_ADDR=MASTER_ADDR,
        # MASTER_PORT is set once rank 0 hosts a store (see _master_store). torchrun's convention:
        # the store at MASTER_ADDR:MASTER_PORT is hosted by someone else (here: a TCPStore that
        # rank 0 serves beside its test code), so every rank is a client (else rank 0 would try
        # to host a second store on the port).
        TORCHELASTIC_USE_AGENT_STORE="True",
        TORCHELASTIC_RESTART_COUNT="0",
        DISTRANK_RANK=str(cfg.rank),
    )
    env[reaper.POOL_TAG_ENV] = cfg.store_path  # unique per pool: see reaper.py
    return env


def rank_main(cfg: RankConfig, conn: Connection, phases: Any, parent_pid: int) -> None:
    """Entry point of a rank process. Never returns: ends with ``os._exit``."""
    code = 0
    try:
        _detach_from_controller_tree(parent_pid)
        log_fd = os.open(cfg.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.clear()
        os.environ.update(_rank_env(cfg))
        ranklogs.install()  # pytest's log capture without its per-phase handler churn
        plugin = WorkerPlugin(cfg, conn, phases, log_fd)
        plugin.coverage = _start_coverage(cfg.coverage)
        profile_dir = os.environ.get(PROFILE_ENV)
        if profile_dir:  # a developer's tool: where does a rank's time go?
            import cProfile

            profiler = cProfile.Profile()
            exit_code = profiler.runcall(pytest.main, list(cfg.pytest_args), plugins=[plugin])
            profiler.dump_stats(os.path.join(profile_dir, f"pool{cfg.pool_id}-rank{cfg.rank}.prof"))
        else:
            exit_code = pytest.main(list(cfg.pytest_args), plugins=[plugin])
        if not plugin.served:
            conn.send(Fatal(cfg.rank, _early_exit_message(cfg, exit_code)))
            code = 3
        elif not plugin.stopped and os.getpid() == plugin.pid:
            # The session ended while serving: pytest.exit() or KeyboardInterrupt in a test.
            why = plugin.interrupted or f"its pytest session ended (exit code {exit_code})"
            conn.send(Fatal(cfg.rank, why))
            code = 4
    except BaseException:
        with contextlib.suppress(BaseException):
            conn.send(Fatal(cfg.rank, traceback.format_exc()))
        code = 2
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
            conn.close()
        os._exit(code)


def _early_exit_message(cfg: RankConfig, exit_code: object) -> str:
    return (
        f"its pytest session ended before serving tests (exit code {exit_code}); "
        "typically a conftest.py or plugin that fails only inside ranks."
    )


class WorkerPlugin:
    """The pytest plugin that turns a rank's pytest session into a server of tests."""

    def __init__(self, cfg: RankConfig, conn: Connection, phases: Any, log_fd: int) -> None:
        self.cfg = cfg
        self.conn = conn
        self.phases = phases
        self.log_fd = log_fd
        self.served = False
        #: Set when the controller's Shutdown was served (the session ended as asked).
        self.stopped = False
        #: Why the rank's session was interrupted (pytest.exit, KeyboardInterrupt in a test).
        self.interrupted: str | None = None
        #: The rank's own pid; a process forked by a test has another.
        self.pid = os.getpid()
        #: The running test's warnings (protocol.WarningRecord), sent with its last reports.
        self.warnings: list[WarningRecord] = []
        #: Forks made by the running test (os.register_at_fork): only then are children looked at.
        self.forks = 0
        os.register_at_fork(after_in_parent=self._note_fork)
        self.files = frozenset(cfg.files)
        self.real_files = frozenset(os.path.realpath(f) for f in cfg.files)
        self.pending: list[dict[str, Any] | PassedPhase] = []
        self.collect_errors: list[str] = []
        self.config: pytest.Config | None = None
        self.ctx: RankContext | None = None
        #: A ``coverage.Coverage`` measuring this rank when pytest-cov measures the controller.
        self.coverage: Any = None

    def _arm_faulthandler(self) -> None:
        """Crash tracebacks and the stack-dump signal go to the rank's log (a few us)."""
        faulthandler.enable(file=self.log_fd, all_threads=True)
        faulthandler.register(DUMP_SIGNAL, file=self.log_fd, all_threads=True, chain=False)

    def _note_fork(self) -> None:
        self.forks += 1

    def _phase(self, phase: Phase, index: int | None = None) -> None:
        if os.getpid() != self.pid:
            return  # a fork of the test: the shared array is the rank's, not its own
        phase_slot, index_slot = phase_slots(self.cfg.rank)
        if index is not None:
            self.phases[index_slot] = index  # first: the phase below belongs to this test
        self.phases[phase_slot] = int(phase)

    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        self.config = config
        for name in CONTROLLER_ONLY_PLUGINS:
            # Configured (its markers are known) but never called: the controller owns it.
            if config.pluginmanager.get_plugin(name) is not None:
                config.pluginmanager.unregister(name=name)
        # The rank's own terminal report (progress letters, its session summary) goes to a file
        # beside the rank's log, so that the log holds only what the test itself wrote and
        # faulthandler's dumps: the excerpts shown for a crash stay readable.
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and hasattr(reporter, "_tw"):
            path = self.cfg.log_path.removesuffix(".log") + ".pytest.log"
            stream = open(path, "a", encoding="utf-8", buffering=1)
            reporter._tw = TerminalWriter(stream)

    @pytest.hookimpl(tryfirst=True)
    def pytest_ignore_collect(self, collection_path: Path) -> bool | None:
        """Skip the other files of a folder the rank collects a pool file from.

        pytest collects a file argument through its folder, making a collector for every file
        beside it: 200 unrelated test files cost a rank ~0.05 s of start-up. Folders, conftest.py
        and __init__.py are left to pytest.
        """
        if (
            not self.files
            or collection_path.name in ("conftest.py", "__init__.py")
            or str(collection_path) in self.files
            or collection_path.is_dir()
            or os.path.realpath(collection_path) in self.real_files
        ):
            return None
        return True

    @pytest.hookimpl
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.collect_errors.append(f"{report.nodeid or '<session>'}: {report.longrepr}")

    @pytest.hookimpl
    def pytest_warning_recorded(
        self, warning_message: warnings.WarningMessage, when: str, nodeid: str
    ) -> None:
        """Keep the test's warnings for the controller's warnings summary."""
        if when != "runtest":
            return
        category = warning_message.category
        self.warnings.append(
            (
                category.__module__,
                category.__qualname__,
                str(warning_message.message),
                str(warning_message.filename),
                int(warning_message.lineno or 0),
            )
        )

    @pytest.hookimpl
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        """pytest.exit() or KeyboardInterrupt ends the rank's session: say which, and where."""
        test = self.ctx.test.nodeid if self.ctx is not None else "?"
        self.interrupted = interruption_message(excinfo.value, test)

    @pytest.hookimpl(optionalhook=True)
    def pytest_timeout_set_timer(self, item: pytest.Item) -> bool:
        """The controller owns every distributed test's deadline; no timer inside ranks."""
        return True

    @pytest.hookimpl(optionalhook=True)
    def pytest_timeout_cancel_timer(self, item: pytest.Item) -> bool:
        return True

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self._phase(Phase.SETUP)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        self._phase(Phase.CALL)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        self._phase(Phase.TEARDOWN)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        assert self.config is not None
        if report.when == "teardown":
            self._phase(Phase.FINISHED)  # what runs now is protocol wrappers, then the send
        compact = compact_passed(report)
        if compact is not None:
            self.pending.append(compact)
            return
        report.sections = [(title, cap_section(content)) for title, content in report.sections]
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        self.pending.append(data)
        if report.failed:
            # Send a failure at once: the controller starts the peers' grace period from it.
            self._flush(done=False)

    def _flush(
        self,
        done: bool,
        pg_problem: str = "",
        sequence: dict[str, int] | None = None,
        forks: tuple[int, ...] = (),
    ) -> None:
        assert self.ctx is not None
        pending, self.pending = self.pending, []
        test = self.ctx.test

        def message() -> Reports:
            pid = os.getpid()  # at send time: a fork of the test sends its own pid
            return Reports(
                self.cfg.rank,
                test.index,
                test.nodeid,
                pid,
                tuple(pending),
                done,
                pg_problem,
                sequence or {},
                forks,
                tuple(self.warnings) if done else (),
            )

        try:
            self.conn.send(message())
        except (pickle.PicklingError, TypeError, AttributeError):
            # Reports are plain data except what tests put in user_properties (record_property
            # accepts any object): send those as their repr.
            for data in pending:
                if not isinstance(data, dict):
                    continue
                data["user_properties"] = [
                    (str(name), repr(value)) for name, value in data.get("user_properties", [])
                ]
            self.conn.send(message())

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        config = session.config
        self._arm_faulthandler()
        items = {item.nodeid: item for item in session.items}
        missing = tuple(n for n in self.cfg.nodeids if n not in items)
        try:
            self.ctx = _start_rank(self.cfg)
            config.stash[RANK_CONTEXT] = self.ctx
            config.hook.pytest_distrank_rank_setup(
                config=config, rank=self.cfg.rank, world_size=self.cfg.world_size
            )
        except BaseException:
            self.served = True  # the Fatal below says it all
            self.conn.send(Fatal(self.cfg.rank, "start-up failed:\n" + traceback.format_exc()))
            raise
        self.served = True
        self._phase(Phase.IDLE)
        self.conn.send(Ready(self.cfg.rank, os.getpid(), missing, tuple(self.collect_errors)))
        while True:
            if os.getpid() != self.pid:
                # A process the test forked came back into the rank's loop (its reports went
                # out with its own pid, which fails the test): it must not take the rank's
                # messages. Leave at once, without the rank's cleanup.
                os._exit(0)
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                os._exit(1)  # the controller is gone; nothing to report to
            if isinstance(message, Shutdown):
                self._stop(session)
                self.stopped = True
                return True
            if isinstance(message, CountCollectives):
                self.conn.send(Collectives(self.cfg.rank, os.getpid(), collective_counts()))
                continue
            assert isinstance(message, RunTest)
            self._run(items, message)

    def _run(self, items: dict[str, pytest.Item], message: RunTest) -> None:
        assert self.ctx is not None
        item = items[message.nodeid]
        nextitem = items.get(message.next_nodeid) if message.next_nodeid else None
        self.ctx.test = message
        self._phase(Phase.RECEIVED, message.index)
        teardown_unneeded(item)
        if not self.cfg.init_process_group:
            # A fresh env:// rendezvous for every test: init_process_group() keys never collide.
            _master_store(self.ctx, f"test{message.index}/")
        self.forks = 0
        self.warnings = []
        self._arm_faulthandler()  # a test may have disabled it: a crash must leave its stack
        item.ihook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if os.getpid() != self.pid:
            self._flush(done=True)  # a fork of the test: its reports carry its own pid
            return
        self._phase(Phase.FINISHED)
        problem = _group_problem(self.ctx)
        healthy = not problem
        self._flush(
            done=True,
            pg_problem=problem,
            sequence=sequence_numbers() if healthy else {},
            forks=stray_forks(self.pid) if self.forks else (),
        )
        self._phase(Phase.IDLE)

    def _stop(self, session: pytest.Session) -> None:
        self._phase(Phase.STOPPING)
        errors: list[str] = []
        try:
            session._setupstate.teardown_exact(None)
        except BaseException as exc:
            errors.append("".join(traceback.format_exception(exc)))
        if self.coverage is not None:
            # Saved before Stopped: the controller's pytest-cov combines the data files as soon
            # as the pools have stopped.
            try:
                self.coverage.stop()
                self.coverage.save()
            except Exception as exc:
                errors.append(f"saving coverage data failed: {exc!r}")
        # What the tests started and left running ends with the rank, adopted orphans too.
        reaper.kill_all(reaper.descendants([os.getpid()]))
        reaper.reap_children()
        self.conn.send(Stopped(self.cfg.rank, tuple(errors)))


def _start_coverage(settings: dict[str, Any] | None) -> Any:
    """Measure this rank like the controller's pytest-cov does (see rankargs.coverage_settings).

    Started before the rank's pytest session, so conftest files and test modules imported in
    the rank count. Modules the fork server preloaded were imported before: their import-time
    lines are not measured here (the controller imports them too).
    """
    if not settings:
        return None
    import coverage

    options = dict(settings)
    topdir = options.pop("topdir")
    cwd = os.getcwd()
    os.chdir(topdir)  # relative source and config paths mean what they mean to pytest-cov
    try:
        cov = coverage.Coverage(data_suffix=True, **options)
    finally:
        os.chdir(cwd)
    cov.set_option(
        "run:disable_warnings",
        ["no-data-collected", "module-not-measured", "module-not-imported"],
    )
    cov.start()
    return cov


def teardown_unneeded(item: pytest.Item) -> None:
    """Close modules and classes the previous test left set up that this one does not need.

    The controller names each test's successor in its pool, so pytest's own teardown normally
    did this already; when the order is not known in advance (pytest-xdist schedules tests as it
    goes) the prediction can be wrong, and pytest's SetupState would refuse the next setup.
    """
    state = item.session._setupstate
    needed = set(item.listchain())
    if all(node in needed for node in state.stack):
        return
    try:
        state.teardown_exact(item)
    except BaseException:
        print(
            f"pytest-distrank: error tearing down fixtures before {item.nodeid}:\n"
            + traceback.format_exc(),
            file=sys.stderr,
            flush=True,
        )


def cap_section(content: str) -> str:
    """Keep the head and tail of a huge captured section (tens of MB help nobody)."""
    if len(content) <= SECTION_LIMIT:
        return content
    half = SECTION_LIMIT // 2
    cut = len(content) - 2 * half
    return f"{content[:half]}\n[... pytest-distrank cut {cut} characters ...]\n{content[-half:]}"


def _start_rank(cfg: RankConfig) -> RankContext:
    """Open the pool's store once, initialise the process group once."""
    import torch.distributed as dist

    store = dist.FileStore(cfg.store_path, cfg.world_size)
    ctx = RankContext(cfg, store, None)
    _master_store(ctx, "pool/")
    if cfg.init_process_group:
        device_id = None
        if "nccl" in cfg.backend:
            import torch

            torch.cuda.set_device(cfg.local_rank)
            # Bound to its GPU: collectives such as barrier() need not guess the device.
            device_id = torch.device("cuda", cfg.local_rank)
        dist.init_process_group(
            cfg.backend,
            store=store,
            rank=cfg.rank,
            world_size=cfg.world_size,
            device_id=device_id,
        )
        ctx.pg = dist.group.WORLD
    return ctx


def _master_store(ctx: RankContext, prefix: str) -> None:
    """Serve a TCPStore on rank 0 (port 0, chosen by the kernel) and export it as MASTER_PORT.

    The port travels to the other ranks through the pool's FileStore, so nobody guesses a free
    port. Code that reads MASTER_ADDR/MASTER_PORT, and ``init_process_group()`` with env://, find
    a live store there.
    """
    import torch.distributed as dist

    key = f"{prefix}master_port"
    if ctx.rank == 0:
        ctx.master_server = None  # drop the previous test's server first
        ctx.master_server = dist.TCPStore(
            MASTER_ADDR, 0, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT
        )
        port = str(ctx.master_server.port)
        ctx.store.set(key, port)
    else:
        port = ctx.store.get(key).decode()
    os.environ["MASTER_PORT"] = port
    os.environ[PLUGIN_PORT_ENV] = port
    _scope_agent_store()


def _scope_agent_store() -> None:
    """Make ``TORCHELASTIC_USE_AGENT_STORE=True`` hold for the plugin's store only.

    torchrun's convention (every rank, rank 0 included, is a client of the store at
    MASTER_ADDR:MASTER_PORT, else rank 0 hosts a second store there) is right for the store rank 0
    serves here, but torch applies it to every ``tcp://`` and ``env://`` rendezvous of the process:
    a test's own ``tcp://127.0.0.1:<its port>`` rendezvous then hangs, since no rank hosts that
    store. The variable stays in the environment (code that reads it sees torchrun's value); around
    the store creation of a rendezvous to any other port it is lifted. Wraps torch's registered
    handlers (a private table of ``torch.distributed.rendezvous``); installed once per rank.
    """
    module = importlib.import_module("torch.distributed.rendezvous")
    handlers = getattr(module, "_rendezvous_handlers", None)
    if not isinstance(handlers, dict):
        return
    for scheme in ("tcp", "env"):
        original = handlers.get(scheme)
        if original is None or getattr(original, "_distrank_scoped", False):
            continue
        handlers[scheme] = _scoped_handler(scheme, original)


def _scoped_handler(scheme: str, original: Any) -> Any:
    from urllib.parse import urlparse

    def handler(url: str, **kwargs: Any) -> Any:
        if scheme == "tcp":
            port = str(urlparse(url).port)
        else:
            port = os.environ.get("MASTER_PORT", "")
        rendezvous = original(url, **kwargs)
        if port == os.environ.get(PLUGIN_PORT_ENV) or AGENT_STORE_ENV not in os.environ:
            yield from rendezvous
            return
        value = os.environ.pop(AGENT_STORE_ENV)
        try:
            first = next(rendezvous)  # the store is created here: rank 0 hosts it
        finally:
            os.environ[AGENT_STORE_ENV] = value
        yield first
        yield from rendezvous

    handler._distrank_scoped = True  # type: ignore[attr-defined]
    return handler


def stray_forks(pid: int) -> tuple[int, ...]:
    """Children of this rank that still run its own code (forked, not exec'd, not managed).

    A child of ``os.fork()`` that returns into pytest runs the rest of the test a second time.
    Children that ``exec``'d (subprocess) have another command line; multiprocessing's own
    children (DataLoader workers with the fork start method) are known to it and left alone.
    """
    import multiprocessing

    def cmdline(p: int | str) -> bytes:
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                return f.read()
        except OSError:
            return b""

    own = cmdline(pid)
    managed = {p.pid for p in multiprocessing.active_children()}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in managed:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and int(fields[1]) == pid and fields[0] != b"Z":
            if cmdline(entry) == own:
                found.append(int(entry))
    return tuple(sorted(found))


def group_words(pg: Any) -> str:
    import torch.distributed as dist

    if pg is dist.group.WORLD:
        return "the default group"
    try:
        ranks = ", ".join(str(r) for r in dist.get_process_group_ranks(pg))
    except Exception:
        ranks = "?"
    return f"group {pg.group_name!r} (ranks {ranks})"


def live_groups() -> list[Any]:
    """The process groups this rank is a member of, the default one first."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not dist.is_initialized():
        return []
    groups = [dist.group.WORLD]
    groups += [pg for pg in list(c10d._world.pg_map) if pg is not dist.group.WORLD]
    return groups


def sequence_numbers() -> dict[str, int]:
    """Each live group's sequence number: compared between ranks after every test (~30 us)."""
    out: dict[str, int] = {}
    for pg in live_groups():
        with contextlib.suppress(Exception):  # a backend without sequence numbers
            out[group_words(pg)] = int(pg._get_sequence_number_for_group())
    return out


def collective_counts() -> dict[str, tuple[int, str]] | None:
    """Collectives issued per group, from the flight recorder (tens of ms: only on request).

    Point-to-point ops count in a group's sequence number but not here, so this tells a
    send/recv between some ranks from a collective that only some ranks issued.
    """
    import torch

    if os.environ.get("TORCH_FR_BUFFER_SIZE", "").strip() == "0":
        return None  # the flight recorder is off: no entries does not mean no collectives
    try:
        raw = torch._C._distributed_c10d._dump_fr_trace(True, False, False)
        entries = pickle.loads(raw).get("entries", [])
    except Exception:
        return None
    last: dict[str, tuple[int, str]] = {}
    for entry in entries:
        if entry.get("is_p2p"):
            continue
        name = str(entry.get("process_group", ("?",))[0])
        last[name] = (int(entry.get("collective_seq_id", 0)), str(entry.get("profiling_name")))
    out: dict[str, tuple[int, str]] = {}
    for pg in live_groups():
        seq_op = last.get(str(pg.group_name))
        out[group_words(pg)] = seq_op if seq_op is not None else (0, "")
    return out


def _group_problem(ctx: RankContext) -> str:
    """After a test: what happened to the pool's default group ("" when it is still its own).

    Under ``init_process_group=False`` whatever group the test left is destroyed here.
    """
    import torch.distributed as dist

    if ctx.pg is None:
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        return "left a process group that could not be destroyed" if dist.is_initialized() else ""
    if not dist.is_initialized():
        return "left the default process group destroyed"
    if dist.group.WORLD is not ctx.pg:
        return "replaced the default process group (init_process_group was called again)"
    return ""
