"""The rank side: one rank process of a pool, serving "run this test" from the controller.

Runs in each rank process (started by the fork server, or spawned), as the plugin of the pytest
session that :func:`entry.rank_main` starts (steps 1 and 5 below are the entry's). Imports none
of the controller side: only :mod:`pool.protocol`, the rank context (:mod:`rank.context`), the
rank-side modules beside it, :mod:`rankproc` (its parent and environment), :mod:`rankgroup` (its
store and group), :mod:`simulate` (simulated worlds), :mod:`rankgpu` (its GPU after each test),
:mod:`ranklogs`, :mod:`rankpdb`, :mod:`suiterank`, :mod:`pool.workerinput` (plugins' values, as
xdist hands them over), what a rank of either mode does around a test (:mod:`rank.hygiene`,
:mod:`rank.groupstate`), and the stdlib-only :mod:`rank.reaper` and :mod:`outcome.stacks`.
A rank process:

1. detaches from the fork server (so it dies with the controller: the fork server's alive pipe would
   keep it up), moves into its own process group (Ctrl-C is the controller's to handle), sends its
   output to a per-rank log;
2. runs its own pytest session from the controller's invocation folder, over the controller's
   own arguments (``cmdline.py``), then sets what the rank owns (``workerinput.WorkerInput``):
   it collects the files that hold its pool's tests;
3. after collection, connects to the controller's store once, initialises the process group once,
   calls ``pytest_distrank_rank_setup`` and says :class:`~protocol.Ready`;
4. serves :class:`~protocol.RunTest` messages by running the test's real pytest protocol, and
   sends its phase reports, serialized by pytest's own hooks;
5. on :class:`~protocol.Shutdown` (or when the controller's end of the pipe closes) tears down what
   is left and leaves with ``os._exit``: torch's interpreter shutdown costs ~0.5 s.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import gc
import os
import pickle
import signal
import sys
import time
import traceback
import warnings
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TextIO

import pytest

from ... import _compat, envvars
from ...outcome.records import PassedPhase, Reports, RunTest, WarningRecord, compact_passed
from ...outcome.stacks import interruption_message
from ...rank import reaper, seeding
from ...rank.context import RANK_CONTEXT, RankContext, set_channel
from ...rank.groupstate import collective_counts, left_modes, sequence_numbers
from ...rank.hygiene import Leftovers, cap_section, next_node, stray_forks
from ...rank.leftovers import LeftoverCheck
from ..protocol import (
    Collectives,
    CountCollectives,
    DebugSettings,
    Fatal,
    Phase,
    RankConfig,
    RankNote,
    Ready,
    Shutdown,
    Stopped,
    finished,
    phase_slots,
)
from ..suites import CASE
from . import ranklogs, rankreruns
from .dsrank import DeepSpeedRunner
from .leanphases import LeanProtocol
from .rankgpu import CudaMemory, gloo_fallback_plugin
from .rankgroup import group_problem, master_store, meet_before_destroy, start_rank
from .rankpdb import LiveInput, Relay, TracePlugin, install, post_mortem
from .rankproc import end_with_controller
from .simulate import local_mode_plugin
from .suiterank import SuiteRunner

#: Plugins that act on the whole test in the controller and must not act again in a rank:
#: pytest-rerunfailures would rerun a test on one rank alone (flaky marker), out of step with
#: its peers' collectives.
CONTROLLER_ONLY_PLUGINS = (_compat.RERUNFAILURES_PLUGIN,)
#: Signal on which every rank dumps the stacks of all its threads into its log.
DUMP_SIGNAL = signal.SIGUSR1


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
        #: The running test failed on this rank (a failed report of any phase).
        self.failed = False
        self.collect_errors: list[str] = []
        self.config: pytest.Config | None = None
        #: pytest's logging plugin captures (not under -p no:logging): loggers get relays.
        self.log_capture = False
        self.ctx: RankContext | None = None
        #: A ``coverage.Coverage`` measuring this rank when pytest-cov measures the controller.
        self.coverage: Any = None
        #: Tests served, and the CPU seconds when the last one ended (protocol.Stopped).
        self.tests = 0
        self.cpu = 0.0
        #: Runs the tests of PyTorch's own harness classes (:mod:`suiterank`).
        self.suites = SuiteRunner()
        #: Reports what earlier tests left set up and failed to tear down (rank/hygiene.py).
        self.leftovers = Leftovers()
        #: Finds, restores and names the state each test leaves behind (rank/leftovers.py);
        #: None under --distrank-leftovers=off.
        self.checks: LeftoverCheck | None = None
        if cfg.leftovers != "off":
            self.checks = LeftoverCheck(cfg.rank, cfg.leftovers, *cfg.leftovers_ignore)
            self.suites.after_setup = self.checks.harness_setup_done
        #: The controller's terminal, for debuggers opened in this rank (rankpdb.py).
        self.relay = Relay(conn, cfg.rank, cfg.world_size)
        self.debug = cfg.debug or DebugSettings()
        #: The CUDA memory each test leaves allocated (rankgpu.py).
        self.cuda = CudaMemory(cfg.cuda_device, cfg.cuda_growth)
        #: The file the rank's terminal report goes to (its .pytest.log).
        self.terminal_file: TextIO | None = None
        #: Runs plain passing phases without pytest's reporting hooks (leanphases.py).
        self.lean = LeanProtocol(self.passed, False)

    def arm_faulthandler(self) -> None:
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
        self.log_capture = config.pluginmanager.get_plugin("logging-plugin") is not None
        install(self.relay)  # after pytest's debugging plugin took pdb.set_trace
        if self.debug.trace and self.debug.trace_rank == self.cfg.rank:
            # Only on the trace rank: other ranks pay no hook wrapper per test.
            config.pluginmanager.register(TracePlugin(self.relay), "distrank-trace")
        if self.debug.live_rank == self.cfg.rank:
            sys.stdin = LiveInput(self.relay)
        # Plain passing phases without pytest's reporting hooks, where those are all known.
        self.lean = LeanProtocol(self.passed, envvars.lean_phases())
        config.pluginmanager.register(self.lean, "distrank-lean-phases")
        config.pluginmanager.register(self.suites, "distrank-suite-runner")
        config.pluginmanager.register(DeepSpeedRunner(), "distrank-deepspeed-runner")
        config.pluginmanager.register(self.leftovers, "distrank-leftover-teardown")
        if self.checks is not None:
            config.pluginmanager.register(self.checks, "distrank-leftover-checks")
        seeding.register(config, self.cfg.seed, self.cfg.rank)  # before each test's fixtures
        local = local_mode_plugin(self.cfg.simulated)
        if local is not None:  # every test of a local-mode pool runs under LocalTensorMode
            config.pluginmanager.register(local, "distrank-local-mode")
        fallback = gloo_fallback_plugin(self.cfg)
        if fallback is not None:  # what gloo cannot run on CUDA tensors is a skip
            config.pluginmanager.register(fallback, "distrank-gloo-fallback")
        for name in CONTROLLER_ONLY_PLUGINS:
            # Configured (its markers are known) but never called: the controller owns it.
            if config.pluginmanager.get_plugin(name) is not None:
                config.pluginmanager.unregister(name=name)
        if _compat.rerunfailures_module(config) is not None:  # else no hook on every test
            config.pluginmanager.register(rankreruns.RankVerdicts(), "distrank-rerun-verdicts")
        # The rank's own terminal report (progress letters, its session summary) goes to a file
        # beside the rank's log, so that the log holds only what the test itself wrote and
        # faulthandler's dumps: the excerpts shown for a crash stay readable.
        self.redirect_terminal(config)

    def redirect_terminal(self, config: pytest.Config) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if _compat.can_redirect_terminal(reporter):
            if self.terminal_file is not None:  # a fork's template's: closed, not left to GC
                self.terminal_file.close()
            path = self.cfg.log_path.removesuffix(".log") + ".pytest.log"
            self.terminal_file = open(path, "a", encoding="utf-8", buffering=1)
            _compat.redirect_terminal(reporter, self.terminal_file)

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

    @pytest.hookimpl
    def pytest_exception_interact(
        self, node: pytest.Item | pytest.Collector, call: pytest.CallInfo[Any], report: Any
    ) -> None:
        """``--pdb``: a failure opens the debugger here if this rank is the first to fail."""
        if not self.debug.post_mortem or call.excinfo is None or self.ctx is None:
            return
        longrepr = str(getattr(report, "longrepr", "") or "")
        post_mortem(self.relay, call.excinfo.tb, longrepr)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        self._phase(Phase.TEARDOWN)

    def passed(self, record: PassedPhase) -> None:
        """A plain passing phase's record (from its report, or a lean phase's: leanphases.py)."""
        if record[1] == "teardown":
            self._phase(Phase.FINISHED)  # what runs now is protocol wrappers, then the send
        self.pending.append(record)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        assert self.config is not None
        compact = compact_passed(report)
        if compact is not None:
            self.passed(compact)
            return
        if report.when == "teardown":
            self._phase(Phase.FINISHED)
        self.failed = self.failed or report.failed
        report.sections = [(title, cap_section(content)) for title, content in report.sections]
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        self.pending.append(data)
        if report.failed and not self.debug.post_mortem:
            # Send a failure at once: the controller starts the peers' grace period from it.
            # Under --pdb it goes after the debugger (the grace would end the test before).
            self._flush(done=False)

    def _flush(
        self,
        done: bool,
        pg_problem: str = "",
        sequence: dict[str, int] | None = None,
        forks: tuple[int, ...] = (),
        started: float = 0.0,
        cuda_note: str = "",
        leftovers: tuple[str, ...] = (),
        between: tuple[str, tuple[str, ...]] | None = None,
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
                started,
                cuda_note,
                leftovers,
                between,
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
        self.arm_faulthandler()
        items = {item.nodeid: item for item in session.items}
        missing = tuple(n for n in self.cfg.nodeids if n not in items)
        try:
            self.ctx = start_rank(self.cfg)
            ctx, rank = self.ctx, self.cfg.rank  # what a test must say before it dies
            set_channel(
                lambda *note: self.conn.send(
                    dataclasses.replace(RankNote(rank, ctx.test.index, *note), pid=os.getpid())
                )
            )
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
        ready = Ready(
            self.cfg.rank, os.getpid(), missing, tuple(self.collect_errors), time.process_time()
        )
        self.conn.send(ready)
        while True:
            if os.getpid() != self.pid:
                # A process the test forked came back into the rank's loop (its reports went
                # out with its own pid, which fails the test): it must not take the rank's
                # messages. Leave at once, without the rank's cleanup.
                os._exit(0)
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                end_with_controller()  # gone: what the tests started ends too
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
        item, test = items[message.nodeid], message.index
        nextitem = next_node(item, items, message.next_nodeid)
        self.ctx.test = message
        started = time.monotonic()
        self._phase(Phase.RECEIVED, message.index)
        self.leftovers.before(item, message.next_nodeid)
        if not self.cfg.init_process_group:
            # A fresh env:// rendezvous for every test: init_process_group() keys never collide.
            master_store(self.ctx, f"test{message.index}/")
        self.forks = 0
        self.warnings = []
        self.failed = False
        if self.checks is not None:
            self.checks.start(item, harness=CASE in item.stash)
        self.arm_faulthandler()  # a test may have disabled it: a crash must leave its stack
        if self.log_capture:  # under -p no:logging no logger gets a relay (test_c10d_logger)
            ranklogs.new_test()
        try:
            item.ihook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        finally:
            if os.getpid() == self.pid:
                self.relay.release()  # a debugger stepped out of the test: it lets go here
        if os.getpid() != self.pid:
            self._flush(done=True)  # a fork of the test: its reports carry its own pid
            return
        self._phase(Phase.FINISHED)
        meet_before_destroy(self.ctx, self.failed, lambda r: finished(self.phases, r, test))
        problem = group_problem(self.ctx)
        sequence = sequence_numbers() if not problem else {}
        # After the sequence numbers: the groups the test left are destroyed here.
        left, left_problem = self.checks.finish() if self.checks is not None else ((), "")
        unfit = self.suites.problem()
        cuda_note, cuda_problem = self.cuda.after_test()
        released = self.cuda.release() if self.checks is not None else ""
        if released:
            left += (released,)
        parts = (problem, unfit, left_problem, left_modes(), cuda_problem)
        self._flush(
            done=True,
            pg_problem="; ".join(p for p in parts if p),
            sequence=sequence,
            forks=stray_forks(self.pid) if self.forks else (),
            started=started,
            cuda_note=cuda_note,
            leftovers=left,
            between=self.checks.between if self.checks is not None else None,
        )
        self._phase(Phase.IDLE)
        self.tests += 1
        self.cpu = time.process_time()

    def _stop(self, session: pytest.Session) -> None:
        self._phase(Phase.STOPPING)
        errors: list[str] = []
        try:
            _compat.teardown_exact(session, None)
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
        # No terminal summary: the controller reports the session, and the summary hooks of
        # every plugin cost a rank's exit (hypothesis's imports hypothesis: ~0.3 s of CPU).
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            session.config.pluginmanager.unregister(reporter)
        # pytest's unraisable-exception plugin collects garbage five times at unconfigure, over
        # every object the tests made (~15 % of a fresh rank's CPU in PyTorch's RPC files);
        # the rank's reports are sent and it ends with os._exit: nothing there to find.
        gc.freeze()
        self.conn.send(Stopped(self.cfg.rank, tuple(errors), self.cpu, self.tests))
