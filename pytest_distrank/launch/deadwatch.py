"""Launcher mode: ending a test early when the ranks' flight records prove it can never finish.

Runs in every rank of a launched world. Pool mode's controller sees every rank's process
(:mod:`pool.deadlock`); here no process sees another's (ranks may be on other machines), so each
rank watches itself and rank 0 judges what they say:

- :class:`SelfWatch`, in every rank's watchdog thread while the rank's main thread is in a test:
  every :data:`~outcome.progress.WATCH_EVERY` seconds it reads the rank's own phase, report count
  and CPU time (:class:`~outcome.progress.Stillness`); nothing else. Once they stood still for
  :data:`~outcome.progress.QUIET` seconds it takes the rank's flight records and its main
  thread's stack, once, and ranks other than 0 publish them (``still/<test>/<rank>``,
  :class:`keys.Still`); when the rank moves again it says so. A rank whose main thread holds the
  GIL never gets to say anything: it stays unknown.
- :class:`Judge`, in rank 0: in its watchdog while its own main thread is in the test, in its main
  thread (:func:`gather.gather`) once its part is over. Whenever what the ranks said changed (a
  rank stood still or moved, a rank finished or was lost) it reads them, with the records of the
  ranks that finished (:func:`frrecords.peer_records`), and judges them with
  :func:`collectives.explain`, as pool mode does. The test ends early only when every pending
  rank stands still, the records prove the state can never complete (no waited collective's
  group timeout comes before the test's deadline), and the stacks of the ranks said to wait
  show each of them inside a ``torch.distributed`` call, or in ``Work.wait()`` or the autograd
  engine with every collective it left pending hopeless. Then the test ends as at
  its deadline (rank 0 asks for every stuck rank's stacks), with the verdict, reported as "ended
  after 2.4 s: a deadlock".

What a rank said may be older than the judgement (it may have moved since and not said so yet).
That cannot make a false proof: a proof rests on facts that never change once true (two ranks
entered different ops in the same slot of a group; a member finished the test or died without
entering the collective its peers wait in, and a rank inside a collective that can never
complete stays inside it), and a rank that said it was elsewhere is pending, which proves
nothing. Silence only decides *when* to look; the records decide.
"""

from __future__ import annotations

import dataclasses
import time

from ..outcome.collectives import explain, load
from ..outcome.endgame import effective_timeout
from ..outcome.progress import WATCH_EVERY, Stillness, waits_on_work
from ..outcome.stacks import collective_entered, where_blocked
from ..rank.groupstate import flight_records
from . import keys
from .channel import dump_threads
from .current import Current
from .early import foreign, poll_finished
from .frrecords import own_records, peer_records
from .session import RankSession
from .tamper import noted


@dataclasses.dataclass(frozen=True)
class Beacon:
    """What a standing-still rank says of itself: its records and where its main thread is."""

    records: str
    since_ns: int
    #: The ``torch.distributed`` call its main thread is inside ("" when none); or, after
    #: :data:`WAITS`, where it waits on collectives outside one (``Work.wait()``, autograd).
    inside: str
    #: Where it is blocked, in words (named when it never entered a collective its peers wait in).
    where: str


#: A beacon's ``inside`` for a rank in ``Work.wait()`` or the autograd engine: accepted as
#: waiting only where every collective it left pending is hopeless (``Verdict.stuck``).
WAITS = "waits in "


def _inside(dump: str, test_file: str) -> str:
    entered = collective_entered(dump, test_file)
    if entered:
        return entered
    waits = waits_on_work(dump, test_file)
    return WAITS + waits if waits else ""


class SelfWatch:
    """One rank's own progress in the running test (its watchdog thread)."""

    def __init__(self, rs: RankSession, cur: Current) -> None:
        self.rs = rs
        self.cur = cur
        now = time.monotonic()
        self.stillness = Stillness(now)
        #: The first look is half a second in: a test of milliseconds never meets the watch.
        self.next_look = now + WATCH_EVERY
        #: What the rank said while it stands still now; None while it makes progress.
        self.beacon: Beacon | None = None

    def tick(self, now: float) -> None:
        """Look at this rank, every :data:`WATCH_EVERY` seconds; say when it stands still (once)
        and when it moves again."""
        if now < self.next_look:
            return
        self.next_look = now + WATCH_EVERY
        cur, pid = self.cur, self.rs.pid
        if self.stillness.observe(now, (cur.when, len(cur.reports)), [pid]):
            if self.beacon is not None:
                self.beacon = None
                self._publish(None)
            return
        if self.beacon is not None or not self.stillness.still(now):
            return
        dump = dump_threads(self.rs.main_ident)
        raw = flight_records()
        test_file = str(cur.item.path)
        self.beacon = Beacon(
            raw.decode("utf-8") if raw else "",
            cur.started_ns,
            _inside(dump, test_file),
            where_blocked(dump, test_file),
        )
        self._publish(self.beacon)
        # Taking the records and the stack spent CPU time: no progress of the test's.
        self.stillness.rebase([pid])

    def _publish(self, beacon: Beacon | None) -> None:
        if self.rs.rank == 0:
            return  # rank 0's judge reads its beacon in-process
        cur = self.cur
        payload: keys.Still = {
            "still": beacon is not None,
            "records": beacon.records if beacon else "",
            "since_ns": cur.started_ns,
            "inside": beacon.inside if beacon else "",
            "where": beacon.where if beacon else "",
            **keys.identity(cur.index, cur.item.nodeid),
        }
        self.rs.channel.put(keys.still(cur.index, self.rs.rank), payload)
        self.rs.channel.add(keys.still_count(cur.index), 1)


