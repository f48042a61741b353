"""Launcher mode: pytest inside a launched world (torchrun, srun, mpirun), one rank per process.

Runs in every pytest process of the launched world: plugin.py's configure gate registers
:class:`LaunchPlugin` instead of the Controller when :func:`env.launch_of` finds a launched
world. The plugin starts no rank processes of its own. Every rank:

1. connects to the control store at MASTER_ADDR:MASTER_PORT (:mod:`channel`), agrees on a
   run id, and (ranks other than 0) sends its terminal report to a per-rank log file;
2. collects as pytest always does, sends its ordered node ids to rank 0, and gets back rank 0's
   plan: for every test, run on all ranks / on a sub-world / rank 0 only / skip / error (or,
   when the ranks collected different tests, an error naming the ranks and node ids, and no test
   runs), and the order they run in;
3. runs the tests of the launched world size in lock-step with the same fixtures as pool mode
   (each rank's part and what follows it, :mod:`testrun`; those of a smaller size in batches on
   sub-worlds, :mod:`subrun`),
   and sends its phase reports to rank 0 (with the test's warnings, its groups' sequence numbers
   and its pid), which merges them (:func:`merge.merge_test`) and replays one report per phase,
   each distinct warning once (:mod:`outcome.warnings`); ranks other than 0 wait for rank 0's
   verdict on the previous test before they start the next one;
4. exits with rank 0's exit code, all ranks together.

A rank whose session ``pytest.exit()`` or ``KeyboardInterrupt`` ends in a test tells rank 0, which
fails the test and ends the run (:func:`early.publish_stopped`). A process that a test
forked and that comes back into the rank's code leaves at once
(:meth:`session.RankSession.leave_if_fork`).

A watchdog thread in every rank (:mod:`watchdog`) enforces the deadline and the failure
grace while the main thread may be stuck in a C++ collective.

This class keeps the pytest hooks and what they share (the plan, the running test, whether the
run ended); the rank's session (:class:`session.RankSession`), its process group
(:class:`group.GroupKeeper`) and the watchdog own the rest. Which thread owns which field:
everything here belongs to the main thread, except ``current`` (the watchdog reads it, and
:class:`current.Current` says which of its fields the watchdog may write) and, once the watchdog
has taken a test over, ``ended``, ``aborted`` and ``current`` (the main thread is stuck in the
test then, and never comes back: the process exits from the watchdog).
"""

from __future__ import annotations

import contextlib
import functools
import shlex
import time
import traceback
import warnings
from collections.abc import Generator

import pytest
from pytest import CollectReport, TestReport

from .. import __version__, _compat
from ..outcome.finish import finish_test
from ..outcome.records import RunTest, WarningRecord
from ..outcome.reports import forked_report, setup_error_report, skipped_reports
from ..outcome.stacks import interruption_message
from ..parsing import MAX_SEED, file_safe
from ..planning.order import order_seed, reorder, session_seed
from ..rank import seeding
from ..rank.hygiene import teardown_unneeded
from ..settings import Settings, item_timeout
from . import gaveup, harness, keys, liveness, subrun, testrun
from .channel import ChannelError
from .current import Current
from .early import publish_early, publish_stopped
from .env import Launch, rerun_command
from .group import GroupKeeper
from .plan import Step, apply_on_rank0, exchange, next_shared
from .report import FRESH_GROUP
from .session import RankSession, park
from .subworld import relabel, rerun_note
from .terminal import header_lines, summary_lines
from .watchdog import Watchdog

PLUGIN_NAME = "distrank-launch"


def start_launched(config: pytest.Config, launch: Launch, suites: harness.Suites | None) -> None:
    """The configure gate found a launched world (:func:`env.launch_of`): become a rank (and run
    PyTorch's harness classes as pool ranks do, with the ``suites`` the gate hands over)."""
    rs = RankSession.open(config, launch)
    plugin = LaunchPlugin(config, rs, Settings.from_config(config))
    config.pluginmanager.register(plugin, PLUGIN_NAME)
    if suites is not None:
        harness.register(config, launch, plugin.group, suites)
    seeding.register(config, plugin.seed.value, plugin.rank, plugin.is_distributed)
    liveness.hook_exit(rs, lambda: plugin.current)
    plugin.watchdog.start()


