"""Launcher mode's watchdog: one daemon thread per rank that keeps every wait bounded.

Runs in every rank of a launched world, beside the main thread. The main thread may be stuck in
a C++ collective, where no Python signal handler runs and nothing can interrupt it; this thread
does not need it:

- rank 0 bumps a heartbeat key every second (the other ranks' waits on rank 0 are bounded by it);
  the other ranks write a sign of life every second, and rank 0 reports a rank whose signs
  stopped and whose process is gone (:mod:`liveness`);
- with ``--distrank-deadlocks=end`` (the default) every rank watches its own progress in the
  running test and says when it stands still, and rank 0 judges whether the ranks' records prove
  a deadlock (:mod:`deadwatch`): then the test ends now, as at its deadline;
- while a distributed test runs, rank 0 watches the other ranks' early failures, last reports
  and ended sessions (``pytest.exit()``). When :class:`endgame.Endgame`'s rule ends the wait
  (the rule :func:`gather.gather` follows once the main thread is out of the test) and
  its own main thread is still in the test,
  it finishes the session itself: it synthesizes rank 0's own stuck or timed-out report from its
  stack and hands it to the plugin's ``finish`` callback (which merges it with the peers' reports
  or stacks, reports the remaining tests as not run and lets the terminal summary and junitxml be
  written), then publishes the exit code and exits;
- the other ranks publish their stacks (and their reports and warnings so far, with their pid)
  when their deadline passes or when rank 0 asks (``abort/<test>``), then wait for rank 0's exit
  code and exit with it.

The watchdog gets the rank's :class:`~session.RankSession` and two callbacks, nothing else: what
the main thread is running (``current``) and, on rank 0, how to end the run from here
(``finish``). It writes only what :class:`~current.Current` says it may (``taken_over``,
``stack_sent``, under the session's lock where the main thread races it).
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from collections.abc import Callable

from pytest import TestReport

from ..outcome.collectives import explain, load
from ..outcome.endgame import Position, Unfinished, failed_itself
from ..outcome.reports import fill_passed, unfinished_report
from ..outcome.stacks import where_blocked
from . import keys
from .channel import LOST_EXIT, ChannelError, dump_threads
from .current import Current
from .deadwatch import Judge, SelfWatch
from .early import poll_early, poll_finished, warning_records
from .frrecords import own_records
from .gather import stuck_words
from .liveness import LEAVING, Liveness, beat
from .session import RankSession, open_log

TICK = 0.05
HEARTBEAT_EVERY = 1.0
#: Bound on waiting for rank 0's exit code after this rank was left stuck.
EXIT_WAIT = 60.0

#: Rank 0: end the run from the watchdog with rank 0's own reports of the stuck test; returns
#: the exit code.
Finish = Callable[[Current, list[TestReport]], int]


class Watchdog(threading.Thread):
    """The rank's watchdog thread (daemonic: it never keeps the process alive)."""

    def __init__(
        self, rs: RankSession, current: Callable[[], Current | None], finish: Finish
    ) -> None:
        super().__init__(name="distrank-watchdog", daemon=True)
        self.rs = rs
        self.current = current
        self.finish = finish
        self._beat_at = 0.0
        self._beats = 0
        #: The test and phase of the last sign of life.
        self._where: tuple[int, str] | None = None
        #: Rank 0: the other ranks' signs of life (:mod:`liveness`).
        self.liveness = Liveness(rs)
        self._complained = False
        #: The running test's watch for a proven deadlock (:mod:`deadwatch`).
        self._watch: SelfWatch | None = None
        self._judge: Judge | None = None

    def run(self) -> None:
        stopping = self.rs.stopping
        while not stopping.wait(TICK):
            try:
                self.tick()
            except ChannelError as exc:
                if stopping.is_set():
                    return
                if self.rs.rank != 0:
                    self.rs.lost(exc)
                self._complain(f"control channel error: {exc}")
            except Exception:
                self._complain(traceback.format_exc())

    def _complain(self, text: str) -> None:
        if not self._complained:
            self._complained = True
            self.rs.log(f"pytest-distrank: {self.rs.launch.label()}: watchdog: {text}")

    def tick(self) -> None:
        rs = self.rs
        now = time.monotonic()
        cur = self.current()
        where = (cur.index, cur.when) if cur is not None else None
        if now - self._beat_at >= HEARTBEAT_EVERY or (rs.rank != 0 and where != self._where):
            self._beats += 1
            if rs.rank == 0:
                rs.channel.add(keys.HEARTBEAT, 1)
                self.liveness.look(now)
            else:  # every second, and as soon as it is in another test or phase
                beat(rs, cur, self._beats)
            self._beat_at, self._where = now, where
        if cur is None or cur.done:
            return
        rs = cur.view or rs  # a sub-world's test: its rank 0 watches its peers
        game = cur.game
        watch = self._watch_of(cur)
        if watch is not None:
            watch.tick(now)
        if rs.rank == 0:
            # Rank 0 itself is pending until its main thread is done (then gather decides).
            poll_early(rs, cur)
            if self._judge is not None and watch is not None:
                self._judge.look(now, watch.beacon)
            if game.seconds_left(now) == 0.0:
                poll_finished(rs, cur)  # who is left decides whether FINISH_WAIT applies
                if game.expired(now):
                    self._take_over(cur)
            return
        deadline = game.deadline
        late = deadline is not None and now >= deadline
        abort = rs.channel.has(keys.abort(cur.index))
        if (late or abort) and not cur.stack_sent:
            self._send_stack(cur, "its deadline passed" if late else "rank 0 asked")
        if abort or rs.channel.has(keys.EXIT):
            self._leave_stuck(cur)

    def _watch_of(self, cur: Current) -> SelfWatch | None:
        """This rank's own watch over ``cur`` (and rank 0's judge), made at its first tick; None
        with ``--distrank-deadlocks=wait``."""
        if not cur.end_deadlocks:
            return None
        if self._watch is None or self._watch.cur is not cur:
            view = cur.view or self.rs
            self._watch = SelfWatch(view, cur)
            self._judge = Judge(view, cur) if view.rank == 0 else None
        return self._watch

    # -- ranks other than 0 --------------------------------------------------------------------

    def _send_stack(self, cur: Current, why: str) -> None:
        rs = cur.view or self.rs
        dump = dump_threads(rs.main_ident)
        rs.log(
            f"distrank: {rs.launch.label()}: stacks in {cur.when} of {cur.item.nodeid} "
            f"({why}):\n{dump}"
        )
        payload: keys.Stack = {
            "dump": dump,
            "when": cur.when,
            "reports": [rs.serialize(r) for r in list(cur.reports)],
            "warnings": warning_records(cur.caught),
            "records": own_records(cur),
            "since_ns": cur.started_ns,
            **keys.identity(cur.index, cur.item.nodeid),
        }
        rs.channel.put(keys.stack(cur.index, rs.rank), payload)
        cur.stack_sent = True

    def _leave_stuck(self, cur: Current) -> None:
        rs = self.rs
        with rs.lock:
            if cur.done:
                return  # the main thread finished after all; rank 0's verdict reaches it
            cur.taken_over = True
        where = where_blocked(dump_threads(rs.main_ident), str(cur.item.path))
        with contextlib.suppress(ChannelError):
            beat(rs, cur, -1, LEAVING)  # no more signs of life: it waits for rank 0's end
        rs.log(
            f"distrank: {rs.launch.label()}: rank 0 ended the test while this rank was still "
            f"in {cur.when} of {cur.item.nodeid} ({where}); leaving with rank 0's exit code"
        )
        code = LOST_EXIT
        with contextlib.suppress(ChannelError):
            until = time.monotonic() + EXIT_WAIT
            if rs.channel.wait_any([keys.EXIT], until, watch_rank0=True) == keys.EXIT:
                code = rs.channel.get(keys.EXIT, keys.read_exit)
                rs.log(f"distrank: {rs.launch.label()}: exit code {code} (rank 0's)")
        rs.leave(code, from_watchdog=True)

    # -- rank 0 --------------------------------------------------------------------------------

    def _take_over(self, cur: Current) -> None:
        """Rank 0's main thread is stuck in the test: report it and end the session from here."""
        rs = self.rs
        with rs.lock:
            if cur.done or cur.taken_over:
                return
            cur.taken_over = True
        code = 1
        try:
            code = self.finish(cur, self._own_reports(cur))
        except BaseException:
            rs.log(
                f"pytest-distrank: {rs.launch.label()}: error while ending the run from the "
                f"watchdog:\n{traceback.format_exc()}"
            )
        rs.leave(code, from_watchdog=True)

    def _own_reports(self, cur: Current) -> list[TestReport]:
        rs = cur.view or self.rs
        item = cur.item
        reports = list(cur.reports)
        out, err = self._suspend_capture()
        pos = Position.in_phase(cur.when)
        fill_passed(reports, item.nodeid, item.location, pos.when)
        if failed_itself(reports):
            return reports  # rank 0's own failure is the story; it was stuck cleaning up
        dump = dump_threads(rs.main_ident)
        with contextlib.suppress(OSError), open_log(rs.log_path, append=True) as log:
            log.write(f"stacks of all threads in {pos.when} of {item.nodeid}:\n{dump}\n")
        records = own_records(cur)
        own = explain({0: load(records)}, {0: cur.started_ns})
        collective = own.lines.get(0, "") if own else ""
        cur.stuck_at[0] = stuck_words(collective, dump, bool(records), str(item.path))
        info = Unfinished(
            pos,
            dump,
            rs.log_path,
            "stuck",
            cur.game,
            time.monotonic(),
            collective=collective,
        )
        report = unfinished_report(
            item.nodeid, item.location, str(item.path), 0, rs.world_size, info, time.time()
        )
        for name, text in (("stdout", out), ("stderr", err)):
            if text:
                report.sections.append((f"Captured {name} {pos.when}", text))
        reports.append(report)
        return reports

    def _suspend_capture(self) -> tuple[str, str]:
        """Give the terminal back (the stuck test's capture is active) and read its output."""
        capman = self.rs.config.pluginmanager.getplugin("capturemanager")
        if capman is None:
            return "", ""
        with contextlib.suppress(Exception):
            capman.suspend_global_capture(in_=True)
            out, err = capman.read_global_capture()
            return str(out), str(err)
        return "", ""
