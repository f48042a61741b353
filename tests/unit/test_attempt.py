"""Unit: one test on one pool (pool/onetest/), with a fake pool, as pytest-xdist unit-tests its
schedulers with a fake worker.

:class:`FakeRanks` implements :class:`~pytest_distrank.pool.onetest.ranks.Ranks` from a script
of messages: each ``wait_for`` hands out the next batch. No process starts. What is checked:
the :class:`Attempt` writes nothing of its pool's state and *returns* its verdict (why the pool
is unfit, the sequence numbers to compare the next test's against); an expected exit is judged
by :class:`Exits` and applied by the attempt; the deadlock watch reads the ranks' progress only
through the protocol.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, cast

import pytest
from pytest import TestReport

from pytest_distrank.outcome.endgame import Endgame, Position
from pytest_distrank.outcome.expectations import ExpectedExit
from pytest_distrank.outcome.records import Reports, RunTest
from pytest_distrank.pool.onetest.attempt import Attempt
from pytest_distrank.pool.onetest.deadlock import Watch
from pytest_distrank.pool.onetest.exits import Exits
from pytest_distrank.pool.onetest.ranks import Rank
from pytest_distrank.pool.protocol import FromRank, RankNote

NODEID = "test_x.py::test_a"
LOCATION = ("test_x.py", 3, "test_a")


@dataclasses.dataclass
class FakeProcess:
    exitcode: int | None = None
    sentinel: int = -1

    def join(self, timeout: float | None = None) -> None:
        return None


class FakeRanks:
    """A pool of ``size`` ranks whose messages come from ``script`` (one batch per wait)."""

    def __init__(self, size: int, log: Path, script: list[list[tuple[int, FromRank | None]]]):
        log.write_text("")
        self.id = 1
        self._ranks = [
            Rank(r, FakeProcess(), None, str(log), 1000 + r)  # type: ignore[arg-type]
            for r in range(size)
        ]
        self.script = script
        self.killed = False
        self.counts: dict[int, dict[str, tuple[int, str]]] | None = None

    @property
    def ranks(self) -> list[Rank]:
        return self._ranks

    @property
    def world_size(self) -> int:
        return len(self._ranks)

    @property
    def backend(self) -> str:
        return "gloo"

    @property
    def closed(self) -> bool:
        return self.killed

    def describe(self) -> str:
        return f"world_size={self.world_size}, backend=gloo"

    def wait_for(
        self, ranks: list[Rank], timeout: float | None
    ) -> list[tuple[Rank, FromRank | None]]:
        if not self.script:
            return []
        wanted = {r.rank for r in ranks}
        batch = [(self._ranks[r], m) for r, m in self.script[0] if r in wanted]
        self.script[0] = [(r, m) for r, m in self.script[0] if r not in wanted]
        if not self.script[0]:
            self.script.pop(0)
        for rank, message in batch:
            if message is None:
                rank.process.exitcode = -11
        return batch

    def position(self, rank: Rank, test: RunTest) -> Position:
        return Position.in_phase("call")

    def marks(self, rank: Rank) -> tuple[int, int]:
        return (3, 1)

    def kill(self) -> None:
        self.killed = True

    def count_collectives(self) -> dict[int, dict[str, tuple[int, str]]] | None:
        return self.counts

    def output_of_last_test(self, limit: int) -> dict[int, str]:
        return {r.rank: "" for r in self._ranks}


def report(when: Any) -> TestReport:
    return TestReport(NODEID, LOCATION, {}, "passed", None, when, [], 0.01, 0.0, 0.01)


def done(rank: int, sequence: dict[str, int] | None = None, **more: Any) -> Reports:
    """A rank's whole test, passed, with its last reports."""
    return Reports(
        rank,
        1,
        NODEID,
        1000 + rank,
        tuple(cast(Any, report(w)) for w in ("setup", "call", "teardown")),
        True,
        sequence={"default": 5} if sequence is None else sequence,
        **more,
    )


def attempt(
    pool: FakeRanks,
    base: dict[int, dict[str, int]] | None = None,
    exits: Exits | None = None,
    timeout: float = 30.0,
) -> Attempt:
    ranks = frozenset(r.rank for r in pool.ranks)
    return Attempt(
        pool,
        RunTest(1, NODEID, None, "/nowhere"),
        {} if base is None else base,
        LOCATION,
        "test_x.py",
        lambda data: data,
        Endgame(ranks, time.monotonic(), timeout, 0.5),
        time.time_ns(),
        exits=exits or Exits(),
    )


def test_every_rank_finished_the_verdict_is_returned_not_written(tmp_path: Path) -> None:
    """In step: the next base is the ranks' numbers, and the pool (a fake with no ``broken``
    or ``sequence_base`` attribute to write) is told, not touched."""
    pool = FakeRanks(2, tmp_path / "log", [[(0, done(0)), (1, done(1))]])
    run = attempt(pool).run()
    assert run.broken is None
    assert run.next_base == {0: {"default": 5}, 1: {"default": 5}}
    assert [r.outcome for r in run.reports[1]] == ["passed"] * 3
    assert not hasattr(pool, "broken") and not hasattr(pool, "sequence_base")


