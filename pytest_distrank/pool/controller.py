"""The controller side: plan, dispatch, deadlines, replay of merged reports, shutdown.

Runs in the controller (the pytest process the user started). It collects as pytest always does
and runs ordinary tests itself. For a distributed test it takes over ``pytest_runtest_protocol``:
it sends the test to the warm pool for its :class:`~pool.PoolKey`, merges the ranks' reports into
one per phase and replays them through ``pytest_runtest_logreport``, so the terminal, ``-ra`` and
``--junitxml`` see ordinary reports. Skips and errors that need no ranks (missing backend, too few
GPUs, a bad marker, a rank fixture in an ordinary test) are raised from a tryfirst
``pytest_runtest_setup`` before any fixture, and before any process starts.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import signal
import sys
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any

import pytest
from pytest import TestReport

from .. import _compat
from ..envvars import STATS_ENV
from ..fixtures import rank_fixtures_used
from ..outcome.expectations import item_expectations
from ..outcome.finish import finish_test
from ..outcome.records import RunTest
from ..outcome.reports import error_reports, skipped_reports
from ..parsing import file_safe
from ..planning.capabilities import check_ordinary_test
from ..planning.gpuplan import GpuPolicy
from ..planning.order import WORKERINPUT_KEY, order_seed, reorder, session_seed
from ..settings import Settings, Value
from . import reruns, simreport
from .crossize import CrossSize
from .earlystart import EarlyStart
from .freshretry import FreshRetry
from .onetest.debugrelay import DebugTerminal
from .onetest.interrupts import session_capped, take_signals, with_teardown
from .onetest.ranks import TestRun
from .ownreports import charge_pool_start, deserializer, missing_message, teardown_controller_side
from .plan import Planned, make_plan
from .pools import earlyfork
from .pools.forkserver import SessionStartError
from .pools.gpus import GpuUnavailable
from .pools.pool import Pool, PoolStartError, PoolUnfit
from .pools.poolkey import PoolKey
from .pools.poolset import START_TIMEOUT, PoolSet
from .replay import Replays
from .repro import Repro
from .suites import fresh_notes


class Controller:
    """The pytest plugin object of the controller process."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        #: What the user allows when an NCCL test has fewer GPUs than ranks (gpuplan.py).
        self.gpu_policy = GpuPolicy(
            settings.gpu_oversubscribe.value,
            settings.gpu_fallback.value,
            settings.gpu_oversubscribe.source,
        )
        self.plan: dict[str, Planned] | None = None
        self.pool_nodeids: dict[PoolKey, list[str]] = {}
        self.pool_files: dict[PoolKey, set[str]] = {}
        #: Pools that failed to start: later tests of the key error at once with the same story.
        self.failed_starts: dict[PoolKey, str] = {}
        #: Teardown errors of the ranks' remaining fixtures when the pools stopped.
        self.stop_errors: list[str] = []
        #: The session seed (``--distrank-seed``; under pytest-xdist, its controller's), and
        #: the seed of a ``--distrank-order=random`` (planning/order.py).
        self.seed = session_seed(settings.seed, getattr(config, "workerinput", None))
        try:
            self.order_seed = order_seed(settings.order, self.seed)
        except ValueError as exc:
            raise pytest.UsageError(f"pytest-distrank: {exc}") from None
        self.pools = PoolSet(config, settings)
        self.pools.seed = self.seed.value
        self.stats = self.pools.stats
        self.next_test_index = 0
        #: The rerun command under each failure: its folder, seed, the file's variables.
        self.repro = Repro(str(config.rootpath))
        self.isolated = 0
        #: A session run inside another's process (``pytest.main(plugins=...)``, as pytester's
        #: in-process runs do): it leaves the process's GC and signals alone, and starts the fork
        #: server only when a pool needs it.
        self.nested = bool(config.invocation_params.plugins or earlyfork.open_sessions)
        earlyfork.open_sessions.append(self)
        #: Whether this session starts the process's resource tracker (the fork server's start
        #: does), and so stops it at its end.
        self.owns_tracker = not self.nested and not _compat.resource_tracker_running()
        #: The signals install_sigterm took over (from SIG_DFL), given back at unconfigure.
        self._taken_signals: list[signal.Signals] = []
        #: The interrupt that ended the test in flight, raised again once it is reported.
        self.interrupted: BaseException | None = None
        #: The controller's terminal, lent to rank debuggers (debugrelay.py).
        self.terminal = self.pools.terminal = DebugTerminal(config)
        #: The fork server's start while pytest collects (earlystart.py).
        self.early = EarlyStart(config, self.pools, settings, self.nested)
        config.pluginmanager.register(self.early, "distrank-early-start")
        #: Failures after earlier tests of their pool, replayed after the session (replay.py).
        self.replays = Replays(config, settings.replay, settings.replay_budget)
        #: Harness tests that failed in a warm pool, run again on fresh ranks (freshretry.py).
        self.fresh = FreshRetry(settings.replay_budget)
        config.pluginmanager.register(self.replays, "distrank-replays")
        #: Fixtures at another world size: each runs once, on its own pool (crossize.py).
        self.crossize = CrossSize(
            config,
            settings.timeout,
            settings.backend.value,
            self.gpu_policy,
            lambda item, spec, key, timeout: self._execute(
                item, None, Planned(spec, key=key, timeout=timeout), keep_pool=False
            ),
            self.pools.notes,
        )

    # -- planning ------------------------------------------------------------------------------

    def _get_plan(self, session: pytest.Session) -> dict[str, Planned]:
        if self.plan is None:
            made = make_plan(session.items, self.settings, self.gpu_policy)
            self.plan, self.pool_nodeids, self.pool_files = made.plan, made.nodeids, made.files
            self.pools.notes.extend(fresh_notes(session.items))
        return self.plan

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """pytest-xdist's controller: every worker gets this session seed, so that their random
        states and ``--distrank-order=random`` agree (xdist refuses differing collections)."""
        node.workerinput[WORKERINPUT_KEY] = self.seed.value

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """``--distrank-order``: reorder the tests within each module (planning/order.py).
        Ranks keep their own collected order: they run the tests they are sent, by node id."""
        name = self.settings.order.value[0]
        if name != "collected":
            items[:] = reorder(items, lambda item: item.nodeid, name, self.order_seed)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if any(entry.key is not None for entry in self._get_plan(session).values()):
            self.early.start()

    # -- controller-side skips and errors ------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        entry = self._get_plan(item.session).get(item.nodeid)
        if entry is None:
            check_ordinary_test(item, rank_fixtures_used(item))
            return
        if entry.by_mark:
            return  # pytest's skipping plugin raises the skip, as for any test
        if entry.error:
            pytest.fail(entry.error, pytrace=False)
        if entry.skip:
            raise _compat.skip_exception(entry.skip)

    # -- pytest-timeout ------------------------------------------------------------------------

    def _is_dispatched(self, item: pytest.Item) -> bool:
        entry = self._get_plan(item.session).get(item.nodeid)
        return entry is not None and entry.key is not None

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_timeout_set_timer(self, item: pytest.Item) -> bool | None:
        """A distributed test's deadline is the pool's: pytest-timeout must not fire here.

        Its signal method would interrupt the controller mid-dispatch, and its thread method
        ``os._exit``s the whole session. The deadline (the same value, see settings.py) is
        enforced on the ranks instead, with their stacks in the report.
        """
        return True if self._is_dispatched(item) else None

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_timeout_cancel_timer(self, item: pytest.Item) -> bool | None:
        return True if self._is_dispatched(item) else None

    # -- running a distributed test ------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> bool | None:
        entry = self._get_plan(item.session).get(item.nodeid)
        if entry is None or entry.key is None:
            return None  # an ordinary test, or one the setup hook above skips or errors
        ihook = item.ihook
        # pytest-rerunfailures decides as for an ordinary test; the test reruns on all its ranks.
        policy = reruns.reruns_for(item)
        if policy is not None and policy.exhausted:
            return True
        first = True
        while True:
            if policy is not None:
                policy.begin()
            ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
            started, cpu = time.monotonic(), time.process_time()
            keep_pool = policy is not None and policy.may_rerun
            reports = self._execute(item, nextitem, entry, keep_pool=keep_pool)
            if policy is None:
                reports = self._fresh_retry(item, nextitem, entry, reports, started)
            self.stats.tests += first
            self.stats.test_seconds.append(time.monotonic() - started)
            rerun = False
            if policy is not None:
                reports, rerun = policy.judge(reports)
            if not rerun:
                reports = teardown_controller_side(item, nextitem, reports)
            for report in reports:
                ihook.pytest_runtest_logreport(report=report)
            ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
            self.stats.controller_cpu.append(time.process_time() - cpu)
            self.stats.ended.append(time.monotonic())
            if self.interrupted is not None:  # reported: now stop as pytest stops on Ctrl-C
                raise self.interrupted
            if self.terminal.quit:
                item.session.shouldstop = self.terminal.quit  # q in a rank's debugger
                break
            if policy is None or not rerun:
                break
            policy.pause()
            first = False
        self.replays.judge(item, reports, self.stats.test_seconds[-1])
        return True

    def _fresh_retry(
        self,
        item: pytest.Item,
        nextitem: pytest.Item | None,
        entry: Planned,
        reports: list[TestReport],
        started: float,
    ) -> list[TestReport]:
        """A harness test that failed after other tests of its warm pool runs again at once on
        fresh ranks, as its harness would run it (freshretry.py); else ``reports``."""
        last = self.replays.last
        option = self.config.option
        debugging = getattr(option, "usepdb", False) or getattr(option, "trace", False)
        if last is None or last[0] != item.nodeid or debugging:  # a debugger: at the failure
            return reports
        _, key, before = last
        why = self.fresh.wanted(item, reports, before, time.monotonic() - started)
        if why is None:
            return reports
        if why:
            return self.fresh.refused(reports, why)
        earlier = self.replays.history[key][1][:before]
        after = f"{before} earlier test{'s' if before > 1 else ''} (the last: {earlier[-1].name})"
        self.isolated += 1
        began = time.monotonic()
        fresh = self._execute(item, nextitem, self.fresh.fresh_entry(entry, self.isolated), False)
        seconds = time.monotonic() - began
        fresh, moved = self.fresh.settle(item, reports, fresh, after, seconds, self.interrupted)
        if moved and self.plan is not None:
            self.pools.notes.append(moved)
            items = item.session.items
            self.fresh.move(items, self.plan, items.index(item) + 1 if item in items else 0)
        return fresh

    @pytest.hookimpl(wrapper=True)
    def pytest_distrank_merge_reports(
        self, item: pytest.Item, reports: Mapping[int, Sequence[TestReport]]
    ) -> Generator[None, list[TestReport] | None, list[TestReport] | None]:
        """Whatever merges them: each failed phase's root-cause rank decides on a rerun."""
        if _compat.rerunfailures_plugin(item.config) is not None:
            reruns.keep_root_causes(item, reports)
        return (yield)

    def _execute(
        self, item: pytest.Item, nextitem: pytest.Item | None, entry: Planned, keep_pool: bool
    ) -> list[TestReport]:
        """Run the test on its pool; ``keep_pool``: it may run again next (a rerun)."""
        assert entry.key is not None and entry.spec is not None
        key, next_nodeid = entry.key, entry.next_nodeid
        if self.settings.isolate.value:
            key, next_nodeid = self.isolate(key), None
        assert entry.timeout is not None
        timeout = session_capped(self.config, entry.timeout)
        # The ranks tear down for pytest's real next item, as pytest would (under pytest-xdist
        # it is not the plan's: the worker's next test); the plan's next test of this pool
        # decides only whether the pool lives on. Before a rerun, nothing is torn down.
        teardown_for = next_nodeid
        if next_nodeid is not None and not keep_pool:
            teardown_for = nextitem.nodeid if nextitem is not None else None
        outcome = self._run_on_pool(item, key, teardown_for, timeout)
        if isinstance(outcome, list):
            return outcome  # the test could not reach its ranks: an error or skip report
        pool, run = outcome
        self.interrupted = run.interrupted
        self.replays.served(pool, key, item)
        if len(run.started) == key.world_size:
            self.stats.start_spread.append(max(run.started.values()) - min(run.started.values()))
        if getattr(self.config.option, "capture", "fd") == "no":
            self.terminal.echo_rank_output(pool, self.settings.debug_rank.value)
        if run.broken:
            self.pools.retire(key, pool, run.broken, graceful=False)
        elif next_nodeid is None and not keep_pool:
            self.pools.retire(key, pool, None, graceful=True)
        self.pools.notes.extend(run.notes)
        interrupted, simulated = run.interrupted, key.simulated
        return finish_test(
            item,
            run.reports,
            key.world_size,
            pool.pids,
            self.repro.command(str(item.path), item.nodeid, self.seed.value),
            run.warnings,
            before=[
                *([lambda merged: with_teardown(merged, interrupted)] if interrupted else []),
                lambda merged: charge_pool_start(merged, pool),
            ],
            after=[lambda merged: simreport.relabel(merged, simulated)] if simulated else [],
        )

    def _run_on_pool(
        self, item: pytest.Item, key: PoolKey, next_nodeid: str | None, timeout: Value[float]
    ) -> tuple[Pool, TestRun] | list[TestReport]:
        """Send the test to its pool and wait for it; or the reports of why it could not run.

        A pool whose rank died just before the test reached it (after the idle check) is
        replaced and the test sent once more: the test did nothing wrong.
        """
        nodeid, where = item.nodeid, item.location
        prepared = self.crossize.prepare(item)  # its fixtures at another world size ran
        if prepared is not None:
            return prepared
        for attempt in (1, 2):
            failed_start = self.failed_starts.get(key)
            if failed_start is not None:
                again = "\n(from an earlier start; not retried)"
                return error_reports(nodeid, where, failed_start + again)
            try:
                pool = self._pool_for(key, item, timeout.value)
            except GpuUnavailable as exc:
                return skipped_reports(nodeid, where, str(item.path), f"GPU lease: {exc}")
            except SessionStartError as exc:  # a folder, the fork server: not kept per key
                return error_reports(nodeid, where, str(exc))
            except PoolStartError as exc:
                message = f"could not start the ranks of pool {key.describe()}:\n{exc}"
                self.failed_starts[key] = message
                return error_reports(nodeid, where, message)
            self.terminal.announce_debug_rank(pool, self.settings.debug_rank)
            missing = sorted({r.rank for r in pool.ready if item.nodeid in r.missing})
            if missing:
                return error_reports(nodeid, where, missing_message(item, pool, missing))
            try:
                run = pool.run(
                    self.new_test(item, next_nodeid),
                    item.location,
                    str(item.path),
                    deserializer(item),
                    timeout.value,
                    timeout.source,
                    self.settings.failure_grace.value,
                    self.terminal,
                    end_deadlocks=self.settings.deadlocks.value == "end",
                    expected=item_expectations(item, key.world_size),
                )
            except PoolUnfit as exc:
                self.pools.retire(key, pool, str(exc), graceful=False)
                if attempt == 2:
                    return error_reports(nodeid, where, f"{item.nodeid}: {exc}")
                continue
            except BaseException:
                self.pools.retire(key, pool, "interrupted", graceful=False)
                raise
            return pool, run
        raise AssertionError("unreachable")  # pragma: no cover

    def new_test(self, item: pytest.Item, next_nodeid: str | None) -> RunTest:
        """The message that runs ``item`` on its ranks, with a new index and shared folder."""
        self.next_test_index += 1
        index = self.next_test_index
        shared_dir = str(self.pools.workdir / "shared" / f"{index}-{file_safe(item.name)}")
        return self.crossize.amend(item, RunTest(index, item.nodeid, next_nodeid, shared_dir))

    def timeout_of(self, item: pytest.Item) -> Value[float]:
        """The test's deadline, as in the session (settings.item_timeout)."""
        plan = self.plan.get(item.nodeid) if self.plan else None
        return plan.timeout if plan is not None and plan.timeout else self.settings.timeout

    # -- pools ---------------------------------------------------------------------------------

    def isolate(self, key: PoolKey) -> PoolKey:
        """A key of its own: the pool started for it serves no other test."""
        self.isolated += 1
        return dataclasses.replace(key, isolated=self.isolated)

    def _pool_for(self, key: PoolKey, item: pytest.Item, test_timeout: float) -> Pool:
        """The pool that runs ``item``: its pool's files and tests, or (isolated) its own."""
        pool = self.pools.live.get(key)
        if pool is not None:  # the common case: nothing to compute per test
            problem = pool.check_idle()
            if problem is None:
                return pool
            # A rank died or spoke while idle: the pool is unfit, this test gets a new one.
            self.pools.retire(key, pool, problem, graceful=False)
        shared_key = dataclasses.replace(key, isolated=0)
        nodeids = [item.nodeid] if key.isolated else self.pool_nodeids[shared_key]
        files = sorted({str(item.path)} if key.isolated else self.pool_files[shared_key])
        return self.pools.get(key, nodeids, files, max(START_TIMEOUT, test_timeout))

    # -- session end ---------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Iterator[None]:
        """Stop the pools as soon as the last test ran, inside the other plugins' wrappers.

        pytest-cov combines coverage data when the test loop returns: by then every rank has
        stopped and saved its own data file (see cmdline.coverage_settings).
        """
        result = yield
        self.stop_errors.extend(self.pools.stop_all())
        self.replays.run_all(self, self.fresh.spent)  # on fresh pools, before the fork server stops
        return result

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        errors = [*self.stop_errors, *self.pools.stop_all()]
        reporter = self.config.pluginmanager.getplugin("terminalreporter")
        if errors and reporter is not None:
            reporter.write_sep("=", "distrank: errors tearing down fixtures at session end")
            for error in errors:
                reporter.write_line(error)
        stats_file = os.environ.get(STATS_ENV)
        if stats_file:
            self.stats.dump(stats_file)

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.pools.kill_all()
        self.early.undo()
        for signum in self._taken_signals:
            signal.signal(signum, signal.SIG_DFL)
        # The fork server would take ~0.5-1 s of interpreter shutdown after pytest's exit.
        self.pools.server.stop()
        if self in earlyfork.open_sessions:
            earlyfork.open_sessions.remove(self)
        if self.owns_tracker:  # its start made this process the resource tracker's parent
            _compat.stop_resource_tracker()  # reaped here, not left an orphan (#40)
        if "torch" in sys.modules and not self.nested:
            # The session is over: spare the interpreter's final collection over torch's objects
            # (~0.5 s: interpreter shutdown collects all of torch's objects).
            gc.freeze()

    def install_sigterm(self) -> None:
        """SIGTERM and SIGHUP end the session like Ctrl-C (interrupts.take_signals)."""
        if not self.nested:  # else the process's own session decides what its signals do
            self._taken_signals.extend(take_signals())
