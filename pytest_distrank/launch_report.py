"""Launcher mode, the reporting side: what rank 0 tells pytest about a test and about the run.

Runs in rank 0's pytest process of a launched world (main thread, or its watchdog thread when the
main thread is stuck). Pure logic over pytest's report objects
and text; imports no torch. The merge itself is :func:`merge.merge_test`, the same as spawn mode;
this module builds the reports that go into it for ranks that could not send their own (stuck in
a collective, timed out, silent), and the reports of tests the run could not reach.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from _pytest.reports import TestReport

from .merge import label, synthesized_failure
from .stacks import format_stack, where_blocked

Location = tuple[str, int | None, str]
#: At most this many node ids of each kind are listed in a collection mismatch.
SHOWN_NODEIDS = 5


@dataclasses.dataclass(frozen=True)
class Stuck:
    """Why a rank is reported from outside: its stack and what started the end of the test."""

    when: str
    dump: str
    log: str
    #: Seconds since the first failure or skip (None: the deadline passed, nobody failed).
    after_failure: float | None
    trigger: str
    timeout: float
    timeout_source: str


def fill_passed(reports: list[TestReport], nodeid: str, location: Location, when: str) -> None:
    """Passed reports for the phases before ``when`` that a rank finished but did not send.

    The merge shows a phase only after a passed setup; a rank stuck in call did pass its setup.
    """
    if any(not r.passed for r in reports if r.when == "setup"):
        return  # no call phase after a failed or skipped setup
    have = {r.when for r in reports}
    for earlier in ("setup", "call", "teardown"):
        if earlier == when:
            break
        if earlier not in have:
            reports.append(TestReport(nodeid, location, {}, "passed", None, earlier))


def stuck_report(
    nodeid: str,
    location: Location,
    test_file: str,
    rank: int,
    world_size: int,
    stuck: Stuck,
    now: float,
) -> TestReport:
    """A failed report for a rank that did not finish the test (PITFALLS-style, as in pools)."""
    tag = label(rank, world_size)
    when = stuck.when
    if not stuck.dump:
        note = (
            f"sent neither its reports nor its stack; it may have crashed or be stuck holding "
            f"the GIL (its log: {stuck.log})"
        )
        crash = f"no report from {tag} in {when}"
        text = (
            f"{tag} sent neither its reports nor its stack in time: it may have crashed, or be "
            "stuck in code that holds the GIL.\nSee its log "
            f"({stuck.log}) and the launcher's output (torchrun prints each rank's exit code)."
        )
        return synthesized_failure(
            nodeid, location, when, crash, text, note=note, collateral=False, stop=now
        )
    where = where_blocked(stuck.dump, test_file)
    if stuck.after_failure is not None:
        note = f"stuck {stuck.after_failure:.1f} s after {stuck.trigger}; {where}"
        crash = f"stuck in {when}: {stuck.trigger} first"
        collateral = True
    else:
        note = f"timed out in {when} after {stuck.timeout:g} s; {where}"
        crash = (
            f"Timeout: still in {when} after {stuck.timeout:g} s "
            f"(timeout from {stuck.timeout_source})"
        )
        collateral = False
    stack = format_stack(stuck.dump, test_file, stuck.log)
    text = f"{tag}: {crash}\n{where}\n{stack}"
    return synthesized_failure(
        nodeid, location, when, crash, text, note=note, collateral=collateral, stop=now
    )


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


def missing_collection(missing: Sequence[int], seconds: float, logs: Mapping[int, str]) -> str:
    ranks = ", ".join(str(r) for r in missing)
    where = "; ".join(f"rank {r}: {logs[r]}" for r in missing if r in logs)
    return (
        f"pytest-distrank: rank(s) {ranks} did not report their collected tests within "
        f"{seconds:.0f} s, so no test was run. They may have failed before collecting (a "
        "conftest.py or plugin that fails only there, an import error): see their output in the "
        "launcher's log" + (f" ({where})" if where else "") + "."
    )
