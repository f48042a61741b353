"""Launcher mode, the reporting side: what rank 0 tells pytest about a test and about the run.

Runs in rank 0's pytest process of a launched world (main thread, or its watchdog thread when the
main thread is stuck). Pure logic over pytest's report objects and text; imports no torch. The
merge itself is :func:`merge.merge_test`, and the report for a rank stuck in a collective or timed
out is :func:`endgame.unfinished_report`, both the same as pool mode's; this module builds the
reports only launcher mode needs: a rank that sent neither its reports nor its stack, a rank whose
pytest session ended in the test, a rank whose process group did not come up, a control payload
that did not verify (:mod:`auth`), the tests the run could not reach, and pool mode's check
failures (:mod:`outcome.checks`) told as launcher mode goes on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytest import TestReport

from ..outcome import checks
from ..outcome.endgame import Location
from ..outcome.merge import label, synthesized_failure
from .channel import Forged

#: What follows a check's failure in launcher mode (pool mode replaces the pool instead).
FRESH_GROUP = (
    "Every rank's process group was created anew before the next test, so that it does not "
    "inherit the damage."
)

#: At most this many node ids of each kind are listed in a collection mismatch.
SHOWN_NODEIDS = 5


def silent_report(
    nodeid: str, location: Location, rank: int, world_size: int, log: str, now: float
) -> TestReport:
    """A failed report for a rank that sent neither its reports nor its stack when asked.

    Where it was is unknown (its watchdog did not run: a crash, or code that holds the GIL), so
    the report goes under call, after the passed setup the caller fills in.
    """
    tag = label(rank, world_size)
    note = (
        f"sent neither its reports nor its stack; it may have crashed or be stuck holding "
        f"the GIL (its log: {log})"
    )
    crash = f"no report from {tag} in call"
    text = (
        f"{tag} sent neither its reports nor its stack in time: it may have crashed, or be "
        "stuck in code that holds the GIL.\nSee its log "
        f"({log}) and the launcher's output (torchrun prints each rank's exit code)."
    )
    return synthesized_failure(
        nodeid, location, "call", crash, text, note=note, collateral=False, stop=now
    )


def stopped_report(
    nodeid: str, location: Location, when: str, at: str, message: str, now: float
) -> TestReport:
    """A failed report for a rank whose pytest session ended in the test (``pytest.exit()``,
    ``KeyboardInterrupt``): ``message`` says which and where; ``at`` is where the rank was
    ("in call", "before its setup began")."""
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    crash = f"stopped serving {at}: {first or 'its pytest session ended'}"
    text = (
        f"{message}\nIts pytest session ended, so the launched world cannot run the remaining "
        "tests. pytest.fail() or pytest.skip() end only the test; pytest.exit() and "
        "KeyboardInterrupt end the rank's whole session."
    )
    return synthesized_failure(nodeid, location, when, crash, text, note=crash, stop=now)


def check_report(
    nodeid: str, location: Location, rank: int, world_size: int, crash: str, more: str, now: float
) -> TestReport:
    """A failed check after the test (``crash``: :mod:`outcome.checks`' line, as in pool mode),
    with ``more``: what launcher mode did about it."""
    text = f"{label(rank, world_size)} {crash}\n{more}"
    return synthesized_failure(nodeid, location, "call", crash, text, note=crash, stop=now)


def forked_report(
    nodeid: str, location: Location, rank: int, world_size: int, pids: Sequence[int], now: float
) -> TestReport:
    """A test left forks of the rank running the rank's own code (:func:`checks.forked_crash`),
    and what launcher mode did about them."""
    more = (
        "End a child made with os.fork() with os._exit() (or use subprocess, or "
        f"multiprocessing, which manages its children). The rank killed it. {FRESH_GROUP}"
    )
    crash = checks.forked_crash(pids)
    return check_report(nodeid, location, rank, world_size, crash, more, now)


def forged_report(
    nodeid: str, location: Location, world_size: int, forged: Forged, now: float
) -> TestReport:
    """A failed report for a control payload that did not verify (or a counter no payload backs):
    it names the key and the rank it speaks for, and what that means; never a pass."""
    tag = label(forged.rank, world_size)
    crash = f"{forged.headline}: {forged.key!r} {forged.why}"
    text = (
        f"{tag}: {forged}.\nWhat the rank itself sent for this test may still have come; the "
        "test fails either way, and the run stops after it: its other results could not be "
        f"trusted. {forged.advice}"
    )
    return synthesized_failure(nodeid, location, "call", crash, text, note=crash, stop=now)


def setup_error_report(nodeid: str, location: Location, message: str, now: float) -> TestReport:
    """This rank could not even start the test (its process group did not come up)."""
    first = message.strip().splitlines()[-1] if message.strip() else "error in setup"
    return synthesized_failure(
        nodeid, location, "setup", first, message, note=f"error in setup: {first}", stop=now
    )


def not_run_reports(nodeid: str, location: Location, reason: str) -> list[TestReport]:
    """What pytest sees for a test the run stopped before: skipped, with the reason."""
    path, lineno, _ = location
    longrepr = (path, (lineno or 0) + 1, f"Skipped: not run: {reason}")
    return [
        TestReport(nodeid, location, {}, "skipped", longrepr, "setup"),
        TestReport(nodeid, location, {}, "passed", None, "teardown"),
    ]


def _shown(nodeids: Sequence[str]) -> str:
    listed = ", ".join(nodeids[:SHOWN_NODEIDS])
    more = len(nodeids) - SHOWN_NODEIDS
    return listed + (f" (and {more} more)" if more > 0 else "")


def collection_mismatch(collected: Mapping[int, Sequence[str]], who: str) -> str | None:
    """Why the ranks cannot run in lock-step, naming the ranks and node ids; None if they can.

    ``collected`` maps each rank to its ordered node ids; ``who`` says which world, e.g.
    ``2 ranks, torchrun``.
    """
    reference = list(collected[0])
    differing = [r for r in sorted(collected) if list(collected[r]) != reference]
    if not differing:
        return None
    ranks = ", ".join(str(r) for r in differing)
    lines = [
        f"pytest-distrank: the ranks of this launched world ({who}) collected different tests, "
        f"so they cannot run them in lock-step; no test was run.",
        f"Rank 0 collected {len(reference)} tests; rank(s) {ranks} collected others:",
    ]
    known = set(reference)
    for rank in differing:
        mine = list(collected[rank])
        extra = [n for n in mine if n not in known]
        mine_set = set(mine)
        lacking = [n for n in reference if n not in mine_set]
        if not extra and not lacking:
            at = next(i for i, (a, b) in enumerate(zip(mine, reference, strict=True)) if a != b)
            lines.append(
                f"  rank {rank}: the same tests in another order; at position {at} it has "
                f"{mine[at]} where rank 0 has {reference[at]}"
            )
            continue
        parts = []
        if extra:
            parts.append(f"{len(extra)} that rank 0 lacks: {_shown(extra)}")
        if lacking:
            parts.append(f"not {len(lacking)} of rank 0's: {_shown(lacking)}")
        count = f"{len(mine)} test" + ("" if len(mine) == 1 else "s")
        lines.append(f"  rank {rank}: {count}; " + "; ".join(parts))
    lines.append(
        "Typical causes: a conftest.py or collection hook that depends on RANK or LOCAL_RANK; "
        "different files on different nodes; command-line arguments (-k, -m, paths) that "
        "differ between ranks; a random test order with a different seed per rank."
    )
    lines.append("Make every rank collect the same tests in the same order, then run again.")
    return "\n".join(lines)


def missing_collection(missing: Sequence[int], seconds: float) -> str:
    """Why no test runs when ``missing`` ranks never sent their collection (nor so their log's
    path: the launcher's output is where to look)."""
    ranks = ", ".join(str(r) for r in missing)
    return (
        f"pytest-distrank: rank(s) {ranks} did not report their collected tests within "
        f"{seconds:.0f} s, so no test was run. They may have failed before collecting (a "
        "conftest.py or plugin that fails only there, an import error): see their output in the "
        "launcher's log."
    )
