"""The end of one distributed test, written once for both modes.

Runs wherever a test's outcome is decided: in the controller (pool mode, :mod:`pool`) and in
rank 0 of a launched world (launcher mode, :mod:`launch.gather` in its main thread and
:mod:`launch.watchdog` in its watchdog thread). Pure logic over time stamps and reports: no
torch, no processes, no clock of its own (callers pass ``now``), so that it is unit-tested
without ranks (``tests/unit/test_endgame.py``).

The rule:

- A rank has finished a test only on **positive evidence**: its last batch of reports for that
  very test arrived (:meth:`Endgame.note_finished`). What a rank was last seen doing (a phase in
  shared memory, an idle main loop) is never evidence: a rank killed before its setup began, or
  after its teardown but before its reports were sent, did not pass.
- Waiting ends at the test's deadline, or ``grace`` seconds after the first rank failed,
  skipped or was lost (crashed, stopped serving), whichever comes first.
- When that moment comes and only ranks that failed themselves are still running (nobody waits
  on them in a collective), they get :data:`FINISH_WAIT` once more to finish their teardown.
- A failed *subtest* is not the end of a rank's test (its later subtests and collectives still
  run): it starts no grace period. Neither does an xfail.
- Ranks still running then are reported from outside (:func:`reports.unfinished_report`): as
  collateral when a peer failed or skipped first, as timed out otherwise, saying where each was.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from pytest import TestReport

from ..envvars import seam_wait
from .collectives import Verdict
from .merge import CAUSE_ATTR, COLLATERAL_ATTR, NOTE_ATTR, VERDICT_ATTR

Location = tuple[str, int | None, str]

#: When the grace period ends and only ranks that failed themselves are left: their extra time
#: (``DISTRANK_TEST_WAITS`` sets it for the plugin's own tests: envvars.seam_wait).
FINISH_WAIT = seam_wait(5.0)
#: How long ranks asked for their stacks get to write them (likewise).
DUMP_WAIT = seam_wait(3.0)
#: Longer than any test could sensibly take (a year): a deadline beyond it means "no deadline".
#: Every single wait is clamped to :data:`MAX_WAIT`, so ``inf`` or ``10**7`` never overflows.
FOREVER = 365 * 24 * 3600.0


def effective_timeout(seconds: float) -> float | None:
    """A test's deadline in seconds from its start, or None for no deadline.

    ``<= 0`` (pytest-timeout's "off"), NaN and anything beyond :data:`FOREVER` mean none.
    """
    if math.isnan(seconds) or seconds <= 0 or seconds >= FOREVER:
        return None
    return seconds


#: The longest single wait: ``poll()`` takes milliseconds in a C int (24.8 days at most).
#: Callers loop, so a longer deadline is waited for in steps.
MAX_WAIT = 24 * 3600.0


def clamp_wait(seconds: float | None) -> float | None:
    """A wait bound fit for ``select``/``poll``: None stays None; huge values are cut."""
    if seconds is None:
        return None
    if math.isnan(seconds):
        return MAX_WAIT
    return min(max(0.0, seconds), MAX_WAIT)


def is_subtest(report: TestReport) -> bool:
    """A report of one subtest (pytest's ``subtests`` fixture), not of the test itself."""
    return hasattr(report, "context") and type(report).__name__ == "SubtestReport"


def grace_trigger(report: TestReport) -> str | None:
    """``"failed"`` or ``"skipped"`` when ``report`` starts the peers' grace period, else None.

    A plain skip starts it (the rank will not take part in the test's collectives: peers
    waiting for it in one would hang); an xfail, a subtest and a pass do not.
    """
    if is_subtest(report):
        return None
    if report.failed:
        return "failed"
    if report.skipped and not hasattr(report, "wasxfail"):
        return "skipped"
    return None


@dataclasses.dataclass
class Endgame:
    """The state of one running test across its ranks, and when to stop waiting for them."""

    ranks: frozenset[int]
    started: float
    #: The test's deadline in seconds from ``started`` (see :func:`effective_timeout`).
    timeout: float
    #: ``--distrank-failure-grace``.
    grace: float
    #: Where the timeout came from, for the report ("marker", "--distrank-timeout", ...).
    timeout_source: str = ""
    finish_wait: float = FINISH_WAIT
    #: When the first rank failed, skipped or was lost, and what it was ("rank 1 failed").
    failed_at: float | None = None
    trigger: str = ""
    #: Ranks that failed on their own (a failed report, a crash): never collateral.
    failed: set[int] = dataclasses.field(default_factory=set)
    #: Ranks whose last reports for this test arrived: the only evidence of finishing.
    finished: set[int] = dataclasses.field(default_factory=set)
    #: Ranks that are gone (crashed, stopped serving): not waited for, not finished.
    lost: set[int] = dataclasses.field(default_factory=set)
    finishing: bool = False
    #: When the ranks' flight records proved a deadlock (monotonic seconds): the test ends
    #: then, before its deadline (:mod:`pool.deadlock`). None: no deadlock proven.
    deadlock_at: float | None = None
    #: When a signal interrupted the session during the test (monotonic seconds), and which
    #: ("SIGTERM"): the test ends then, reported as a deadline would report it.
    interrupted_at: float | None = None
    interrupt: str = ""

    @property
    def deadline(self) -> float | None:
        seconds = effective_timeout(self.timeout)
        return None if seconds is None else self.started + seconds

    @property
    def pending(self) -> set[int]:
        """Ranks still running the test as far as anyone knows."""
        return set(self.ranks) - self.finished - self.lost

    def _start_grace(self, now: float, why: str) -> None:
        if self.failed_at is None:
            self.failed_at, self.trigger = now, why

    def note_reports(self, rank: int, reports: Iterable[TestReport], now: float) -> None:
        """Reports of ``rank`` arrived (not necessarily its last)."""
        for report in reports:
            kind = grace_trigger(report)
            if kind is not None:
                self.note_trigger(rank, kind, now)

    def note_trigger(self, rank: int, kind: str, now: float) -> None:
        """``rank`` said it ``kind`` (:func:`grace_trigger`'s "failed" or "skipped") before its
        reports arrived (launcher mode's early message): the same as such a report."""
        if kind == "failed":
            self.failed.add(rank)
        self._start_grace(now, f"rank {rank} {kind}")

    def note_finished(self, rank: int) -> None:
        """Positive evidence: ``rank``'s last reports for this test arrived."""
        self.finished.add(rank)

    def suspend(self, seconds: float) -> None:
        """A debugger held the test for ``seconds``: its deadline and grace move by as much."""
        self.started += seconds
        if self.failed_at is not None:
            self.failed_at += seconds

    def note_lost(self, rank: int, what: str, now: float) -> None:
        """``rank`` is gone (``what``: "crashed", "stopped serving"): its peers get the grace."""
        self.lost.add(rank)
        self.failed.add(rank)
        self._start_grace(now, f"rank {rank} {what}")

    def note_deadlock(self, now: float) -> None:
        """The flight records prove the test can never finish: stop waiting now."""
        if self.deadlock_at is None:
            self.deadlock_at = now

    def note_interrupt(self, now: float, signal_name: str) -> None:
        """The session was interrupted (a CI cancel, Ctrl-C): stop waiting now."""
        if self.interrupted_at is None:
            self.interrupted_at, self.interrupt = now, signal_name

    def limit(self) -> float | None:
        """The moment waiting ends (monotonic seconds), or None: wait for evidence only."""
        limit = self.deadline
        for end in (self.deadlock_at, self.interrupted_at):
            if end is not None:
                limit = end if limit is None else min(limit, end)
        if self.failed_at is not None:
            end = self.failed_at + self.grace + (self.finish_wait if self.finishing else 0.0)
            limit = end if limit is None else min(limit, end)
        return limit

    def seconds_left(self, now: float) -> float | None:
        """How long a wait may block now (clamped; None: no bound)."""
        limit = self.limit()
        return None if limit is None else clamp_wait(limit - now)

    def expired(self, now: float) -> bool:
        """Whether to stop waiting; extends the wait once when only self-failed ranks are left."""
        limit = self.limit()
        if limit is None or now < limit:
            return False
        deadline = self.deadline
        if (
            self.failed_at is not None
            and not self.finishing
            and self.pending <= self.failed
            and (deadline is None or now < deadline)
        ):
            # Only ranks that failed themselves are left, tearing down: no peer is stuck
            # waiting for them, so give them a moment before killing.
            self.finishing = True
            limit = self.limit()
            return limit is not None and now >= limit
        return True

    def is_collateral(self, rank: int) -> bool:
        """``rank`` did not finish because a peer failed or skipped first."""
        return self.failed_at is not None and rank not in self.failed


# -- ranks that did not finish: where they were ----------------------------------------------


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a rank was in a test when it was last seen, in words."""

    #: The pytest phase its report goes under.
    when: str
    #: Follows "timed out" / "killed": "in call", "before its setup began".
    at: str
    #: Follows "Timeout: ": "still in call", "its setup had not begun".
    still: str

    @classmethod
    def in_phase(cls, when: str) -> Position:
        return cls(when, f"in {when}", f"still in {when}")


BEFORE_SETUP = Position("setup", "before its setup began", "its setup had not begun")
AFTER_TEARDOWN = Position(
    "teardown",
    "after its teardown, before its reports were sent",
    "its teardown ended but its reports never came",
)
NOT_RECEIVED = Position(
    "setup", "before it took the test from its pipe", "it had not taken the test"
)

#: A rank whose last reports came only after the deadline, while its stack was being taken: the
#: test ran past its deadline, a failure of the test (its phase reports stay as they were).
LATE = Position("call", "late", "finished late")
LATE_REASON = "its last reports arrived only after the deadline"


@dataclasses.dataclass(frozen=True)
class Unfinished:
    """Why a rank is reported from outside, and what is known of it."""

    position: Position
    #: Its threads' stacks (faulthandler format), or "" when it did not answer.
    dump: str
    log: str
    #: "killed" (pool mode: the rank is ended) or "stuck" (launcher mode: it is left running).
    verb: str
    endgame: Endgame
    now: float
    #: Why there is no stack, when ``dump`` is empty and something is known.
    no_dump_reason: str = ""
    #: The collective it is in, from its flight recorder (:mod:`collectives`), or "".
    collective: str = ""
    #: Who is out of step, from every rank's flight recorder.
    verdict: Verdict = dataclasses.field(default_factory=Verdict)


#: On a rank's report that :func:`reports.unfinished_report` wrote as timed out (or ended by a
#: deadlock): how it ended, in the table's words, for :func:`note_verdict`.
ENDING_ATTR = "distrank_ending"


def note_verdict(report: TestReport, rank: int, verdict: Verdict) -> None:
    """The collective verdict on a rank's report written before it was known (launcher mode's
    rank 0, reported by its watchdog before its peers' records arrived): its blame, and the
    "waited in ... for rank 2" words when the rank only waited for the blamed ranks."""
    ending = getattr(report, ENDING_ATTR, None)
    if ending is None:
        return
    if verdict.text:
        setattr(report, VERDICT_ATTR, verdict.text)
    if verdict.root:
        setattr(report, CAUSE_ATTR, (verdict.root, verdict.subject, verdict.predicate))
    waited = verdict.waited.get(rank)
    if waited:
        setattr(report, NOTE_ATTR, f"{waited}; {ending}")
        setattr(report, COLLATERAL_ATTR, True)


def failed_itself(reports: Iterable[TestReport]) -> bool:
    """A rank's own failure is among ``reports`` (a failed subtest does not count): when it did
    not finish, it was cleaning up after that failure, which is the story to tell."""
    return any(r.failed and not is_subtest(r) for r in reports)
