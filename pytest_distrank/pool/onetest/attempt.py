"""One test on one pool: wait by the end-of-test rule, account for every message, judge the rest.

Runs in the controller (pool mode). ``Pool.run`` (pools/pool.py) sends the test to every rank and
hands over to an :class:`Attempt`, which owns what this one test has gathered: the ranks' reports,
the :class:`~endgame.Endgame` state, the sequence numbers and warnings each rank sent with its last
reports. It reaches the ranks only through the :class:`~ranks.Ranks` protocol and waits on their
pipes and sentinels until the rule says the test is over, turns crashes (:mod:`crashes`) and ranks
that did not finish into failed reports saying where each rank was, and runs the checks after the
test (:mod:`outcome.checks`) that decide whether the pool may serve the next test: it *returns* that
verdict (:attr:`TestRun.broken`, :attr:`TestRun.next_base`) for the pool to apply.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pytest import TestReport

from ...outcome.checks import is_own, leftover_notes, sequences_in_step, unmatched
from ...outcome.collectives import Verdict, explain
from ...outcome.endgame import FOREVER, LATE, LATE_REASON, Endgame, Unfinished, failed_itself
from ...outcome.merge import NOTE_ATTR
from ...outcome.records import Reports, RunTest
from ...outcome.reports import (
    Location,
    fill_passed,
    forked_report,
    unfinished_report,
    unmatched_report,
)
from ...outcome.stacks import read_from, signal_name, where_blocked
from ...tree.pooldeadline import add_sections, rank_tree_sections
from ..protocol import DEBUG_MESSAGES, DebugOpen, DebugReply, Fatal, FromRank, RankNote
from .crashes import Crashes
from .deadlock import Watch
from .debugrelay import SIGNAL_CHECK, DebugTerminal, LiveTail
from .exits import Exits, expectation_unmet
from .interrupts import interrupt_signal
from .probes import dump_stacks, flight_records, why_silent
from .ranks import TestRun

if TYPE_CHECKING:
    from .ranks import Rank, Ranks

#: How often the ``--distrank-debug-rank`` rank's log is shown while a test runs.
LIVE_EVERY = 0.1
#: At a deadline, at most this many rounds of messages already waiting are taken before judging.
DRAIN_MAX = 1000

Deserialize = Callable[[Any], TestReport]


@dataclasses.dataclass
class Attempt:
    """One test, sent to every rank of ``pool``; :meth:`run` waits for it and judges it."""

    pool: Ranks
    test: RunTest
    #: Per rank: its groups' sequence numbers after the last test found in step.
    sequence_base: dict[int, dict[str, int]]
    location: Location
    test_file: str
    deserialize: Deserialize
    game: Endgame
    #: Wall clock (ns) when the test was sent: the ranks' flight-recorder records after it count.
    sent_ns: int
    #: The controller's terminal, lent to rank debuggers (None: none may open).
    terminal: DebugTerminal | None = None
    #: ``--distrank-debug-rank``: the rank whose log is shown live.
    live_rank: int | None = None
    #: ``--distrank-deadlocks=end``: end the test early once its records prove a deadlock.
    end_deadlocks: bool = False
    #: The test's expected exits and fired faults (exits.py).
    exits: Exits = dataclasses.field(default_factory=Exits)
    result: TestRun = dataclasses.field(init=False)
    #: The rank ``--pdb`` opened the debugger in (one per test: the first to fail).
    post_mortem_rank: int | None = dataclasses.field(init=False, default=None)
    #: Debugger sessions are over: the test's time is up and its ranks are being judged.
    judging: bool = dataclasses.field(init=False, default=False)
    tail: LiveTail | None = dataclasses.field(init=False, default=None)
    watch: Watch | None = dataclasses.field(init=False, default=None)
    #: Ranks that died, stopped serving or sent reports not their own (crashes.py).
    crashes: Crashes = dataclasses.field(init=False)
    #: The ranks' flight records, once :meth:`_unfinished` has read them.
    fr_dumps: dict[int, dict[str, Any] | None] | None = dataclasses.field(init=False, default=None)

    def __post_init__(self) -> None:
        self.result = TestRun({r.rank: [] for r in self.pool.ranks})
        self.crashes = Crashes(self.pool, self.test, self.location, self.test_file)
        live = next((r for r in self.pool.ranks if r.rank == self.live_rank), None)
        if live is not None and self.terminal is not None and self.terminal.reporter is not None:
            label = f"rank {live.rank}/{self.pool.world_size}"
            self.tail = LiveTail(self.terminal, label, live.log_path, live.log_offset)
        if self.end_deadlocks:
            self.watch = Watch(self.pool, self.game, self.test_file, self.sent_ns)
        if self.exits.expected:  # the survivors run on to show how they handled the death
            self.game.grace = FOREVER

    def run(self) -> TestRun:
        """Wait until the end-of-test rule says the test is over; then judge what is left.

        Returns the verdict for the pool to apply (``broken``, ``next_base``): nothing here
        writes the pool's state.

        An interrupt while waiting (SIGTERM, SIGINT: a CI cancel) ends the test as a deadline
        would: the ranks still running are judged, and the interrupt travels on in the result.
        """
        pool, game = self.pool, self.game
        try:
            self._wait()
        except KeyboardInterrupt as exc:
            game.note_interrupt(time.monotonic(), interrupt_signal(exc))
            self.result.interrupted = exc
            self.unfit(f"interrupted by {game.interrupt} in {self.test.nodeid}")
        if self.tail is not None:
            self.tail.pump(final=True)
        self.judging = True
        if game.pending:
            self._unfinished()
        self.exits.finish(
            self.result.reports, game, self.test.nodeid, self.location, pool.world_size
        )
        if self.crashes.inside:
            self.crashes.explain(self.fr_dumps, self.sent_ns)
        if not pool.closed:
            self._strays()
        if not pool.closed and self.result.broken is None:
            self._check_collectives()
        result = self.result
        result.notes.extend(leftover_notes(self.test.nodeid, result.leftovers, result.between))
        return self.result

    def _wait(self) -> None:
        """Take the ranks' messages until the end-of-test rule says the test is over."""
        pool, game = self.pool, self.game
        while game.pending:
            if game.expired(time.monotonic()):
                # What the ranks sent before the controller looked counts: the controller may
                # have been busy (a slow hook, a stopped process), not the ranks late.
                self._drain()
                if not game.pending or game.expired(time.monotonic()):
                    break
            pending = [r for r in pool.ranks if r.rank in game.pending]
            wait = game.seconds_left(time.monotonic())
            if self.tail is not None:
                wait = LIVE_EVERY if wait is None else min(wait, LIVE_EVERY)
            watch = self.watch
            if watch is not None:
                look = watch.wait(time.monotonic())
                wait = look if wait is None else min(wait, look)
            messages = pool.wait_for(pending, wait)
            for rank, message in messages:
                self._take(rank, message)
            if self.tail is not None:
                self.tail.pump()
            if watch is not None and game.pending:
                # Proven deadlocked: the game's limit is now, and the next round ends the wait.
                if messages:
                    watch.progress(time.monotonic())
                else:
                    watch.look(time.monotonic())

    def _drain(self) -> None:
        """Take every message already waiting in the pending ranks' pipes (bounded: a rank
        that keeps sending cannot hold the controller here)."""
        for _ in range(DRAIN_MAX):
            pending = [r for r in self.pool.ranks if r.rank in self.game.pending]
            messages = self.pool.wait_for(pending, 0.0) if pending else []
            if not messages:
                return
            for rank, message in messages:
                self._take(rank, message)

    def unfit(self, why: str) -> None:
        """The pool must not serve another test (the first reason is kept)."""
        self.result.broken = self.result.broken or why

    # -- messages ------------------------------------------------------------------------------

    def _take(self, rank: Rank, message: FromRank | None) -> None:
        """Account for one message (or the death) of a rank during the test."""
        game, test, result = self.game, self.test, self.result
        if rank.rank not in game.pending:
            return
        if isinstance(message, DEBUG_MESSAGES):
            self._debug(rank, message)
            return
        if isinstance(message, RankNote):
            if self.exits.note(test.index, rank, message):
                game.grace = FOREVER
            return
        if message is None and rank.rank in self.exits.expected:
            self._died_as_expected(rank)
            return
        now = time.monotonic()
        if isinstance(message, Reports) and message.index != test.index:
            # Reports of an earlier test (a fork of it, sending late): credited to no test.
            self.unfit(
                f"rank {rank.rank} sent reports for {message.nodeid} from pid {message.pid} "
                f"during {test.nodeid}: a process forked by that test?"
            )
            return
        if isinstance(message, Reports) and not is_own(rank.pid, message, test):
            self.unfit(f"rank {rank.rank} sent foreign reports in {test.nodeid}")
            report = self.crashes.foreign(rank, message)
            result.reports[rank.rank].append(report)
            game.note_reports(rank.rank, [report], now)
            return  # the rank's own reports may still come; its peers get the grace period
        if isinstance(message, Reports):
            new = [self.deserialize(d) for d in message.reports]
            result.reports[rank.rank].extend(new)
            game.note_reports(rank.rank, new, now)
            if message.done:
                self._finished(rank, message)
            return
        reports = result.reports[rank.rank]
        reports.append(self.crashes.report(rank, message, reports))
        status = "stopped serving" if isinstance(message, Fatal) else "crashed"
        self.unfit(f"rank {rank.rank} {status} in {test.nodeid}")
        game.note_lost(rank.rank, status, now)

    def _died_as_expected(self, rank: Rank) -> None:
        """A rank its test expected to exit died: as expected (passed, noted) or not (a crash
        saying which expectation it did not meet); its pool is replaced either way."""
        rank.process.join(5)
        status = rank.process.exitcode
        death = self.exits.judge(rank.rank, status, read_from(rank.log_path, rank.log_offset))
        reports, nodeid = self.result.reports[rank.rank], self.test.nodeid
        self.unfit(f"rank {rank.rank} exited ({signal_name(status)}) {death.words}in {nodeid}")
        if death.unmet is None:
            fill_passed(reports, nodeid, self.location, "end")
            call = next((r for r in reports if r.when == "call"), reports[-1] if reports else None)
            if call is not None:
                setattr(call, NOTE_ATTR, death.note)
            self.game.lost.add(rank.rank)  # gone, as expected: no grace for its peers
            return
        report = self.crashes.report(rank, None, reports)
        expectation_unmet(report, death.unmet)
        reports.append(report)
        self.game.note_lost(rank.rank, "crashed", time.monotonic())

    def _debug(self, rank: Rank, message: FromRank) -> None:
        """A rank's debugger wants the terminal: serve it alone, the test's clocks stopped."""
        if not isinstance(message, DebugOpen):
            return  # the tail of a session that already ended (its rank died mid-way)
        label = f"rank {rank.rank}/{self.pool.world_size}"
        nodeid = self.test.nodeid
        if self.terminal is None or self.judging:
            rank.conn.send(DebugReply(False, "the test's time is up; its ranks are being stopped"))
            return
        if message.kind == "post_mortem" and not self.terminal.unavailable():
            # (without a terminal every rank's debugger is refused below, saying why)
            if self.post_mortem_rank is not None:
                first = self.post_mortem_rank
                rank.conn.send(DebugReply(False, f"rank {first} failed first"))
                self.terminal.say(f"{label} failed too; --pdb debugs rank {first}, first to fail")
                return
            self.post_mortem_rank = rank.rank

        def receive() -> FromRank | None:
            while True:  # in steps, so that Ctrl-C is seen (debugrelay.SIGNAL_CHECK)
                for _, got in self.pool.wait_for([rank], SIGNAL_CHECK):
                    return got

        started = time.monotonic()
        self.terminal.serve(
            label,
            message,
            nodeid,
            receive,
            rank.conn.send,
            lambda other: self._take(rank, other),
            self.tail if self.tail is not None and self.tail.label == label else None,
        )
        self.game.suspend(time.monotonic() - started)

    def _finished(self, rank: Rank, message: Reports) -> None:
        """The rank's last reports for the test: evidence it finished, and what it left."""
        self.game.note_finished(rank.rank)
        self.result.sequence[rank.rank] = message.sequence
        self.result.warnings[rank.rank] = message.warnings
        self.result.started[rank.rank] = message.started
        if message.forks:
            ws, nodeid, now = self.pool.world_size, self.test.nodeid, time.time()
            after = "The child was killed with the pool, and the pool was replaced."
            report = forked_report(nodeid, self.location, rank.rank, ws, message.forks, after, now)
            self.result.reports[rank.rank].append(report)
            self.unfit(f"{self.test.nodeid} left forked processes")
        if message.pg_problem:
            self.unfit(f"{self.test.nodeid} {message.pg_problem}")
        if message.leftovers:
            self.result.leftovers[rank.rank] = message.leftovers
        if message.between:
            self.result.between[rank.rank] = message.between
        if message.cuda_note:
            ws = self.pool.world_size
            self.result.notes.append(
                f"CUDA memory: {self.test.nodeid} {message.cuda_note} on rank {rank.rank}/{ws}"
            )

    # -- ranks that did not finish -------------------------------------------------------------

    def _unfinished(self) -> None:
        """Ranks the rule gave up on: take their stacks, kill the pool, report where they were.

        Reports that arrive while the stacks are written still count: a rank that sends its last
        reports for the test then has finished it, on evidence (within the grace period; after
        the deadline it finished too late, a timeout).
        """
        pool, game, test, result = self.pool, self.game, self.test, self.result
        stuck = [r for r in pool.ranks if r.rank in game.pending]
        positions = {r.rank: pool.position(r, test) for r in stuck}  # before the dump
        alive = [r for r in pool.ranks if r.process.exitcode is None]
        # Stacks first, records after: faulthandler's dump of every thread (run in a signal
        # handler) reads the other threads' frames unlocked, and crashed a rank (SIGSEGV) whose
        # flight-recorder thread was running Python at that moment, answering the records' signal.
        stacks = dump_stacks(stuck)
        self.fr_dumps = flight_records(alive)
        story = explain(
            self.fr_dumps,
            self.sent_ns,
            {rank: where_blocked(dump, self.test_file) for rank, dump in stacks.items() if dump},
            finished=game.finished,
            lost=game.lost,
            world_size=pool.world_size,
        )
        for rank, message in pool.wait_for(stuck, 0.0):
            self._take(rank, message)
        late = [r for r in stuck if r.rank not in game.pending and game.failed_at is None]
        stuck = [r for r in stuck if r.rank in game.pending]
        silent = {r.rank: why_silent(r.pid) for r in stuck if not stacks[r.rank]}
        tree = rank_tree_sections(test.nodeid, [(r.rank, r.pid) for r in stuck])  # before the kill
        if stuck:
            pool.kill()
        for rank in late:
            stuck.append(rank)
            positions[rank.rank] = LATE
            stacks[rank.rank] = ""
            silent[rank.rank] = LATE_REASON
        if not stuck:
            return
        self_failed = {r.rank for r in stuck if failed_itself(result.reports[r.rank])}
        if any(r not in late for r in stuck):
            self.unfit(self._why_killed(stuck, self_failed))
        now = time.monotonic()
        for rank in stuck:
            pos = positions[rank.rank]
            fill_passed(result.reports[rank.rank], test.nodeid, self.location, pos.when)
            if rank.rank in self_failed:
                # Its own failure is already reported; it was killed while cleaning up after it.
                continue
            dump, no_stack = stacks[rank.rank], silent.get(rank.rank, "")
            info = Unfinished(
                pos,
                dump,
                rank.log_path,
                "killed",
                game,
                now,
                no_stack,
                collective=story.lines.get(rank.rank, "") if story else "",
                verdict=story.verdict if story else Verdict(),
            )
            ws = pool.world_size
            report = unfinished_report(
                test.nodeid, self.location, self.test_file, rank.rank, ws, info, time.time()
            )
            result.reports[rank.rank].append(report)
        add_sections(result.reports, tree)

    def _why_killed(self, stuck: list[Rank], self_failed: set[int]) -> str:
        game, nodeid = self.game, self.test.nodeid
        victims = [r.rank for r in stuck if r.rank not in self_failed]
        names = ", ".join(str(r) for r in victims or sorted(self_failed))
        if game.interrupted_at is not None:
            return f"rank(s) {names} killed when {game.interrupt} interrupted {nodeid}"
        if game.deadlock_at is not None and game.failed_at is None:
            after = game.deadlock_at - game.started
            return f"rank(s) {names} ended after {after:.1f} s in a deadlock in {nodeid}"
        if game.failed_at is None:
            return f"rank(s) {names} timed out after {game.timeout:g} s in {nodeid}"
        if victims:
            return f"rank(s) {names} killed after {game.trigger} in {nodeid}"
        return f"rank(s) {names} killed while tearing down after failing {nodeid}"

    # -- checks after the test (checks.py) -----------------------------------------------------

    def _strays(self) -> None:
        """What finished ranks sent after their last reports: it belongs to no test.

        Reports of this test from another pid (a process the test forked) fail it; a rank that
        died right after finishing makes the pool unfit. One ``select`` per test.
        """
        pool, test = self.pool, self.test
        for rank, message in pool.wait_for(pool.ranks, 0.0):
            if isinstance(message, Reports) and not is_own(rank.pid, message, test):
                report = self.crashes.foreign(rank, message)
                self.result.reports[rank.rank].append(report)
                self.unfit(f"rank {rank.rank} sent foreign reports")
            elif message is None:
                status = signal_name(rank.process.exitcode)
                self.unfit(f"rank {rank.rank} died ({status}) right after {test.nodeid}")

    def _check_collectives(self) -> None:
        """Did every rank issue the same collectives on each group during the test?

        Sequence numbers first (free), the flight recorder only when they differ (checks.py).
        """
        pool, result = self.pool, self.result
        if sequences_in_step(result.sequence, self.sequence_base):
            result.next_base = dict(result.sequence)
            return
        counts = pool.count_collectives()
        if counts is None:
            self.unfit(
                "sequence numbers of a process group differ between ranks after "
                f"{self.test.nodeid} (point-to-point ops, or a collective only some ranks "
                "issued) and the flight recorder could not tell which (TORCH_FR_BUFFER_SIZE=0?): "
                "replaced to be safe"
            )
            return
        ws, nodeid = pool.world_size, self.test.nodeid
        after = "The pool was replaced; the next test runs on fresh ranks."
        for rank, group, crash in unmatched(counts):
            report = unmatched_report(nodeid, self.location, rank, ws, crash, after, time.time())
            result.reports[rank].append(report)
            self.unfit(f"rank {rank} left an unmatched collective on {group} in {nodeid}")
        if result.broken is None:
            result.next_base = dict(result.sequence)
