"""Expected deaths and injected faults in one test: what :class:`attempt.Attempt` asks.

Runs in the controller (pool mode). A test's expectations (outcome/expectations.py) come from
its ``expect_rank_exit`` markers before it is sent, and from its ranks during it
(:class:`~protocol.RankNote`: a ``faults.kill`` about to fire, a harness class's
``special_return_code_checks``). While any rank is expected to exit, the failure grace is off:
the survivors run to the end of the test or its deadline, to show how they handled the death.

A rank's marker and a fault that kills it are both checked: its death must meet each (a
``faults.kill`` by SIGKILL never meets ``exit_code=3``). A rank that died as expected gets passed
reports, its row saying so; its pool is replaced as after any crash. One that died another way is
a crash whose row says which expectation was not met; one that survived fails the test the same
way. Every injected fault that fired is listed in
its rank's report (a section ``distrank: injected fault``), so nobody mistakes it for a real
crash.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from ..outcome.endgame import FOREVER, fill_passed
from ..outcome.expectations import (
    ExpectedExit,
    met_note,
    survived,
    unmet_death,
)
from ..outcome.merge import NOTE_ATTR, synthesized_failure
from ..outcome.stacks import read_from, signal_name
from .protocol import RankNote

if TYPE_CHECKING:
    from pytest import TestReport

    from .attempt import Attempt
    from .pool import Rank

#: The title of the report section that lists a rank's injected faults.
SECTION = "distrank: injected fault"


@dataclasses.dataclass
class Exits:
    """One test's expected exits and fired faults, per rank."""

    expected: dict[int, ExpectedExit] = dataclasses.field(default_factory=dict)
    #: Per rank: (phase, line) of each injected fault that fired there.
    injected: dict[int, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)
    #: Ranks that died the way they were expected to.
    met: set[int] = dataclasses.field(default_factory=set)
    #: Per rank, an earlier expectation (its marker's) that a later one (a kill's) joined: the
    #: death must meet both.
    earlier: dict[int, ExpectedExit] = dataclasses.field(default_factory=dict)

    def start(self, attempt: Attempt) -> None:
        if self.expected:
            attempt.game.grace = FOREVER

    def note(self, attempt: Attempt, rank: Rank, message: RankNote) -> None:
        """A rank's :class:`~protocol.RankNote` (sent before it acts), credited only when it
        is this test's and came from that rank's own process through its own pipe."""
        if (message.index, message.rank, message.pid) != (attempt.test.index, rank.rank, rank.pid):
            return
        if message.injected:
            self.injected.setdefault(message.rank, []).append((message.when, message.injected))
        if message.source and message.code is None:  # it lived: judged in the rank
            self.expected.pop(message.rank, None)
            if message.rank in self.earlier:
                self.expected[message.rank] = self.earlier.pop(message.rank)
        elif message.source:
            old = self.expected.get(message.rank)
            if old is not None and old.source != message.source:
                self.earlier.setdefault(message.rank, old)
            self.expected[message.rank] = ExpectedExit(
                message.rank, message.code, "", message.source
            )
            attempt.game.grace = FOREVER

    def died(self, attempt: Attempt, rank: Rank) -> bool:
        """``rank`` died during the test; True when it was expected to exit (handled here)."""
        expected = self.expected.get(rank.rank)
        if expected is None:
            return False
        test, now = attempt.test, time.monotonic()
        rank.process.join(5)
        status = rank.process.exitcode
        output = read_from(rank.log_path, rank.log_offset)
        earlier = self.earlier.get(rank.rank)
        why = unmet_death(expected, status, output) or (
            None if earlier is None else unmet_death(earlier, status, output)
        )
        reports = attempt.result.reports[rank.rank]
        attempt.pool.broken = attempt.pool.broken or (
            f"rank {rank.rank} exited ({signal_name(status)}) "
            f"{'as expected ' if why is None else ''}in {test.nodeid}"
        )
        if why is None:
            self.met.add(rank.rank)
            fill_passed(reports, test.nodeid, attempt.location, "end")
            call = next((r for r in reports if r.when == "call"), reports[-1] if reports else None)
            if call is not None:
                setattr(call, NOTE_ATTR, met_note(expected, status))
            attempt.game.lost.add(rank.rank)  # gone, as expected: no grace for its peers
            return True
        report = attempt._crash_report(rank, None)
        _expectation_unmet(report, why)
        reports.append(report)
        attempt.game.note_lost(rank.rank, "crashed", now)
        return True

    def finish(self, attempt: Attempt) -> None:
        """After the wait: ranks that were expected to exit and did not; the fired faults."""
        result, test, ws = attempt.result, attempt.test, attempt.pool.key.world_size
        for rank, expected in sorted(self.expected.items()):
            if rank in self.met or rank in attempt.game.lost:
                continue
            how = "finished the test" if rank in attempt.game.finished else "did not end"
            why = survived(expected, how)
            crash = f"rank {rank}/{ws} {why}"
            report = synthesized_failure(
                test.nodeid,
                attempt.location,
                "call",
                crash,
                f"{crash}\n(in {test.nodeid})",
                note=f"did not exit: it {why}",
                stop=time.time(),
            )
            result.reports[rank].append(report)
        for rank, lines in self.injected.items():
            reports = result.reports.get(rank, [])
            for when, line in lines:
                target = next((r for r in reports if r.when == when), None)
                target = target or (reports[-1] if reports else None)
                if target is not None:
                    target.sections.append((SECTION, line))


def _expectation_unmet(report: TestReport, why: str) -> None:
    """A crash report of a rank that was expected to exit another way: say so first."""
    note = getattr(report, NOTE_ATTR, "")
    setattr(report, NOTE_ATTR, f"{note}, but it {why}")
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        crash.message = f"{crash.message}, but it {why}"
