"""Launcher mode: the distributed test a rank is running, as its main thread and watchdog see it.

Runs in every rank of a launched world: made by :mod:`plugin` when a test starts, read and written
by the main thread and the watchdog thread (:mod:`watchdog`, which writes only ``taken_over``,
``stack_sent`` and, on rank 0, what :mod:`gather`'s polls note), and on rank 0 by :mod:`gather`,
:mod:`deadwatch`, :mod:`frrecords` and :mod:`tamper`, which import it from here (none of them
imports another for it).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import TYPE_CHECKING

import pytest
from pytest import TestReport

from ..outcome.endgame import Endgame
from ..outcome.records import WarningRecord
from ..settings import Value
from . import keys
from .channel import Forged

if TYPE_CHECKING:
    from .session import RankSession


@dataclasses.dataclass
class Current:
    """The distributed test a rank is running, as its main thread and watchdog see it."""

    index: int
    item: pytest.Item
    #: The end of the test: its deadline (every rank) and, on rank 0, who failed or finished.
    game: Endgame
    #: The phase the main thread is in: setup, call or teardown.
    when: str = "setup"
    #: This rank's phase reports so far.
    reports: list[TestReport] = dataclasses.field(default_factory=list)
    early_ranks: set[int] = dataclasses.field(default_factory=set)
    early_seen: int = 0
    #: Rank 0's watchdog: the ``done/<test>`` count it last looked at.
    done_seen: int = 0
    #: Rank 0: last reports read from the store (genuine or not), to check ``done/<test>`` by.
    reports_read: int = 0
    #: Rank 0: payloads of this test that did not verify, by key (the test fails with each).
    forged: dict[str, Forged] = dataclasses.field(default_factory=dict)
    #: The main thread finished its part of the test.
    done: bool = False
    #: The watchdog reports this test instead of the main thread (which is stuck).
    taken_over: bool = False
    stack_sent: bool = False
    #: This rank's warnings so far (the main thread's ``catch_warnings`` log, live).
    caught: list[warnings.WarningMessage] = dataclasses.field(default_factory=list)
    #: Rank 0: the ranks whose pytest session ended (their ``fatal/<rank>`` payloads).
    stopped: dict[int, keys.Fatal] = dataclasses.field(default_factory=dict)
    #: Rank 0: what is known of where each rank left stuck is (:func:`gather.stuck_words`).
    stuck_at: dict[int, str] = dataclasses.field(default_factory=dict)
    #: Rank 0: when to look for ended sessions again without a sign (monotonic).
    fatal_at: float = 0.0
    #: Rank 0: what the peers sent with their last reports: warnings, sequence numbers.
    peer_warnings: dict[int, list[WarningRecord]] = dataclasses.field(default_factory=dict)
    sequences: dict[int, dict[str, int]] = dataclasses.field(default_factory=dict)
    #: This rank's wall clock when it began the test (flight-recorder records after it count).
    started_ns: int = dataclasses.field(default_factory=time.time_ns)
    #: This rank's flight records once taken (:func:`own_records`), JSON text.
    records: str | None = None
    #: ``--distrank-deadlocks=end``: end the test early once its records prove a deadlock.
    end_deadlocks: bool = False
    #: Rank 0: the records of the ranks that finished while others were still in the test
    #: (:func:`frrecords.peer_records`: each rank answers once).
    peer_records: dict[int, keys.Records] = dataclasses.field(default_factory=dict)
    #: A sub-world's test: the rank's session as a member of it (:meth:`RankSession.view`).
    view: RankSession | None = None

    @classmethod
    def begin(
        cls,
        index: int,
        item: pytest.Item,
        world_size: int,
        timeout: Value[float],
        grace: float,
        end_deadlocks: bool = False,
    ) -> Current:
        """The test starts now, with its timeout (and where it came from), the failure grace and
        whether a proven deadlock ends it early."""
        game = Endgame(
            frozenset(range(world_size)),
            time.monotonic(),
            timeout.value,
            grace,
            timeout_source=timeout.source,
        )
        return cls(index, item, game, end_deadlocks=end_deadlocks)
