"""N per-rank reports -> the reports pytest sees for one distributed test.

Runs where one report per test is written: in the controller (pool mode) and in rank 0 of a
launched world (launcher mode, main thread or watchdog). Pure logic over pytest's report
objects; imports no torch.

Policy (outcome precedence over ranks): any rank failed, crashed or hung -> failed; otherwise any
rank skipped -> skipped (the reason says which ranks); otherwise any rank xfailed -> xfailed;
otherwise passed (xpassed when the test was expected to fail). Ranks killed while they waited for
ranks that skipped in setup, the first to end the test, did not fail (:func:`waited_for_a_skip`).
The failure report starts with a per-rank table naming the root-cause rank (the first to fail)
and the collateral ones, then shows the root cause's traceback; other failing ranks' tracebacks
follow as sections. Captured output of every rank becomes a section titled like pytest's own plus
the rank, and each such section starts with a line naming the rank (junitxml joins section
contents without their titles).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping, Sequence

from pytest import TestReport

from .._compat import (
    ExceptionChainRepr,
    ExceptionRepr,
    ReprEntryNative,
    ReprFileLocation,
    ReprTracebackNative,
    json_report_data,
)
from .interrupted import interrupted_blame
from .rootcause import (
    CAUSE_ATTR,
    COLLATERAL_ATTR,
    NOTE_ATTR,
    UNFINISHED_ATTR,
    blame,
    head,
    label,
    root_cause,
)

__all__ = ["CAUSE_ATTR", "COLLATERAL_ATTR", "NOTE_ATTR", "UNFINISHED_ATTR", "label", "root_cause"]

WHENS = ("setup", "call", "teardown")
#: The tag a merged report's crash line starts with (rootcause.Blame.tag).
_RANK_TAG = re.compile(r"^\[(?:ranks? [\d, ]+(?:/\d+| of \d+)|all \d+ ranks)\] ")
#: PyTorch's repro hint, which its test harness appends to an exception's first argument
#: (common_utils.print_repro_on_failure); in a one-line summary an exception of several
#: arguments shows it as literal ``\n`` escapes. The traceback below keeps it.
_REPRO_HINT = re.compile(
    r"(?:\\n)+To execute this test, run the following from the base repo dir:.*?"
    r"PYTORCH_PRINT_REPRO_ON_FAILURE=0"
)

#: On a collateral report: whether the rank was killed inside the test's setup or call.
IN_TEST_ATTR = "distrank_in_test"
#: On a synthesized report: who is out of step, from the ranks' flight recorders (a hang's
#: verdict, :mod:`collectives`); shown under the summary line.
VERDICT_ATTR = "distrank_verdict"


def _short(report: TestReport) -> str:
    """One line saying why a report is not a pass."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        first = str(crash.message).splitlines()[0] if crash.message else ""
        first = _REPRO_HINT.sub("", first)
        return _RANK_TAG.sub("", first)  # the merged report's own tag, if merged already
    text = str(longrepr or "").strip().splitlines()
    # A plain-text failure (fixture lookup error, collection-style text): its "E " line says
    # what went wrong ("fixture 'x' not found"); the last line is only a path.
    errors = [line[1:].strip() for line in text if line.startswith("E ")]
    if errors:
        return errors[0]
    return text[-1] if text else ""


#: A per-rank table row is cut to this many characters (a 20 MB exception message helps no one
#: twice; the traceback below still has it, as pytest shows it).
STORY_LIMIT = 300
#: The crash line (``-ra``, junit's ``message=``) is cut to this many characters.
CRASH_LIMIT = 4000


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def rank_story(reports: Sequence[TestReport]) -> str:
    """What one rank did in this test, in a few words, for the per-rank table."""
    return _cut(_story(reports), STORY_LIMIT)


def _story(reports: Sequence[TestReport]) -> str:
    for report in reports:
        note = getattr(report, NOTE_ATTR, None)
        if note:
            return str(note)
        if report.failed:
            return f"failed in {report.when}: {_short(report)}"
        if report.skipped:
            if hasattr(report, "wasxfail"):
                return "xfailed"
            return f"skipped in {report.when}: {_short(report)}"
    if any(hasattr(r, "wasxfail") for r in reports):
        return "xpassed"
    return "passed" if reports else "no report"


def _relabel_sections(
    reports: Iterable[tuple[int, TestReport]], world_size: int
) -> list[tuple[str, str]]:
    """Every rank's sections, titled and tagged with its rank; a section that says exactly
    what an earlier rank's of the same title said is folded into one line naming that rank."""
    sections = []
    said: dict[tuple[str, str], str] = {}
    for rank, report in reports:
        for title, content in report.sections:
            tag = label(rank, world_size)
            first = said.setdefault((title, content), tag)
            if first != tag:
                content = f"the same as {first}\n"
            sections.append((f"{title} ({tag})", f"[{tag}]\n{content}"))
    return sections


