"""Launcher mode's header and summary lines: what rank 0 prints about the launched world.

Runs in every rank of a launched world (the header is written to each rank's own report; only
rank 0 writes the summary). Kept apart from the hooks so that what users read is in one place.
"""

from __future__ import annotations

import os

import pytest

from ..envvars import REQUIRE_SECRET_ENV, SECRET_ENV
from ..planning.order import describe_order, describe_seed
from ..settings import Settings
from .session import RankSession


def header_lines(
    rs: RankSession, settings: Settings, version: str, seed: int | None, order_seed: int | None
) -> list[str]:
    timeout = f"{settings.timeout.value:g} s" if settings.timeout.value else "none"
    order = describe_order(settings.order, order_seed)
    lines = [
        f"distrank: {version}, {rs.launch.describe()}, backend {settings.backend.value}, "
        f"{describe_seed(seed)}{', ' + order if order else ''}, "
        f"timeout {timeout} ({settings.timeout.source})"
    ]
    if rs.world_size > 1:
        lines.append(
            f"distrank: rank 0 reports for all {rs.world_size} ranks; the others log to "
            f"{rs.root}{os.sep}rank<N>.log on their nodes"
        )
    if not rs.channel.auth.authenticated:
        lines.append(
            f"distrank: results UNAUTHENTICATED: the ranks are on several nodes and "
            f"{SECRET_ENV} is not set, so anyone who reaches MASTER_ADDR:MASTER_PORT can write "
            f"a rank's reports. Set {SECRET_ENV} to one random value for every rank, in the "
            f"environment ({REQUIRE_SECRET_ENV}=1 refuses such a run; docs/multi-node.md)"
        )
    return lines


def summary_lines(
    reporter: pytest.TerminalReporter, rs: RankSession, tests: int, notes: list[str]
) -> None:
    """The ``distrank`` section of rank 0's terminal summary."""
    reporter.write_sep("-", "distrank")
    count = "1 distributed test" if tests == 1 else f"{tests} distributed tests"
    logs = ", ".join(f"rank {r}: {p}" for r, p in sorted(rs.logs.items()) if r)
    reporter.write_line(
        f"{count} on {rs.world_size} ranks ({rs.launch.launcher}); logs of the other ranks: {logs}"
    )
    for note in notes:
        reporter.write_line(note)
