"""Launcher mode's watchdog: one daemon thread per rank that keeps every wait bounded.

Runs in every rank of a launched world, beside the main thread. The main thread may be stuck in
a C++ collective, where no Python signal handler runs and nothing can interrupt it; this thread
does not need it:

- rank 0 bumps a heartbeat key every second (the other ranks' waits on rank 0 are bounded by it);
- while a distributed test runs, rank 0 watches the other ranks' early failures, last reports
  and ended sessions (``pytest.exit()``). When :class:`endgame.Endgame`'s rule ends the wait
  (the rule :func:`gather.gather` follows once the main thread is out of the test) and
  its own main thread is still in the test,
  it finishes the session itself: it reports the test (rank 0's own stuck or timed-out report,
  synthesized from its stack, merged with the peers' reports or stacks), reports the remaining
  tests as not run, lets the terminal summary and junitxml be written
  (``pytest_sessionfinish``, ``pytest_unconfigure``), publishes the exit code and exits;
- the other ranks publish their stacks (and their reports and warnings so far, with their pid)
  when their deadline passes or when rank 0 asks (``abort/<test>``), then wait for rank 0's exit
  code and exit with it.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from typing import TYPE_CHECKING

import pytest
from pytest import TestReport

from .. import _compat
from ..endgame import Position, Unfinished, failed_itself, fill_passed, unfinished_report
from ..stacks import where_blocked
from ..warnings_relay import forward_warnings
from .channel import LOST_EXIT, ChannelError, dump_threads
from .gather import (
    Current,
    gather,
    left_stuck,
    poll_early,
    poll_finished,
    stopped_serving,
    warnings_of,
)
from .rank import identity, warning_records

if TYPE_CHECKING:
    from .plugin import LaunchPlugin

TICK = 0.05
HEARTBEAT_EVERY = 1.0
#: Bound on waiting for rank 0's exit code after this rank was left stuck.
EXIT_WAIT = 60.0


class Watchdog(threading.Thread):
    """The rank's watchdog thread (daemonic: it never keeps the process alive)."""

    def __init__(self, plugin: LaunchPlugin) -> None:
        super().__init__(name="distrank-watchdog", daemon=True)
        self.plugin = plugin
        self._stopped = threading.Event()
        self._beat_at = 0.0
        self._complained = False

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        while not self._stopped.wait(TICK):
            try:
                self.tick()
            except ChannelError as exc:
                if self._stopped.is_set():
                    return
                if self.plugin.rank != 0:
                    self.plugin._lost(exc)
                self._complain(f"control channel error: {exc}")
            except Exception:
                self._complain(traceback.format_exc())

    def _complain(self, text: str) -> None:
        if not self._complained:
            self._complained = True
            self.plugin.log(f"distrank: {self.plugin.launch.label()}: watchdog: {text}")

    def tick(self) -> None:
        plugin = self.plugin
        assert plugin.channel is not None
        now = time.monotonic()
        if plugin.rank == 0 and now - self._beat_at >= HEARTBEAT_EVERY:
            plugin.channel.add("heartbeat", 1)
            self._beat_at = now
        cur = plugin.current
        if cur is None or cur.done:
            return
        game = cur.game
        if plugin.rank == 0:
            # Rank 0 itself is pending until its main thread is done (then gather decides).
            poll_early(plugin, cur)
            if game.seconds_left(now) == 0.0:
                poll_finished(plugin, cur)  # who is left decides whether FINISH_WAIT applies
                if game.expired(now):
                    self._take_over(cur)
            return
        deadline = game.deadline
        late = deadline is not None and now >= deadline
        abort = plugin.channel.has(f"abort/{cur.index}")
        if (late or abort) and not cur.stack_sent:
            self._send_stack(cur, "its deadline passed" if late else "rank 0 asked")
        if abort or plugin.channel.has("exit"):
            self._leave_stuck(cur)

    # -- ranks other than 0 --------------------------------------------------------------------

    def _send_stack(self, cur: Current, why: str) -> None:
        plugin = self.plugin
        assert plugin.channel is not None
        dump = dump_threads(plugin.main_ident)
        plugin.log(
            f"distrank: {plugin.launch.label()}: stacks in {cur.when} of {cur.item.nodeid} "
            f"({why}):\n{dump}"
        )
        payload = {
            "dump": dump,
            "when": cur.when,
            "reports": [plugin.serialize(r) for r in list(cur.reports)],
            "warnings": warning_records(cur.caught),
            **identity(cur.index, cur.item.nodeid),
        }
        plugin.channel.put(f"stack/{cur.index}/{plugin.rank}", payload)
        cur.stack_sent = True

    def _leave_stuck(self, cur: Current) -> None:
        plugin = self.plugin
        assert plugin.channel is not None
        with plugin.lock:
            if cur.done:
                return  # the main thread finished after all; rank 0's verdict reaches it
            cur.taken_over = True
        where = where_blocked(dump_threads(plugin.main_ident), str(cur.item.path))
        plugin.log(
            f"distrank: {plugin.launch.label()}: rank 0 ended the run while this rank was still "
            f"in {cur.when} of {cur.item.nodeid} ({where}); leaving with rank 0's exit code"
        )
        code = LOST_EXIT
        with contextlib.suppress(ChannelError):
            until = time.monotonic() + EXIT_WAIT
            if plugin.channel.wait_any(["exit"], until, watch_rank0=True) == "exit":
                code = int(plugin.channel.get("exit"))
        plugin.exit_code = code
        plugin.leave(code, from_watchdog=True)

    # -- rank 0 --------------------------------------------------------------------------------

    def _take_over(self, cur: Current) -> None:
        """Rank 0's main thread is stuck in the test: report it and end the session from here."""
        plugin = self.plugin
        with plugin.lock:
            if cur.done or cur.taken_over:
                return
            cur.taken_over = True
        code = 1
        try:
            own = self._own_reports(cur)
            per_rank, stuck, _ = gather(plugin, cur, own)
            merged = plugin.merge(cur, per_rank)
            forward_warnings(cur.item, warnings_of(cur), plugin.world_size)
            plugin.aborted = True
            plugin.ended = stopped_serving(cur) if cur.stopped else left_stuck(cur, [0, *stuck])
            plugin.current = None
            ihook = cur.item.ihook
            for report in merged:
                ihook.pytest_runtest_logreport(report=report)
            ihook.pytest_runtest_logfinish(nodeid=cur.item.nodeid, location=cur.item.location)
            plugin.log_not_run_after(cur.index, plugin.ended)
            code = self._finish_session()
        except BaseException:
            plugin.log(
                f"pytest-distrank: {plugin.launch.label()}: error while ending the run from the "
                f"watchdog:\n{traceback.format_exc()}"
            )
        plugin.exit_code = code
        plugin.leave(code, from_watchdog=True)

    def _own_reports(self, cur: Current) -> list[TestReport]:
        plugin = self.plugin
        item = cur.item
        reports = list(cur.reports)
        out, err = self._suspend_capture()
        pos = Position.in_phase(cur.when)
        fill_passed(reports, item.nodeid, item.location, pos.when)
        if failed_itself(reports):
            return reports  # rank 0's own failure is the story; it was stuck cleaning up
        dump = dump_threads(plugin.main_ident)
        with contextlib.suppress(OSError), open(plugin.log_path, "a", encoding="utf-8") as log:
            log.write(f"stacks of all threads in {pos.when} of {item.nodeid}:\n{dump}\n")
        info = Unfinished(pos, dump, plugin.log_path, "stuck", cur.game, time.monotonic())
        report = unfinished_report(
            item.nodeid, item.location, str(item.path), 0, plugin.world_size, info, time.time()
        )
        for name, text in (("stdout", out), ("stderr", err)):
            if text:
                report.sections.append((f"Captured {name} {pos.when}", text))
        reports.append(report)
        return reports

    def _suspend_capture(self) -> tuple[str, str]:
        """Give the terminal back (the stuck test's capture is active) and read its output."""
        capman = self.plugin.config.pluginmanager.getplugin("capturemanager")
        if capman is None:
            return "", ""
        with contextlib.suppress(Exception):
            capman.suspend_global_capture(in_=True)
            out, err = capman.read_global_capture()
            return str(out), str(err)
        return "", ""

    def _finish_session(self) -> int:
        """What pytest does after its test loop: session finish (summary, junitxml), unconfigure.

        Fixture teardown is skipped: fixtures set up for the stuck test may themselves wait on
        the stuck group, and the main thread is still inside the test.
        """
        plugin = self.plugin
        session = plugin.session
        assert session is not None
        code = pytest.ExitCode.TESTS_FAILED if session.testsfailed else pytest.ExitCode.OK
        session.exitstatus = code
        _compat.forget_setup_stack(session)
        plugin.config.hook.pytest_sessionfinish(session=session, exitstatus=code)
        with contextlib.suppress(Exception):
            _compat.ensure_unconfigure(plugin.config)
        return int(session.exitstatus)