def _base(
    template: TestReport,
    phase: Sequence[tuple[int, TestReport]],
    world_size: int,
    outcome: str,
    longrepr: object,
) -> TestReport:
    report = TestReport(
        template.nodeid,
        template.location,
        template.keywords,
        outcome,  # type: ignore[arg-type]
        longrepr,  # type: ignore[arg-type]
        template.when,
        sections=_relabel_sections(phase, world_size),
        duration=max(r.duration for _, r in phase),
        start=min(r.start for _, r in phase),
        stop=max(r.stop for _, r in phase),
        user_properties=_user_properties(phase),
    )
    wasxfail = getattr(template, "wasxfail", None)
    if wasxfail is not None:
        report.wasxfail = wasxfail
    json_report_data(report, phase, template)  # pytest-json-report's metadata, of every rank
    return report


def _user_properties(phase: Sequence[tuple[int, TestReport]]) -> list[tuple[str, object]]:
    seen: list[tuple[str, object]] = []
    for _, report in phase:
        for prop in report.user_properties:
            if prop not in seen:
                seen.append(prop)
    return seen


def _failure(
    phase: Sequence[tuple[int, TestReport]], world_size: int, stories: Mapping[int, str]
) -> TestReport:
    failures = [(rank, r) for rank, r in phase if r.failed]
    found = interrupted_blame(failures, world_size) or blame(failures, world_size)
    root, root_report = found.shown, found.report
    collateral = [rank for rank, r in failures if getattr(r, COLLATERAL_ATTR, False)]
    verdict = next((getattr(r, VERDICT_ATTR) for _, r in phase if hasattr(r, VERDICT_ATTR)), "")
    table = head(world_size, stories, found, collateral, verdict)
    tag = found.tag
    # A copy: the ranks' reports stay as they came (merged twice, as launcher mode's check of a
    # sub-world's result and then its report do, they got the table twice).
    longrepr = copy.deepcopy(root_report.longrepr)
    shown = {_same_failure_key(str(longrepr)): root}
    if not isinstance(longrepr, ExceptionRepr):
        # A plain-text failure (fixture lookup error, strict XPASS): give it a crash line, so
        # that ``-ra`` and junit's message= name the rank too.
        text = str(longrepr or "")
        first = text.strip().splitlines()[0] if text.strip() else "failed"
        lines = [line + "\n" for line in text.splitlines()]
        path, lineno = root_report.location[0], (root_report.location[1] or 0) + 1
        longrepr = ExceptionChainRepr(
            [(ReprTracebackNative(lines), ReprFileLocation(path, lineno, first), None)]
        )
    chain = longrepr.chain if isinstance(longrepr, ExceptionChainRepr) else None
    first_tb = chain[0][0] if chain else longrepr.reprtraceback
    first_tb.reprentries = [ReprEntryNative(table), *first_tb.reprentries]
    crash = longrepr.reprcrash
    if crash is not None and not crash.message.startswith(tag):
        crash.message = tag + _cut(found.preface + crash.message, CRASH_LIMIT)
    for rank, report in failures:
        if rank == root:
            continue
        text = str(report.longrepr)
        title = f"traceback of {label(rank, world_size)}"
        key = _same_failure_key(text)
        if key in shown:
            longrepr.addsection(title, f"the same as {label(shown[key], world_size)}")
        else:
            shown[key] = rank
            longrepr.addsection(title, text)
    return _base(root_report, phase, world_size, "failed", longrepr)


_ARGUMENT_LINE = re.compile(r"^\w+ = ")


def _same_failure_key(text: str) -> str:
    """A traceback without its argument lines (``rank = 1``), which differ on every rank."""
    return "\n".join(line for line in text.splitlines() if not _ARGUMENT_LINE.match(line))


def ranks_words(ranks: Iterable[int]) -> str:
    """``[1]`` -> ``rank 1``; ``[0, 2]`` -> ``ranks 0, 2``; ``range(128)`` -> ``ranks 0-127``."""
    unique = set(ranks)
    return f"{'rank' if len(unique) == 1 else 'ranks'} {rank_ranges(unique)}"


#: The shortest run of consecutive ranks written as a range (``0-3``; ``0, 1, 2`` stays).
RUN = 4


def rank_ranges(ranks: Iterable[int]) -> str:
    """Ranks in ascending order, each run of :data:`RUN` or more consecutive ones as
    ``first-last``: ``[5, 0, 1, 2, 3, 7]`` -> ``0-3, 5, 7``."""
    parts: list[str] = []
    run: list[int] = []
    for rank in [*sorted(set(ranks)), None]:
        if run and rank == run[-1] + 1:
            run.append(rank)
            continue
        if len(run) >= RUN:
            parts.append(f"{run[0]}-{run[-1]}")
        else:
            parts += [str(r) for r in run]
        run = [] if rank is None else [rank]
    return ", ".join(parts)