class LaunchPlugin:
    """The pytest plugin object of one rank of a launched world: pytest's hooks."""

    def __init__(self, config: pytest.Config, rs: RankSession, settings: Settings) -> None:
        self.config = config
        self.rs = rs
        self.launch = rs.launch
        self.settings = settings
        self.rank = rs.rank
        self.world_size = rs.world_size
        self.group = GroupKeeper(rs)
        self.watchdog = Watchdog(
            rs, lambda: self.current, functools.partial(subrun.end_stuck, self)
        )
        self.session: pytest.Session | None = None
        self.steps: tuple[Step, ...] = ()
        self.index_of: dict[int, int] = {}
        self.items: list[pytest.Item] = []
        #: The index of the test pytest is in (the last one, between tests).
        self.index = -1
        #: The distributed test this rank runs now (the watchdog reads it).
        self.current: Current | None = None
        #: Why the run stopped early: the remaining tests are not run (None while it goes on).
        self.ended: str | None = None
        #: A rank was left stuck: the world is broken, fixtures are not torn down at the end.
        self.aborted = False
        self.collect_error: str | None = None
        #: Rank 0: the tests it ran alone since its last distributed one (node id, start time),
        #: and whether other ranks left on its silence meanwhile (:mod:`gaveup`).
        self.alone: list[tuple[str, float]] = []
        self.peers_left = False
        self.distributed_tests = 0
        #: Each rank's node (rank 0's plan), and the batch of sub-world tests in which the run
        #: ended (its other tests ran at once: they are still reported).
        self.nodes: tuple[int, ...] = ()
        self.ended_batch = -1
        #: The session seed: ``random`` takes it from rank 0's run id, which every rank got
        #: through the control store (all ranks must agree, for their order too).
        self.seed = session_seed(settings.seed, pick=lambda: int(rs.run_id, 16) % (MAX_SEED + 1))
        try:
            self.order_seed = order_seed(settings.order, self.seed)
        except ValueError as exc:
            raise pytest.UsageError(f"pytest-distrank: {exc}") from None

    # -- header and summary --------------------------------------------------------------------

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return header_lines(self.rs, self.settings, __version__, self.seed.value, self.order_seed)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.rank == 0 and self.distributed_tests:
            notes = [*self.group.notes, *([f"run ended early: {self.ended}"] if self.ended else [])]
            summary_lines(terminalreporter, self.rs, self.distributed_tests, notes)

    # -- collection and plan -------------------------------------------------------------------

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.session = session
        self.items = list(session.items)
        plan = exchange(self.rs, self.settings, session)
        self.rs.pids, self.rs.logs = plan.pids, plan.logs
        if plan.error:
            self.collect_error = plan.error
            self.ended = "the ranks did not collect the same tests"
            report = CollectReport("", "failed", plan.error, [])
            session.ihook.pytest_collectreport(report=report)
            return
        # Sub-worlds' batches run packed (subworld.schedule): every rank runs the plan's order.
        order = plan.order or tuple(range(len(self.items)))
        self.items = [self.items[i] for i in order]
        session.items[:] = self.items
        self.steps = tuple(plan.steps[i] for i in order)
        self.nodes = plan.nodes
        self.index_of = {id(item): i for i, item in enumerate(self.items)}

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """``--distrank-order``, alike on every rank (planning/order.py)."""
        name = self.settings.order.value[0]
        if name != "collected":
            items[:] = reorder(items, lambda item: item.nodeid, name, self.order_seed)

    def is_distributed(self, item: pytest.Item) -> bool:
        """Whether ``item`` runs on several ranks (others run on rank 0 alone)."""
        return self._step_of(item).kind in ("all", "sub")

    def _step_of(self, item: pytest.Item) -> Step:
        index = self.index_of.get(id(item))
        return self.steps[index] if index is not None else Step("rank0")

    # -- running -------------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        if self.collect_error is not None:
            raise session.Interrupted(
                "the ranks of the launched world did not collect the same tests (see above)"
            )

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_timeout_set_timer(self, item: pytest.Item) -> bool | None:
        """The watchdog owns a distributed test's deadline (settings.item_timeout) on every rank,
        also where rank 0 waits for another sub-world's result (:func:`subrun.replay`)."""
        return True if self.is_distributed(item) else None

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_timeout_cancel_timer(self, item: pytest.Item) -> bool | None:
        return True if self.is_distributed(item) else None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> bool | None:
        index = self.index_of.get(id(item))
        if index is None:
            if self.rank == 0:
                self.alone.append((item.nodeid, time.time()))
            return None if self.rank == 0 else True
        step = self.steps[index]
        try:
            if self.rank == 0:
                self.index = index
                if step.kind == "rank0":
                    self.alone.append((item.nodeid, time.time()))
                elif self.ended is None:
                    self._peers_left()
                if self.ended is not None and not subrun.same_batch(self, index):
                    self._log_not_run(item, self.ended)
                elif step.runs_on(0):
                    testrun.run_rank0(self, item, index)
                elif step.kind == "sub":
                    subrun.replay(self, item, index)
                else:
                    teardown_unneeded(item)
                    if step.kind == "rank0":
                        self.group.leave_sub_world()  # as it finds the world first in its file
                    return None  # pytest's own protocol; pytest_runtest_setup applies the step
                subrun.stopping(self, index)
                return True
            if step.runs_on(self.rank) and self.ended is None and self._await_turn(index):
                if step.world is not None and step.world.members[0] == self.rank:
                    subrun.run_leader(self, item, index)
                else:
                    testrun.run_peer(self, item, index)
            return True
        except ChannelError as exc:
            self.rs.lost(exc)

    def _peers_left(self) -> None:
        """Rank 0, before a test that needs the other ranks: did some leave while it was silent
        (:mod:`gaveup`)? Then this test and the ones after it are not run."""
        left = gaveup.reason(self.rs.channel, self.world_size, self.alone, time.time())
        if left is not None:
            self.ended, self.aborted, self.peers_left = left, True, True
        self.alone = []

    def _await_turn(self, index: int) -> bool:
        """Ranks other than 0: wait for rank 0's verdict on the test before this one (before
        its batch, for a sub-world's test: the tests of a batch run at once)."""
        assert self.session is not None
        index = subrun.batch_start(self.steps, index)
        if index == 0:
            return True
        found = self.group.wait([keys.verdict(index - 1), keys.STOPPED, keys.EXIT])
        verdict: keys.Verdict
        if found == keys.EXIT:
            verdict = {"action": "stop", "reason": "rank 0 ended the session", "gen": 0}
        else:
            verdict = self.rs.channel.get(found, keys.read_verdict)
        if verdict["action"] != "continue":
            self.ended = verdict["reason"]
            self.aborted = verdict["action"] == "abort"
            self.session.shouldstop = f"distrank: {self.ended}"
            self.rs.log(f"distrank: {self.launch.label()}: rank 0 stopped the run: {self.ended}")
            return False
        self.group.gen = verdict["gen"]
        return True

    def start_test(self, item: pytest.Item, index: int) -> Current:
        try:
            timeout = item_timeout(item, self.settings.timeout)
        except ValueError:
            timeout = self.settings.timeout
        grace = self.settings.failure_grace.value
        end_deadlocks = self.settings.deadlocks.value == "end"
        world = self.steps[index].world
        view = self.rs.view(world.members) if world is not None else None
        size = world.size if world is not None else self.world_size
        cur = Current.begin(index, item, size, timeout, grace, end_deadlocks)
        cur.view = view
        seeder = self.config.pluginmanager.get_plugin("distrank-seed")
        if seeder is not None:  # seeded by the rank in the test's world, as the rerun is
            seeder.rank = view.rank if view is not None else self.rank
        self.current = cur
        self.distributed_tests += 1
        return cur

    def run_here(self, cur: Current) -> bool:
        """This rank's part: the process group for the test's backend, then pytest's protocol
        (reports reach ``cur.reports`` through the makereport wrapper, not the terminal; its
        warnings ``cur.caught``, not this rank's own summary: rank 0 shows every rank's, once).

        Returns False when the test could not start, or forked processes that still ran the
        rank's code (they are killed, and the test fails): the group is not to be trusted.
        """
        item = cur.item
        step = self.steps[cur.index]
        rs = cur.view or self.rs
        where = step.world or subrun.latest_sub(self.steps, cur.index)
        try:
            assert self.session is not None
            self.group.ensure(step.backend, self.session, cur.index, where, step.group)
        except Exception:
            message = (
                f"{self.launch.label()}: could not initialise the process group (backend "
                f"{step.backend}) for {item.nodeid}:\n{traceback.format_exc()}"
            )
            cur.reports.append(setup_error_report(item.nodeid, item.location, message, time.time()))
            publish_early(rs, cur, cur.reports[-1])
            return False
        assert self.group.ctx is not None
        following = next_shared(self.steps, self.items, cur.index, self.rank)
        shared = self.rs.root / "shared" / f"{cur.index}-{file_safe(item.name)}"
        self.group.ctx.test = RunTest(
            cur.index, item.nodeid, following.nodeid if following else None, str(shared)
        )
        self.rs.forks = 0
        with warnings.catch_warnings(record=True) as caught:
            cur.caught = caught
            try:
                _compat.run_test_protocol(item, following)
            finally:
                self.rs.leave_if_fork(cur.index, item.nodeid)
        forks = self.rs.end_forks()
        self.group.after_test(any(report.failed for report in cur.reports))
        if step.group == "harness" and self.group.harness_problem():
            return False  # a continuous class's group may be out of step: every rank's anew
        if forks:
            after, ws, now = f"The rank killed it. {FRESH_GROUP}", rs.world_size, time.time()
            report = forked_report(item.nodeid, item.location, rs.rank, ws, forks, after, now)
            cur.reports.append(report)
            publish_early(rs, cur, report)
        return not forks

    def finish(
        self,
        item: pytest.Item,
        per_rank: dict[int, list[TestReport]],
        warned: dict[int, list[WarningRecord]],
    ) -> list[TestReport]:
        """The test's reports to log: :func:`finish.finish_test`, the tail pool mode's too; a
        sub-world's ranks named in both numberings (:func:`subworld.relabel`)."""
        rerun = f"cd {shlex.quote(str(self.config.rootpath))} && "
        rerun += rerun_command(self.launch, item.nodeid, self.seed.value)
        world = self._step_of(item).world
        if world is None:
            pids, ws = self.rs.pids, self.world_size
            return finish_test(item, per_rank, ws, pids, rerun, warned)
        rerun += rerun_note(world)
        pids = self.rs.view(world.members).pids
        name = functools.partial(relabel, size=world.size, members=world.members, nodes=self.nodes)
        where = [(r, self.nodes[r] if r < len(self.nodes) else 0) for r in world.members]
        return finish_test(
            item, per_rank, world.size, pids, rerun, warned, after=[name], launched=where
        )

    def _log_not_run(self, item: pytest.Item, reason: str) -> None:
        ihook = item.ihook
        ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        path, reason = item.location[0], f"not run: {reason}"
        for report in skipped_reports(item.nodeid, item.location, path, reason):
            ihook.pytest_runtest_logreport(report=report)
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)

    def log_not_run_after(self, index: int, reason: str) -> None:
        for item in self.items[index + 1 :]:
            self.index = self.index_of[id(item)]
            self._log_not_run(item, reason)

    # -- per-phase hooks -----------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        cur = self.current
        if cur is not None and cur.item is item:
            cur.when = "setup"
            return
        if self.rank == 0:
            apply_on_rank0(item, self._step_of(item))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        cur = self.current
        if cur is not None and cur.item is item:
            cur.when = "call"

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        cur = self.current
        if cur is not None and cur.item is item:
            cur.when = "teardown"

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, TestReport, TestReport]:
        report = yield
        cur = self.current
        if cur is not None and cur.item is item:
            cur.reports.append(report)
            if report.failed or (report.skipped and not hasattr(report, "wasxfail")):
                with contextlib.suppress(ChannelError):
                    publish_early(self.rs, cur, report)
        return report

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        """Rank 0: the verdict on this test, which the other ranks wait for."""
        self.rs.leave_if_fork(self.index, nodeid)  # a fork of a test run by rank 0 alone
        if self.rank != 0 or self.session is None:
            return
        self.group.publish_verdict(self.index, self.ended, self.session)

    @pytest.hookimpl
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        """``pytest.exit()`` or ``KeyboardInterrupt`` ended this rank's session (main thread).

        In a distributed test the ranks are no longer in step: fixtures are not torn down (their
        teardown may wait on a peer). A rank other than 0 tells rank 0, which fails the test
        with why and where and ends the run; rank 0 reports its own interruption as pytest does,
        and its exit code (published at session finish) releases the other ranks.
        """
        rs = self.rs
        cur = self.current
        rs.leave_if_fork(cur.index if cur else self.index, cur.item.nodeid if cur else "")
        with rs.lock:
            taken = cur is not None and cur.taken_over
            if cur is not None:
                cur.done = True
        if taken:
            park()  # the watchdog reports the test and ends the process
        self.current = None
        if rs.terminated or rs.exiting or (cur is None and self.rank == 0):
            return
        self.aborted = self.aborted or cur is not None
        if self.rank == 0:
            return
        where = cur.item.nodeid if cur is not None else "a pause between tests"
        message = interruption_message(excinfo.value, where)
        rs.log(
            f"distrank: {self.launch.label()}: {message.splitlines()[0]}; this rank's session "
            "ends; rank 0 fails the test and ends the run"
        )
        with contextlib.suppress(ChannelError):
            publish_stopped(rs, cur, message)

    # -- the end -------------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Rank 0 publishes the exit code; the others adopt it.

        After a rank was left stuck, fixtures still set up are not torn down: their teardown may
        wait in a collective on the stuck (or gone) rank, with no deadline left to end it.
        """
        self.current = None
        if self.rank == 0 and self.ended is None:
            with contextlib.suppress(ChannelError):
                self._peers_left()  # after the last distributed test
        if self.peers_left and exitstatus == 0:  # the tests not run: the run did not complete
            exitstatus = session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        self.rs.adopt_exit_code(session, exitstatus, self.group.wait)
        if self.aborted:
            _compat.forget_setup_stack(session)
