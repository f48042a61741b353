"""One test's ranks that died, stopped serving or sent reports not their own: what each report says.

Runs in the controller (pool mode), for :class:`attempt.Attempt`. A rank that died says where it
was, with what signal and its output; one that died inside a collective is remembered, and once
the attempt has waited, its peers' flight records say what that collective was waiting for
(:meth:`Crashes.explain`). Reports that are not the rank's own process's for this test fail it
(:meth:`Crashes.foreign`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from pytest import TestReport

from ...outcome.checks import foreign_crash
from ...outcome.collectives import crash_verdict
from ...outcome.merge import VERDICT_ATTR
from ...outcome.records import Reports, RunTest
from ...outcome.reports import Location, check_failure, crashed_report, fill_passed, stopped_report
from ...outcome.stacks import collective_entered, read_from, signal_name, trim_fault_dump
from ..protocol import Fatal
from .probes import flight_records

if TYPE_CHECKING:
    from .ranks import Rank, Ranks


@dataclasses.dataclass
class Crashes:
    """The crash reports of one test on ``pool``, and the collectives its ranks died inside."""

    pool: Ranks
    test: RunTest
    location: Location
    test_file: str
    #: Ranks that died inside a collective: (exit status, the collective and where, in words).
    inside: dict[int, tuple[str, str]] = dataclasses.field(default_factory=dict)
    #: Those ranks' reports, where :meth:`explain` puts its verdict.
    reports: dict[int, TestReport] = dataclasses.field(default_factory=dict)

    def report(self, rank: Rank, message: object, earlier: list[TestReport]) -> TestReport:
        """A rank that died or stopped serving during the test: what it was doing, its output.

        ``earlier`` (the rank's reports so far) gets the passed phases before the one it was in.
        """
        nodeid, where, now, ws = self.test.nodeid, self.location, time.time(), self.pool.world_size
        pos = self.pool.position(rank, self.test)
        fill_passed(earlier, nodeid, where, pos.when)
        if isinstance(message, Fatal):
            return stopped_report(nodeid, where, pos.when, pos.at, message.message, now)
        rank.process.join(5)
        status = signal_name(rank.process.exitcode)
        output = trim_fault_dump(read_from(rank.log_path, rank.log_offset), self.test_file)
        crash = f"crashed {pos.at} with {status}"
        entered = collective_entered(output, self.test_file)
        if entered:
            crash += f" inside {entered.split(',')[0]}"
            self.inside[rank.rank] = (status, entered)
        log = str(rank.log_path)
        report = crashed_report(nodeid, where, pos.when, rank.rank, ws, crash, output, log, now)
        if rank.rank in self.inside:
            self.reports[rank.rank] = report
        return report

    def foreign(self, rank: Rank, message: Reports) -> TestReport:
        """Reports that are not ``rank``'s own process's for this test (checks.is_own)."""
        test = self.test
        crash = foreign_crash(rank.pid, message.pid, message.index, message.nodeid, test.index)
        if message.pid != rank.pid:
            more = (
                "A process forked by the test (os.fork(), multiprocessing's fork) that returns "
                "into pytest runs the rest of the test again and sends its reports down the "
                "rank's pipe. End such a child with os._exit() (or use subprocess or the "
                "'spawn' start method); the rank's pool was replaced."
            )
        else:
            more = "The rank's pipe is out of step with the controller; the pool was replaced."
        ws, now = self.pool.world_size, time.time()
        return check_failure(test.nodeid, self.location, rank.rank, ws, crash, more, now)

    def explain(self, dumps: dict[int, dict[str, Any] | None] | None, sent_ns: int) -> None:
        """Ranks that died inside a collective: what their peers' flight recorders say.

        The verdict goes on the first such rank's report (``collectives:`` under the summary).
        ``dumps``: the records the attempt read already when peers were stuck (and told its own
        story of them); None when no rank was stuck: the survivors are idle, asked now.
        ``sent_ns``: when the test was sent (the records after it count).
        """
        pool = self.pool
        if dumps is None:
            alive = [r for r in pool.ranks if r.process.exitcode is None]
            if not alive:
                return
            dumps = flight_records(alive)
        rank = min(self.inside)
        status, entered = self.inside[rank]
        verdict = crash_verdict(rank, status, entered, dumps, sent_ns, "gloo" in pool.backend)
        setattr(self.reports[rank], VERDICT_ATTR, verdict)