def _skip(
    phase: Sequence[tuple[int, TestReport]], world_size: int, waited: Sequence[int] = ()
) -> TestReport:
    skipped = [(rank, r) for rank, r in phase if r.skipped]
    template = skipped[0][1]
    by_reason: dict[str, list[int]] = {}
    for rank, report in skipped:
        by_reason.setdefault(_short(report), []).append(rank)
    if len(skipped) == world_size and len(by_reason) == 1:
        reason = next(iter(by_reason))
    else:
        skipped_ranks = [rank for rank, _ in skipped]
        others = [rank for rank in range(world_size) if rank not in skipped_ranks]
        ran = _did_not(others, waited, len(skipped_ranks)) if others else ""
        if len(by_reason) == 1:
            where = f"{ranks_words(skipped_ranks)} of {world_size}{ran}"
            reason = f"skipped on {where}: {_short(template)}"
        else:
            parts = "; ".join(f"{ranks_words(rs)}: {why}" for why, rs in by_reason.items())
            reason = f"skipped on {len(skipped)} of {world_size} ranks{ran}; {parts}"
    longrepr = template.longrepr
    if isinstance(longrepr, tuple):
        longrepr = (longrepr[0], longrepr[1], f"Skipped: {reason}")
    return _base(template, phase, world_size, "skipped", longrepr)


def _did_not(others: Sequence[int], waited: Sequence[int], skipped: int) -> str:
    """`` (rank 0 did not)``, and which of those ranks were stopped waiting for the skipped."""
    if not waited:
        return f" ({ranks_words(others)} did not)"
    was = "was" if len(waited) == 1 else "were"
    stopped = f"{was} stopped while waiting for {'it' if skipped == 1 else 'them'}"
    if list(waited) == list(others):
        return f" ({ranks_words(others)} did not, and {stopped})"
    return f" ({ranks_words(others)} did not; {ranks_words(waited)} {stopped})"


def _xfail(phase: Sequence[tuple[int, TestReport]], world_size: int) -> TestReport:
    xfailed = [(rank, r) for rank, r in phase if r.skipped and hasattr(r, "wasxfail")]
    template = xfailed[0][1]
    report = _base(template, phase, world_size, "skipped", template.longrepr)
    if len(xfailed) < world_size:
        reason = getattr(template, "wasxfail", "")
        where = ranks_words([r for r, _ in xfailed])
        report.wasxfail = f"[xfailed on {where} of {world_size}] {reason}"
    return report


def merge_phase(
    phase: Sequence[tuple[int, TestReport]],
    world_size: int,
    stories: Mapping[int, str],
    waited: Sequence[int] = (),
) -> TestReport:
    """Merge the reports of one phase (each ``(rank, report)``) into one report; ``waited``: the
    ranks stopped while they waited for ranks that skipped (:func:`waited_for_a_skip`)."""
    if any(r.failed for _, r in phase):
        return _failure(phase, world_size, stories)
    if any(r.skipped and not hasattr(r, "wasxfail") for _, r in phase):
        return _skip(phase, world_size, waited)
    if any(r.skipped for _, r in phase):
        return _xfail(phase, world_size)
    template = phase[0][1]
    xpassed = [(rank, r) for rank, r in phase if hasattr(r, "wasxfail")]
    if xpassed:
        template = xpassed[0][1]
    if len(phase) == 1 or not any(r.sections or r.user_properties for _, r in phase):
        # The common case: every rank passed and said nothing. No relabelling to do.
        template.duration = max(r.duration for _, r in phase)
        template.start = min(r.start for _, r in phase)
        template.stop = max(r.stop for _, r in phase)
        template.sections = _relabel_sections(phase, world_size)
        json_report_data(template, phase, template)
        return template
    return _base(template, phase, world_size, "passed", None)


def _subtest_key(report: TestReport) -> tuple[str, str] | None:
    """Which subtest a report is of (message and keyword arguments), or None: not a subtest."""
    context = getattr(report, "context", None)
    if context is None or type(report).__name__ != "SubtestReport":
        return None
    return (str(getattr(context, "msg", "")), repr(sorted(getattr(context, "kwargs", {}).items())))


def _merge_subtest(
    phase: Sequence[tuple[int, TestReport]], world_size: int, stories: Mapping[int, str]
) -> TestReport:
    """One subtest over the ranks that ran it, still a subtest report for pytest's terminal."""
    template = phase[0][1]
    merged = merge_phase(phase, world_size, stories)
    if type(merged) is not type(template):
        merged.__class__ = type(template)
    merged.context = template.context  # type: ignore[attr-defined]
    return merged


def _collateral(report: TestReport) -> bool:
    return bool(getattr(report, COLLATERAL_ATTR, False))


