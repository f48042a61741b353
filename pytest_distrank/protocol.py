"""Typed messages between the controller and its rank processes.

Imported by both sides: the controller (the pytest process) and every rank process. Standard
library only: no torch, no pytest, so that a message can be built and read anywhere.

Messages travel over one duplex ``multiprocessing`` connection per rank, which does the framing
(length-prefixed pickles). Reports inside messages are the plain dicts produced by pytest's own
``pytest_report_to_serializable`` hook, exactly as pytest-xdist ships them.

Phases a rank announces through the pool's shared phase array (two ints per rank: the phase and
the index of the test it belongs to), so that the controller can say what a rank was doing when it
crashed or hung without a message per phase. A phase is never evidence that a rank *finished* a
test (see :mod:`endgame`): only its reports for that test are.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class Phase(enum.IntEnum):
    """What a rank process is doing, as written into the pool's shared phase array."""

    STARTING = 0
    IDLE = 1
    SETUP = 2
    CALL = 3
    TEARDOWN = 4
    STOPPING = 5
    #: The rank took the test from its pipe; its setup has not begun.
    RECEIVED = 6
    #: The test's protocol returned; its last reports are being sent.
    FINISHED = 7

    @property
    def when(self) -> str:
        """The pytest phase name (``setup``/``call``/``teardown``) this phase reports under."""
        if self is Phase.CALL:
            return "call"
        if self in (Phase.TEARDOWN, Phase.FINISHED):
            return "teardown"
        return "setup"


@dataclasses.dataclass(frozen=True)
class RankConfig:
    """Everything a rank process needs to start; passed as the process target's argument."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    init_process_group: bool
    pool_id: int
    #: The pool's rendezvous: a FileStore in the controller's private folder (no port guessing).
    store_path: str
    pytest_args: tuple[str, ...]
    env: dict[str, str]
    log_path: str
    nodeids: tuple[str, ...]
    #: pytest-cov is measuring the controller: the rank measures itself with these settings
    #: (``coverage.Coverage`` keyword arguments, plus ``topdir``) and saves a parallel data file.
    coverage: dict[str, Any] | None = None
    #: The pool's test files (absolute): the only files the rank's collection looks at.
    files: tuple[str, ...] = ()


# controller -> rank


@dataclasses.dataclass(frozen=True)
class RunTest:
    """Run one test's full protocol (setup, call, teardown)."""

    index: int
    nodeid: str
    next_nodeid: str | None
    shared_dir: str


@dataclasses.dataclass(frozen=True)
class CountCollectives:
    """Say how many collectives (not point-to-point ops) each group has issued.

    Sent only when the sequence numbers of a group differ between ranks after a test: either
    some ranks exchanged point-to-point messages, or one issued a collective its peers did not.
    """


@dataclasses.dataclass(frozen=True)
class Shutdown:
    """Tear down what is still set up, end the rank's pytest session and exit."""


# rank -> controller


@dataclasses.dataclass(frozen=True)
class Ready:
    """The rank collected its files and (if asked) initialised its process group."""

    rank: int
    pid: int
    missing: tuple[str, ...] = ()
    collect_errors: tuple[str, ...] = ()


#: ``(category module, category qualname, message, filename, lineno)`` of one warning.
WarningRecord = tuple[str, str, str, str, int]

#: Attributes of a plain pytest TestReport. A passing report with nothing else (no sections, no
#: properties, no attribute a plugin added) travels as a :data:`PassedPhase` tuple.
PLAIN_REPORT_ATTRIBUTES = frozenset(
    {
        "_id",
        "nodeid",
        "location",
        "keywords",
        "outcome",
        "longrepr",
        "when",
        "sections",
        "user_properties",
        "duration",
        "start",
        "stop",
    }
)

#: ``("passed", when, duration, start, stop)``: a plain passing phase report. The controller
#: rebuilds the TestReport from its own item (node id, location, keywords), as pytest would
#: have made it; sending and rebuilding it costs a fraction of pytest's serialization.
PassedPhase = tuple[str, str, float, float, float]


def compact_passed(report: Any) -> PassedPhase | None:
    """The compact form of a plain passing phase report, or None (send the full report)."""
    if (
        report.outcome != "passed"
        or report.sections
        or report.user_properties
        or report.longrepr is not None
        or not PLAIN_REPORT_ATTRIBUTES.issuperset(vars(report))
    ):
        return None
    return ("passed", report.when, report.duration, report.start, report.stop)


@dataclasses.dataclass(frozen=True)
class Reports:
    """Serialized phase reports of one test. ``done`` marks the last batch for that test.

    A rank sends a failing report at once (so its peers' grace period can start) and the rest in
    one batch when the test's protocol ends.
    """

    rank: int
    #: The test these reports belong to (RunTest.index and .nodeid): the controller credits
    #: them to no other test.
    index: int
    nodeid: str
    #: ``os.getpid()`` of the sender at send time: a process the test forked, returning into
    #: the rank's pytest, sends from another pid (the controller then fails the test).
    pid: int
    #: pytest's serialized reports (``pytest_report_to_serializable``), or PassedPhase tuples.
    reports: tuple[dict[str, Any] | PassedPhase, ...]
    done: bool
    #: What the test did to the rank's default process group ("left the default process group
    #: destroyed", "replaced ..."); "" when the group is still the pool's.
    pg_problem: str = ""
    #: With ``done``: for each process group this rank is a member of, its name in words and
    #: the group's sequence number (collectives and point-to-point ops issued so far).
    sequence: dict[str, int] = dataclasses.field(default_factory=dict)
    #: With ``done``: processes the test forked (``os.fork()``) that were still running the
    #: rank's own code when the test ended: they return into pytest and run the test again.
    forks: tuple[int, ...] = ()
    #: With ``done``: warnings the test raised on this rank (pytest_warning_recorded), each as
    #: :data:`WarningRecord`; the controller shows each distinct one once, naming the ranks.
    warnings: tuple[WarningRecord, ...] = ()


@dataclasses.dataclass(frozen=True)
class Collectives:
    """The answer to :class:`CountCollectives`, from PyTorch's flight recorder.

    ``counts``: group (in words) -> (collectives issued, the last one's op name); None when the
    flight recorder is off (``TORCH_FR_BUFFER_SIZE=0``) or unavailable.
    """

    rank: int
    pid: int
    counts: dict[str, tuple[int, str]] | None


@dataclasses.dataclass(frozen=True)
class Fatal:
    """The rank cannot serve: its start-up failed or its pytest session ended early."""

    rank: int
    message: str


@dataclasses.dataclass(frozen=True)
class Stopped:
    """The rank tore down its remaining fixtures; ``errors`` holds their teardown failures."""

    rank: int
    errors: tuple[str, ...] = ()


FromRank = Ready | Reports | Collectives | Fatal | Stopped


def phase_slots(rank: int) -> tuple[int, int]:
    """Indices of ``rank``'s phase and test index in the pool's shared phase array."""
    return 2 * rank, 2 * rank + 1
