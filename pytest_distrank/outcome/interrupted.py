"""A test the session's interruption ended: no rank is its root cause.

Runs where one report per test is written (pool mode's controller; launcher mode's rank 0). Pure
logic over the reports :func:`endgame.unfinished_report` writes; imports no torch.

When a signal (SIGTERM, SIGINT, SIGHUP: a CI cancel, Ctrl-C) stops the session while ranks are
still in a test, each such rank is reported from outside, interrupted where it was. If every
failed report of a phase is such a rank (none failed, crashed or was killed after a peer's
failure first), the test did not fail: the session ended under it. Naming one of those ranks
"root cause" (the lowest, by the usual rule) would send a person after a rank that did nothing
wrong. The head says instead that the session was interrupted, and the per-rank table where each
rank was; a collective verdict (who waited for whom) still shows on its own line.
"""

from __future__ import annotations

from pytest import TestReport

from .rootcause import Blame, Failures, label

#: On a report of a rank the session's interruption stopped in a test: the signal's name.
INTERRUPTED_ATTR = "distrank_interrupted"


def interrupted_blame(failures: Failures, world_size: int) -> Blame | None:
    """No root cause when every failed report of the phase is a rank the same signal stopped in
    the test (see the module's docstring); None otherwise: the usual rule decides."""
    signals = {getattr(report, INTERRUPTED_ATTR, None) for _, report in failures}
    if not failures or len(signals) != 1 or None in signals:
        return None
    (signal,) = signals
    rank, report = failures[0]
    ranks = [r for r, _ in failures]
    if len(ranks) == 1:
        tag, still = f"[{label(rank, world_size)}] ", label(rank, world_size)
    elif len(ranks) == world_size:
        tag, still = f"[all {world_size} ranks] ", f"all {world_size} ranks"
    else:
        words = ", ".join(map(str, ranks))
        tag, still = f"[ranks {words} of {world_size}] ", f"ranks {words} of {world_size}"
    was = "were" if len(ranks) > 1 else "was"
    head = (
        f"the session was interrupted by {signal} while {still} {was} in the test: no rank "
        "failed, none is the root cause (where each was, below)"
    )
    return Blame(rank, report, (rank,), "  <- shown", "", head, tag)


def mark_interrupted(report: TestReport, signal: str) -> None:
    """``report`` is of a rank the interruption ``signal`` stopped in the test."""
    setattr(report, INTERRUPTED_ATTR, signal)
