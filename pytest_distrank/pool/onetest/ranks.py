"""What one test knows of the pool it runs on: its rank processes and how to reach them.

Runs in the controller (pool mode). :class:`Rank` is one rank process's handle (its pipe, pid
and log); :class:`Ranks` is the small protocol through which one test's code (:mod:`attempt`,
:mod:`deadlock`, :mod:`debugrelay`, :mod:`exits`) reaches a pool's ranks, so that nothing in this
folder imports the pools' room above it (:class:`~pytest_distrank.pool.pools.pool.Pool`
implements it; the unit tests fake it, as pytest-xdist's tests fake a worker).
"""

from __future__ import annotations

import dataclasses
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Protocol

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