def test_a_rank_that_dies_fails_the_test_and_makes_the_pool_unfit(tmp_path: Path) -> None:
    pool = FakeRanks(2, tmp_path / "log", [[(0, done(0)), (1, None)]])
    run = attempt(pool).run()
    assert run.broken == f"rank 1 crashed in {NODEID}"
    crash = run.reports[1][-1]
    assert crash.failed and "crashed in call with SIGSEGV" in str(crash.longrepr)
    assert run.next_base is None  # not compared after a crash: the pool is replaced


def test_reports_from_another_process_are_foreign(tmp_path: Path) -> None:
    forked = dataclasses.replace(done(1), pid=4242)
    pool = FakeRanks(2, tmp_path / "log", [[(0, done(0)), (1, forked)], [(1, done(1))]])
    run = attempt(pool).run()
    assert run.broken == f"rank 1 sent foreign reports in {NODEID}"
    assert any(r.failed for r in run.reports[1])


def test_sequences_out_of_step_with_no_flight_recorder_replace_the_pool(tmp_path: Path) -> None:
    pool = FakeRanks(2, tmp_path / "log", [[(0, done(0, {"default": 6})), (1, done(1))]])
    run = attempt(pool, base={0: {"default": 4}, 1: {"default": 4}}).run()
    assert run.broken is not None and "flight recorder could not tell" in run.broken
    assert run.next_base is None


def test_an_expected_exit_passes_and_still_replaces_the_pool(tmp_path: Path) -> None:
    """Exits judges (the death met the marker) and the attempt applies: passed reports, a
    note on the call report, the pool unfit 'as expected'."""
    expected = {1: ExpectedExit(1, None, "", "expect_rank_exit marker")}
    pool = FakeRanks(2, tmp_path / "log", [[(0, done(0)), (1, None)]])
    run = attempt(pool, exits=Exits(dict(expected))).run()
    assert run.broken == f"rank 1 exited (SIGSEGV(-11)) as expected in {NODEID}"
    assert not any(r.failed for r in run.reports[1])


def test_a_note_from_another_pid_or_test_is_not_credited(tmp_path: Path) -> None:
    exits = Exits()
    rank = Rank(0, FakeProcess(), None, "", 1000)  # type: ignore[arg-type]
    forged = RankNote(0, 1, 3, "faults.kill", pid=999)
    assert not exits.note(1, rank, forged)
    assert not exits.note(2, rank, dataclasses.replace(forged, pid=1000))
    assert exits.expected == {}
    assert exits.note(1, rank, dataclasses.replace(forged, pid=1000))
    assert exits.expected[0].code == 3


@pytest.mark.parametrize(
    ("status", "output", "met"),
    [(3, "", True), (1, "", False), (-9, "", False)],
)
def test_exits_judge_compares_the_death_with_every_expectation(
    status: int, output: str, met: bool
) -> None:
    exits = Exits({0: ExpectedExit(0, 3, "", "marker")})
    death = exits.judge(0, status, output)
    assert (death.unmet is None) == met
    assert (0 in exits.met) == met


def test_the_watch_reads_progress_through_the_protocol(tmp_path: Path) -> None:
    """No rank pending: nothing to prove; the marks come from ``Ranks.marks``."""
    pool = FakeRanks(2, tmp_path / "log", [])
    game = Endgame(frozenset({0, 1}), time.monotonic(), 30.0, 0.5)
    watch = Watch(pool, game, "test_x.py", time.time_ns())
    game.note_finished(0)
    game.note_finished(1)
    assert watch.look(time.monotonic()) is False
    assert watch.wait(time.monotonic()) >= 0.0


# -- the pools' room: the pool set keeps at most one live pool per key ---------------------------


class FakePool:
    """What the pool set does to a pool: stop it gracefully or kill it."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.serving_cpu: dict[int, tuple[float, int]] = {}

    def request_stop(self) -> None:
        self.events.append("stop asked")

    def finish_stop(self, timeout: float) -> list[str]:
        self.events.append("stopped")
        return ["rank 0: teardown error"]

    def kill(self) -> None:
        self.events.append("killed")


def test_the_pool_set_starts_once_per_key_retires_and_keeps_apart(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_distrank.pool.pools.poolkey import PoolKey
    from pytest_distrank.pool.pools.poolset import PoolSet
    from pytest_distrank.settings import Settings

    config = pytester.parseconfig("-p", "distrank")
    pools = PoolSet(config, Settings.from_config(config))
    started: list[Any] = []

    def start(key: PoolKey, nodeids: list[str], files: list[str], timeout: float) -> Any:
        started.append(FakePool())
        return started[-1]

    monkeypatch.setattr(pools, "_start", start)
    key = PoolKey(2, "gloo", True)
    first: Any = pools.get(key, ["t::a"], ["t.py"], 10.0)
    assert pools.get(key, ["t::a"], ["t.py"], 10.0) is started[0] and len(started) == 1
    pools.retire(key, first, "rank 1 crashed", graceful=False)
    assert first.events == ["killed"] and key not in pools.live
    assert pools.stats.replaced == [f"{key.describe()}: rank 1 crashed"]
    second: Any = pools.get(key, ["t::a"], ["t.py"], 10.0)
    pools.retire(key, second, None, graceful=True)
    assert second.events == ["stop asked"] and pools.stopping == [second]
    apart: Any = pools.start_apart(key, ["t::a"], ["t.py"], 10.0)
    assert apart is started[-1] and key not in pools.live  # the replays stop it themselves
    assert pools.stop_all() == ["rank 0: teardown error"]
    assert second.events == ["stop asked", "stopped"] and apart.events == []