class Judge:
    """Rank 0: whether what the ranks said proves the running test can never finish."""

    def __init__(self, rs: RankSession, cur: Current) -> None:
        self.rs = rs
        self.cur = cur
        self.next_look = time.monotonic() + WATCH_EVERY
        #: What the ranks had said at the last judgement: judged again only when it changes.
        self.seen: tuple[object, ...] | None = None

    def look(self, now: float, own: Beacon | None = None) -> bool:
        """Judge, every :data:`WATCH_EVERY` seconds, when anything changed; True once the test
        was proven deadlocked (:meth:`endgame.Endgame.note_deadlock` says when).

        ``own``: rank 0's beacon while its main thread is in the test (None: it moves, and
        nothing is proven); once rank 0 finished, its records are final and ``own`` is unused.
        """
        cur, game = self.cur, self.cur.game
        if game.deadlock_at is not None:
            return True
        if now < self.next_look:
            return False
        self.next_look = now + WATCH_EVERY
        if 0 in game.pending and own is None:
            return False
        poll_finished(self.rs, cur)
        count = self.rs.channel.add(keys.still_count(cur.index), 0)
        state = (count, frozenset(game.finished), frozenset(game.lost), own)
        if state == self.seen:
            return False
        self.seen = state
        beacons = self._beacons()
        if beacons is None:
            return False
        if own is not None and 0 in game.pending:
            beacons[0] = own
        if not self._proven(beacons):
            return False
        game.note_deadlock(time.monotonic())
        return True

    def _beacons(self) -> dict[int, Beacon] | None:
        """What every pending rank other than 0 said, or None when one of them is not standing
        still (or never said, or a process other than the rank's own said it)."""
        cur, channel = self.cur, self.rs.channel
        out: dict[int, Beacon] = {}
        for rank in sorted(self.cur.game.pending - {0}):
            key = keys.still(cur.index, rank)
            if not channel.has(key):
                return None
            # JSON read off the network (collectives.load checks the records; nothing unpickled).
            data: keys.Still | None = None
            with noted(cur):  # one that does not verify or read fails the test
                data = channel.get(key, keys.read_still)
            if data is None or foreign(self.rs, cur, rank, data) is not None or not data["still"]:
                return None
            out[rank] = Beacon(data["records"], data["since_ns"], data["inside"], data["where"])
        return out

    def _proven(self, beacons: dict[int, Beacon]) -> bool:
        """The records prove a deadlock, and every rank said to wait is inside a collective."""
        cur, game = self.cur, self.cur.game
        finished = sorted(game.finished - {0})
        peers = peer_records(self.rs, cur, finished)
        if any(rank not in peers for rank in finished):
            return False  # a rank that finished without answering: its records are unknown
        dumps = {}
        since: dict[int, int] = {}
        where: dict[int, str] = {}
        if 0 not in beacons:
            dumps[0], since[0] = load(own_records(cur)), cur.started_ns
        for rank, data in peers.items():
            dumps[rank], since[rank] = load(data["records"]), data["since_ns"]
        for rank, beacon in beacons.items():
            dumps[rank], since[rank] = load(beacon.records), beacon.since_ns
            where[rank] = beacon.where
        story = explain(
            dumps,
            since,
            where,
            finished=game.finished,
            lost=game.lost,
            world_size=self.rs.world_size,
            timeout_s=effective_timeout(game.timeout),
        )
        if story is None or not story.verdict.proven:
            return False
        verdict = story.verdict

        def inside(rank: int) -> bool:
            said = beacons[rank].inside if rank in beacons else ""
            return bool(said) and (not said.startswith(WAITS) or rank in verdict.stuck)

        return bool(verdict.blocked) and all(inside(r) for r in verdict.blocked)
