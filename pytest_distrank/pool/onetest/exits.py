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
crash. This module judges and words; the attempt applies (it owns the test's reports and clocks).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ...outcome.expectations import ExpectedExit, met_note, survived, unmet_death
from ...outcome.merge import NOTE_ATTR
from ...outcome.reports import not_exited_report

if TYPE_CHECKING:
    from pytest import TestReport

    from ...outcome.endgame import Endgame
    from ..protocol import RankNote
    from .ranks import Rank

#: The title of the report section that lists a rank's injected faults.
SECTION = "distrank: injected fault"
Location = tuple[str, int | None, str]


@dataclasses.dataclass(frozen=True)
class Death:
    """How an expected rank's death met its expectations."""

    #: What it did not meet (``exited with 1, not 3``), or None: it died as expected.
    unmet: str | None
    #: The line for the rank's row when it met them.
    note: str

    @property
    def words(self) -> str:
        return "as expected " if self.unmet is None else ""


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

    def note(self, index: int, rank: Rank, message: RankNote) -> bool:
        """A rank's :class:`~protocol.RankNote` (sent before it acts), credited only when it
        is this test's (``index``) and came from that rank's own process through its own pipe.
        True when it expects a new death (the failure grace is then off)."""
        if (message.index, message.rank, message.pid) != (index, rank.rank, rank.pid):
            return False
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
            return True
        return False

    def judge(self, rank: int, status: int | None, output: str) -> Death:
        """An expected rank died with ``status`` after writing ``output``: did it meet every
        expectation (its marker's and a kill's)?"""
        expected = self.expected[rank]
        earlier = self.earlier.get(rank)
        why = unmet_death(expected, status, output) or (
            None if earlier is None else unmet_death(earlier, status, output)
        )
        if why is None:
            self.met.add(rank)
        return Death(why, met_note(expected, status))

    def finish(
        self,
        reports: Mapping[int, list[TestReport]],
        game: Endgame,
        nodeid: str,
        location: Location,
        world_size: int,
    ) -> None:
        """After the wait: ranks that were expected to exit and did not; the fired faults."""
        for rank, expected in sorted(self.expected.items()):
            if rank in self.met or rank in game.lost:
                continue
            how = "finished the test" if rank in game.finished else "did not end"
            why = survived(expected, how)
            report = not_exited_report(nodeid, location, rank, world_size, why, time.time())
            reports[rank].append(report)
        for rank, lines in self.injected.items():
            rank_reports = reports.get(rank, [])
            for when, line in lines:
                target = next((r for r in rank_reports if r.when == when), None)
                target = target or (rank_reports[-1] if rank_reports else None)
                if target is not None:
                    target.sections.append((SECTION, line))


def expectation_unmet(report: TestReport, why: str) -> None:
    """A crash report of a rank that was expected to exit another way: say so first."""
    note = getattr(report, NOTE_ATTR, "")
    setattr(report, NOTE_ATTR, f"{note}, but it {why}")
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        crash.message = f"{crash.message}, but it {why}"
