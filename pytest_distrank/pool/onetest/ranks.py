"""The seam between one test and its pool: the ranks it reaches, the verdict it returns.

Runs in the controller (pool mode). :class:`Rank` is one rank process's handle (its pipe, pid and
log); :class:`Ranks` is the small protocol through which one test's code (:mod:`attempt`,
:mod:`crashes`, :mod:`deadlock`, :mod:`debugrelay`, :mod:`exits`) reaches a pool's ranks, so that
nothing in this folder imports the pools' room above it
(:class:`~pytest_distrank.pool.pools.pool.Pool` implements it; the unit tests fake it, as
pytest-xdist's tests fake a worker). :class:`TestRun` is what comes back: the ranks' reports for the
merge, and the verdict the pool applies.
"""

from __future__ import annotations

import dataclasses
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Protocol

from pytest import TestReport

from ...outcome.records import WarningRecord

if TYPE_CHECKING:
    from ...outcome.endgame import Position
    from ...outcome.records import RunTest
    from ..protocol import FromRank


@dataclasses.dataclass
class Rank:
    """One rank process of a pool, as the controller holds it."""

    rank: int
    #: The ``multiprocessing`` process object (``exitcode``, ``sentinel``, ``join``).
    process: Any
    conn: Connection
    log_path: str
    #: Kept apart from ``process``: it stays readable after the process object is closed.
    pid: int
    #: Where the log stood when the current test was sent: its output starts there.
    log_offset: int = 0


class Ranks(Protocol):
    """A pool's ranks, as one test reaches them."""

    #: The pool's number in the session (debugrelay names a pool once).
    id: int

    @property
    def ranks(self) -> list[Rank]: ...

    @property
    def world_size(self) -> int: ...

    @property
    def backend(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    def describe(self) -> str:
        """The pool's key in words (``ws4 gloo``)."""

    def wait_for(
        self, ranks: list[Rank], timeout: float | None
    ) -> list[tuple[Rank, FromRank | None]]:
        """Messages from ``ranks`` (``None`` for a rank that died), or [] after ``timeout``."""

    def position(self, rank: Rank, test: RunTest) -> Position:
        """Where ``rank`` was in ``test`` when last seen."""

    def marks(self, rank: Rank) -> tuple[int, int]:
        """The rank's phase and test index, as it last wrote them (its progress)."""

    def kill(self) -> None:
        """SIGKILL every rank and what it started."""

    def count_collectives(self) -> dict[int, dict[str, tuple[int, str]]] | None:
        """Every rank's collective counts per group, or None when some rank cannot tell."""

    def output_of_last_test(self, limit: int) -> dict[int, str]:
        """What each rank wrote since the last test started."""


@dataclasses.dataclass
class TestRun:
    """What one test did on every rank; the input of the merge."""

    reports: dict[int, list[TestReport]]
    #: Why the pool must not serve another test (the first reason), or None: the pool applies it.
    broken: str | None = None
    #: The ranks' sequence numbers to compare the next test's against (the collectives were in
    #: step), or None to keep the pool's: the pool applies it.
    next_base: dict[int, dict[str, int]] | None = None
    #: Per rank: its groups' sequence numbers after the test (Reports.sequence).
    sequence: dict[int, dict[str, int]] = dataclasses.field(default_factory=dict)
    #: Per rank: the warnings the test raised there (Reports.warnings).
    warnings: dict[int, tuple[WarningRecord, ...]] = dataclasses.field(default_factory=dict)
    #: Per rank that finished: when it began the test (Reports.started, monotonic seconds).
    started: dict[int, float] = dataclasses.field(default_factory=dict)
    #: Lines for the session summary (CUDA memory a test left allocated, Reports.cuda_note;
    #: what it left behind and was restored, Reports.leftovers).
    notes: list[str] = dataclasses.field(default_factory=list)
    #: Per rank: what the test left behind there and was restored, in words (Reports.leftovers).
    leftovers: dict[int, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    #: Per rank: what changed there between its previous test and this one (Reports.between).
    between: dict[int, tuple[str, tuple[str, ...]]] = dataclasses.field(default_factory=dict)
    #: The interrupt (a signal, Ctrl-C) that ended the test: the controller raises it again once
    #: the test's reports are logged (interrupts.py).
    interrupted: BaseException | None = None