def waited_for_a_skip(per_rank: Mapping[int, Sequence[TestReport]]) -> list[int]:
    """The ranks killed while they waited for peers that skipped the test in setup; [] unless
    the first rank to end the test did so with a skip in its setup and no rank failed on its own.

    Ranks can decide a skip each for itself: a ``skipif`` on per-rank state, or a plugin that
    decides from the outcomes this rank process saw (pytest-dependency, a conftest that skips
    after a failure). The ranks that did not skip run the test alone and wait for the others in
    its first collective until the failure grace ends. That wait is the skip's doing, not a
    failure: the test is skipped, with the skip's reason. A rank that failed on its own (a failed
    report, a crash, a failed subtest, even after the skip) still fails the test.
    """
    own = [r for reports in per_rank.values() for r in reports if not _collateral(r)]
    if any(r.failed for r in own):
        return []
    skips = [r for r in own if r.skipped and not hasattr(r, "wasxfail") and not _subtest_key(r)]
    if not skips or any(r.when != "setup" for r in skips):
        return []  # (no clock compared: launcher-mode ranks are other hosts' processes)
    killed = [r for reports in per_rank.values() for r in reports if _collateral(r)]
    if not all(getattr(r, IN_TEST_ATTR, True) for r in killed):
        return []  # one was killed elsewhere (before its setup, in teardown): not the skip's
    return sorted(rank for rank, reports in per_rank.items() if any(map(_collateral, reports)))


def merge_test(per_rank: Mapping[int, Sequence[TestReport]], world_size: int) -> list[TestReport]:
    """All phase reports of every rank -> the phase reports pytest sees, counted once.

    A rank whose setup failed or skipped has no call report; when another rank's call failed
    (typically a peer left waiting in a collective), the failure wins and setup is shown as passed
    (unless the peer was killed waiting for ranks that skipped: :func:`waited_for_a_skip`).
    """
    stories = {rank: rank_story(reports) for rank, reports in per_rank.items()}
    waited = waited_for_a_skip(per_rank)
    if waited:  # their kill reports go: the test is skipped
        per_rank = {rank: [r for r in rs if not _collateral(r)] for rank, rs in per_rank.items()}
    by_when: dict[str, list[tuple[int, TestReport]]] = {w: [] for w in WHENS}
    subtests: dict[tuple[str, str], list[tuple[int, TestReport]]] = {}
    for rank in sorted(per_rank):
        for report in per_rank[rank]:
            key = _subtest_key(report)
            if key is not None:
                subtests.setdefault(key, []).append((rank, report))
            else:
                by_when[report.when].append((rank, report))
    setup, call, teardown = by_when["setup"], by_when["call"], by_when["teardown"]
    out: list[TestReport] = []
    # Each subtest (pytest's subtests fixture) is merged over the ranks that ran it, and shown
    # before the test's own call report, as pytest shows them.
    out_subtests = [_merge_subtest(phase, world_size, stories) for phase in subtests.values()]
    if setup:
        # A rank killed before its setup began, because a peer failed in call, did not fail the
        # setup: the call's failure is the test's (its table names the killed rank).
        setup_failed = any(r.failed and not _collateral(r) for _, r in setup)
        call_failed = any(r.failed for _, r in call)
        if not setup_failed and call_failed:
            ran = [(rank, r) for rank, r in setup if r.passed] or setup[:1]
            out.append(merge_phase(ran, world_size, stories))
        else:
            out.append(merge_phase(setup, world_size, stories, waited))
        out.extend(out_subtests)
        if out[0].passed and call:
            out.append(merge_phase(call, world_size, stories))
    else:
        out.extend(out_subtests)
    if teardown:
        out.append(merge_phase(teardown, world_size, stories))
    return out


def annotate(
    merged: Sequence[TestReport],
    per_rank: Mapping[int, Sequence[TestReport]],
    world_size: int,
    pids: Sequence[int],
    rerun: str,
) -> None:
    """Per-rank junit properties on the last report; the rerun command under every failure.

    junitxml writes a teardown report's ``user_properties`` as ``<property>`` elements of the
    testcase: one per rank, with what it did, how long it took and its process id.
    """
    if merged:
        properties = []
        for rank in range(world_size):
            reports = per_rank.get(rank, ())
            seconds = sum(r.duration for r in reports)
            pid = pids[rank] if rank < len(pids) else "?"
            properties.append(
                (
                    f"distrank {label(rank, world_size)}",
                    f"{rank_story(reports)}; {seconds:.3f} s; pid {pid}",
                )
            )
        merged[-1].user_properties = [*merged[-1].user_properties, *properties]
    for report in merged:
        if report.failed and isinstance(report.longrepr, ExceptionRepr):
            report.longrepr.addsection("distrank: rerun just this test", rerun)
