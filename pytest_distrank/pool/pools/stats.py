"""The controller's numbers about its pools and tests: the ``distrank`` summary's and those of
``DISTRANK_STATS_FILE`` (bench/ and the plugin's tests read that JSON).

Runs in the controller (pool mode); :class:`~poolset.PoolSet` keeps one :class:`Stats`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class PoolStart:
    """One pool start: seconds to ready (fork server wait and forks, then ranks getting ready)."""

    world_size: int
    start_seconds: float
    fork_seconds: float
    ready_seconds: float
    #: It replaced a pool of the same key that a fault killed.
    after_fault: bool


@dataclasses.dataclass
class Stats:
    """What the session counted and timed; :meth:`dump` writes it for bench/ and tests."""

    tests: int = 0
    #: Pools started per (world size, simulation mode or "").
    pools_started: dict[tuple[int, str], int] = dataclasses.field(default_factory=dict)
    replaced: list[str] = dataclasses.field(default_factory=list)
    #: One entry per pool start: world size, seconds to ready, whether it replaced a killed pool.
    pools: list[PoolStart] = dataclasses.field(default_factory=list)
    test_seconds: list[float] = dataclasses.field(default_factory=list)
    #: The controller's CPU seconds per distributed test (its whole protocol: dispatch, wait,
    #: merge, replay through the terminal).
    controller_cpu: list[float] = dataclasses.field(default_factory=list)
    #: Per rank of every pool that stopped cleanly: CPU seconds serving tests, tests served.
    rank_cpu: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    #: ``time.monotonic()`` when each distributed test's protocol ended (the steady-state cost
    #: of a test is the distance between two: everything the session does per test but collect).
    ended: list[float] = dataclasses.field(default_factory=list)
    #: Per test that every rank finished: seconds between the first and the last rank's start.
    start_spread: list[float] = dataclasses.field(default_factory=list)
    #: Seconds pools spent waiting for GPUs that other pytest processes held.
    gpu_wait_seconds: float = 0.0

    def dump(self, path: str) -> None:
        """Write the numbers as JSON (``DISTRANK_STATS_FILE``; bench/ and tests read it)."""
        data = {
            "tests": self.tests,
            "pools": [dataclasses.asdict(p) for p in self.pools],
            "replaced": self.replaced,
            "test_seconds": self.test_seconds,
            "controller_cpu": self.controller_cpu,
            "rank_cpu": self.rank_cpu,
            "start_spread": self.start_spread,
            "ended": self.ended,
            "gpu_wait_seconds": self.gpu_wait_seconds,
        }
        Path(path).write_text(json.dumps(data, indent=1))
