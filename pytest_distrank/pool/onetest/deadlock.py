"""Ending a test early when its ranks' flight records prove it can never finish.

Runs in the controller (pool mode), inside :class:`attempt.Attempt`'s wait for a test's ranks.

Healthy tests are never probed. Between the ranks' messages the watch reads, every
:data:`~outcome.progress.WATCH_EVERY` seconds, the pending ranks' phases (the shared phase array)
and their CPU time (:class:`~outcome.progress.Stillness`): nothing else. Only when no rank sent a
message, changed its phase or spent CPU time for :data:`~outcome.progress.QUIET` seconds does it
ask every live rank for its flight records (:mod:`probes`), and :func:`collectives.explain`
judges them together with the ranks that finished the test and those that died. The test ends
early only on evidence:

- the records prove the state can never complete (a mismatch in one slot of a group; members
  that finished the test or died without entering the collective their peers wait in), and
- every rank the proof rests on answered, and the stacks of the ranks said to wait show each of
  them inside a ``torch.distributed`` call (the records alone cannot tell a collective a rank
  waits in from an async one it left pending and went on from), or standing in ``Work.wait()``
  or the autograd engine with every collective it left pending hopeless
  (:func:`~outcome.progress.waits_on_work`);
- no waited collective's group timeout may end it (an error the test may catch) before the
  test's deadline (:func:`collectives.explain`'s ``timeout_s``).

A rank that is only slow (sleeping, computing, in I/O, in a collective its peers have not
reached yet but will) proves nothing, and the test waits for its deadline as before; each probe
that proves nothing doubles the quiet time before the next, until a rank makes progress again.
On a loaded machine a rank can be descheduled for seconds: silence only decides *when* to look,
the records decide.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from ...outcome.collectives import Verdict, explain, load
from ...outcome.endgame import effective_timeout
from ...outcome.progress import WATCH_EVERY, Stillness, waits_on_work
from ...outcome.stacks import collective_entered
from .probes import dump_stacks, read_collectives, request_collectives

if TYPE_CHECKING:
    from ...outcome.endgame import Endgame
    from .ranks import Ranks

#: Bound on the ranks' answers to a records request.
ANSWER_WAIT = 1.0


@dataclasses.dataclass
class Watch:
    """The progress of one test's ranks, and the probe once they stand still."""

    pool: Ranks
    game: Endgame
    test_file: str
    #: Wall clock (ns) when the test was sent: records after it are the test's.
    sent_ns: int
    #: When the pending ranks last made progress (their phases, their CPU time).
    stillness: Stillness = dataclasses.field(default_factory=lambda: Stillness(time.monotonic()))
    #: What the last probe found proven, once it ended the test.
    verdict: Verdict | None = None

    def progress(self, now: float) -> None:
        """A rank sent a message: progress, whatever it was."""
        self.stillness.progress(now)

    def wait(self, now: float) -> float:
        """How long the attempt may block before the watch wants to look again."""
        still = self.stillness
        return max(0.0, min(WATCH_EVERY, still.since + still.quiet - now))

    def look(self, now: float) -> bool:
        """Look at the ranks; True when the test was proven deadlocked (``game`` says when)."""
        pending = [r for r in self.pool.ranks if r.rank in self.game.pending]
        if not pending:
            return False
        marks = tuple(self.pool.marks(r) for r in pending)
        pids = [r.pid for r in pending]
        if self.stillness.observe(now, marks, pids) or not self.stillness.still(now):
            return False
        proven = self._probe()
        # The probe's own CPU time (the ranks' record dumps) is no progress of theirs.
        self.stillness.rebase(pids)
        if proven is None:
            self.stillness.unproven(time.monotonic())
            return False
        self.verdict = proven
        self.game.note_deadlock(time.monotonic())
        return True

    def _probe(self) -> Verdict | None:
        """The ranks' records, judged: a proven verdict whose waiting ranks' stacks confirm
        they are inside a collective, or None."""
        alive = [r for r in self.pool.ranks if r.process.exitcode is None]
        request_collectives(alive)
        answers = read_collectives(alive, ANSWER_WAIT)
        dumps = {rank: load(raw) for rank, raw in answers.items()}
        if any(dumps.get(r.rank) is None for r in alive if r.rank in self.game.pending):
            return None  # a pending rank that does not answer is unknown: no early end
        story = explain(
            dumps,
            self.sent_ns,
            finished=self.game.finished,
            lost=self.game.lost,
            world_size=self.pool.world_size,
            timeout_s=effective_timeout(self.game.timeout),
        )
        if story is None or not story.verdict.proven:
            return None
        verdict = story.verdict
        blocked = [r for r in alive if r.rank in verdict.blocked]
        stacks = dump_stacks(blocked)
        inside = [
            collective_entered(stacks[r.rank], self.test_file)
            or (r.rank in verdict.stuck and waits_on_work(stacks[r.rank], self.test_file))
            for r in blocked
        ]
        if not blocked or not all(inside):
            return None
        return verdict
