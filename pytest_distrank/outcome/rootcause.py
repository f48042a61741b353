"""Which rank's failure explains a failed distributed test, and the head of its report.

Runs where one report per test is written: in the controller (pool mode) and in rank 0 of a
launched world (launcher mode). Pure logic over pytest's report objects and the attributes the
plugin sets on the reports it writes itself (:mod:`merge`); imports no torch.

The rule, the first that applies:

1. Every rank failed the same way (the same exception type at the same file and line; the
   messages may differ by rank): the head says so instead of picking one, rank 0 shown.
2. A rank that crashed (a written, non-collateral report that is not a rank left unfinished)
   explains the others: its peers fail *because* it died ("Connection reset by peer"), and their
   reports often arrive before the crash is noticed. Then the first rank to fail on its own, by
   its report's stop time.
3. No rank failed on its own, and ranks were left unfinished (a hang, a deadlock): the
   collective verdict decides (:class:`collectives.Verdict`, carried on the unfinished ranks'
   reports as :data:`CAUSE_ATTR`). The rank that never entered the collective its peers wait in
   is the root cause (even one that passed); in a mismatch the minority, and with no majority
   every side. The ranks left waiting are collateral.
4. Otherwise the first rank to stop, ranks killed as collateral only when there is nothing else.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from pytest import TestReport

from .._compat import ReprFileLocation

#: Attribute of a written report (crash, kill, timeout) with one line on what happened.
NOTE_ATTR = "distrank_note"
#: Attribute marking a written report of a rank killed because another rank failed first (or
#: left waiting for the ranks a collective verdict blames).
COLLATERAL_ATTR = "distrank_collateral"
#: Attribute marking a written report of a rank that did not finish (timed out, a deadlock).
UNFINISHED_ATTR = "distrank_unfinished"
#: On an unfinished rank's report: the verdict's blame, ``(root ranks, subject, predicate)``
#: (:class:`collectives.Verdict`), when the flight records name one.
CAUSE_ATTR = "distrank_cause"

Failures = Sequence[tuple[int, TestReport]]


def label(rank: int, world_size: int) -> str:
    return f"rank {rank}/{world_size}"


@dataclasses.dataclass(frozen=True)
class Blame:
    """Who is blamed for a failed phase, and how the report says it."""

    #: The rank whose traceback is shown first, and its report.
    shown: int
    report: TestReport
    #: The rows marked in the per-rank table, and the mark.
    marked: tuple[int, ...]
    mark: str
    #: After "root cause: " in the head ("rank 2/4 never entered all_reduce #2 ...").
    cause: str
    #: The head's start instead of "N of M ranks failed", when all failed the same way.
    same_way: str = ""
    #: The crash line (``-ra``, junit's ``message=``) starts with it ("[rank 2/4] ").
    tag: str = ""
    #: The crash line's words before the shown report's own message ("never entered ...; ").
    preface: str = ""


def _collateral(report: TestReport) -> bool:
    return bool(getattr(report, COLLATERAL_ATTR, False))


def _written(report: TestReport) -> bool:
    return getattr(report, NOTE_ATTR, None) is not None


def root_cause(failures: Failures) -> tuple[int, TestReport]:
    """The rank (and its report) whose failure explains the others (rules 2 and 4 above)."""

    def rank_order(f: tuple[int, TestReport]) -> tuple[int, float, int]:
        rank, report = f
        crashed = _written(report) and not _collateral(report)
        crashed = crashed and not getattr(report, UNFINISHED_ATTR, False)
        own = not _written(report) and not _collateral(report)
        order = 0 if crashed else 1 if own else 3 if _collateral(report) else 2
        return (order, report.stop or 0.0, rank)

    return min(failures, key=rank_order)


def blame(failures: Failures, world_size: int) -> Blame:
    """The root cause of a failed phase (``failures``: its failed reports, by rank)."""
    same = same_way(failures, world_size)
    if same:
        rank, report = failures[0]
        tag = f"[all {world_size} ranks] "
        return Blame(rank, report, (rank,), "  <- shown", "", same, tag)
    rank, report = root_cause(failures)
    on_its_own = any(not _written(r) or not getattr(r, UNFINISHED_ATTR, False) for _, r in failures)
    cause = (
        None
        if on_its_own
        else next(
            (getattr(r, CAUSE_ATTR) for _, r in failures if getattr(r, CAUSE_ATTR, None)), None
        )
    )
    if cause is None or not cause[0]:
        tag = f"[{label(rank, world_size)}] "
        return Blame(rank, report, (rank,), "  <- root cause", label(rank, world_size), tag=tag)
    roots, subject, predicate = tuple(cause[0]), str(cause[1]), str(cause[2])
    failed = {r: rep for r, rep in failures}
    shown = next((r for r in sorted(roots) if r in failed), rank)
    return Blame(
        shown,
        failed.get(shown, report),
        roots,
        "  <- root cause",
        f"{subject} {predicate}",
        tag=f"[{subject}] ",
        preface=f"{predicate}; ",
    )


_NAME = re.compile(r"^[A-Za-z_][\w.]*$")


def failure_key(report: TestReport) -> tuple[str, int, str] | None:
    """Where and how a rank failed on its own: (file, line, exception type); None for a report
    the plugin wrote (a crash, a timeout) or one without a crash location."""
    if _written(report):
        return None
    crash = getattr(report.longrepr, "reprcrash", None)
    if not isinstance(crash, ReprFileLocation):
        return None
    head = str(crash.message).split(":", 1)[0] if ":" in str(crash.message) else ""
    return (str(crash.path), int(crash.lineno), head if _NAME.match(head) else "")


def same_way(failures: Failures, world_size: int) -> str:
    """ "all 4 ranks failed the same way (ValueError at test_x.py:12)" when every rank of the
    world failed on its own at the same place with the same exception type; else ""."""
    if world_size < 2 or len(failures) != world_size:
        return ""
    keys = {failure_key(r) for _, r in failures}
    if len(keys) != 1 or None in keys:
        return ""
    ((path, lineno, kind),) = keys  # type: ignore[misc]
    where = "" if _insides(path) else f" at {path.rsplit('/', 1)[-1]}:{lineno}"
    return f"all {world_size} ranks failed the same way ({kind or 'an error'}{where})"


#: Where a failure's location says nothing to a test's author: the frames of pytest, pluggy and
#: the plugin (a failure they raise with ``pytrace=False``, as ``--distrank-leftovers=fail``'s).
INSIDES = ("/_pytest/", "/pluggy/", "/pytest_distrank/")


def _insides(path: str) -> bool:
    return any(part in path.replace("\\", "/") for part in INSIDES)


def head(
    world_size: int,
    stories: Mapping[int, str],
    found: Blame,
    collateral: Sequence[int],
    verdict: str = "",
) -> list[str]:
    """The lines above the shown traceback: the head, the verdict, one row per rank."""
    bad = [r for r, s in stories.items() if not s.startswith(("passed", "skipped", "xfail"))]
    failed = len([r for r in bad if r not in collateral])
    mark = found.mark
    if found.same_way:
        text = f"{found.same_way}; shown: {label(found.shown, world_size)}"
    elif found.preface:  # the verdict blames: count every rank that did not pass
        text = f"{len(bad)} of {world_size} ranks failed; root cause: {found.cause}"
    elif failed:
        killed = f", {len(collateral)} killed after it" if collateral else ""
        text = f"{failed} of {world_size} ranks failed{killed}; root cause: {found.cause}"
    else:
        # Nobody failed on its own: ranks were killed after a peer skipped (see their rows).
        text = (
            f"no rank failed on its own; {len(collateral)} of {world_size} killed after the "
            "grace period"
        )
        mark = "  <- shown first"
    lines = [f"distrank: {text}\n"]
    if verdict:
        lines.append(f"collectives: {verdict}\n")
    width = len(label(world_size - 1, world_size))
    for rank in range(world_size):
        story = stories.get(rank, "no report")
        row_mark = mark if rank in found.marked else ""
        lines.append(f"  {label(rank, world_size):<{width}}  {story}{row_mark}\n")
    lines.append(f"---------- traceback of {label(found.shown, world_size)} ----------\n")
    return lines
