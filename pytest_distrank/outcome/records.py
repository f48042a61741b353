"""The records both modes pass around: a test to run, one rank's reports of it, a warning.

Imported everywhere: the pytest process of either mode, pool ranks, launched ranks. Standard
library only: no torch, no pytest, so that a record can be built and read anywhere. Pool mode
sends them through its pipes (:mod:`pool.protocol` wraps them in its messages); launcher mode
sends them as JSON through the control store (:mod:`launch.keys`).

Reports inside a :class:`Reports` record are the plain dicts produced by pytest's own
``pytest_report_to_serializable`` hook, exactly as pytest-xdist ships them, or the compact
:data:`PassedPhase` tuple for a plain passing phase.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class RunTest:
    """Run one test's full protocol (setup, call, teardown)."""

    index: int
    nodeid: str
    next_nodeid: str | None
    shared_dir: str
    #: The folders of the fixtures at another world size it requests: (producer key, folder).
    fixtures: tuple[tuple[str, str], ...] = ()


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

#: Attributes plugins set on every report, plain while empty: pytest-html sets ``extras`` on every
#: call report (``[]`` unless a test added some), and reads it with ``getattr(report, "extras",
#: [])``; kept, the call report of every test on every rank travelled in full.
EMPTY_PLUGIN_ATTRIBUTES = frozenset({"extras"})

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
        or not all(
            name in PLAIN_REPORT_ATTRIBUTES or (name in EMPTY_PLUGIN_ATTRIBUTES and value == [])
            for name, value in vars(report).items()
        )
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
    #: With ``done``: ``time.monotonic()`` (one clock for every process of the machine) when the
    #: rank began the test; the controller's stats keep the spread between the ranks.
    started: float = 0.0
    #: With ``done``: the CUDA memory the test left allocated on this rank, in words ("left
    #: 64 MiB of CUDA memory allocated"), or "" (pool/worker/rankgpu.py).
    cuda_note: str = ""
    #: With ``done``: what the test left behind on this rank that was restored (or is named
    #: only), each in words ("LEAKED_BY_C set", "the default dtype float64"); what could not be
    #: restored is in ``pg_problem`` (rank/leftovers.py).
    leftovers: tuple[str, ...] = ()
    #: With ``done``: what changed on this rank between its previous test and this one, outside
    #: both (rank/between.py): the previous test's node id and the words; None if nothing.
    between: tuple[str, tuple[str, ...]] | None = None
