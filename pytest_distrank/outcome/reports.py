"""Every report the plugin makes up itself, beside the ones its ranks send: one home, both modes.

Runs where a test's outcome is decided: in the controller (pool mode) and in rank 0 of a launched
world (launcher mode: its main thread, or its watchdog thread when the main thread is stuck).
Pure logic from plain values (node id, location, phase, rank, world size, pids, text) to pytest's
report objects; imports no torch. The callers decide (a rank crashed, stopped serving or did not
finish, a check after the test failed, a test could not start); a builder here only writes the
report. Where the modes say different things, the mode's words come in as a value (``more``,
``after``: the pool was replaced, the process group was created anew).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from pytest import TestReport

from .._compat import ExceptionChainRepr, ReprFileLocation, ReprTracebackNative
from .checks import forked_crash
from .endgame import ENDING_ATTR, LATE, Endgame, Position, Unfinished, effective_timeout, is_subtest
from .interrupted import mark_interrupted
from .merge import IN_TEST_ATTR, VERDICT_ATTR
from .rootcause import CAUSE_ATTR, COLLATERAL_ATTR, NOTE_ATTR, UNFINISHED_ATTR, label
from .stacks import format_stack, where_blocked

Location = tuple[str, int | None, str]

#: What a collective issued by only some ranks does (a check's failure, both modes).
UNMATCHED = (
    "A collective that not every member of the group issues stays pending and would be matched "
    "by the next test's collective."
)
#: How to end a child made with ``os.fork()`` (a check's failure, both modes).
FORK_ADVICE = (
    "End a child made with os.fork() with os._exit() (or use subprocess, or multiprocessing, "
    "which manages its children)."
)


def synthesized_failure(
    nodeid: str,
    location: Location,
    when: str,
    message: str,
    details: str,
    *,
    note: str,
    collateral: bool = False,
    stop: float = 0.0,
    verdict: str = "",
    in_test: bool | None = None,
) -> TestReport:
    """A failed report for a rank that sent none (it crashed, hung or was killed).

    ``in_test``: a killed rank was inside the test's setup or call (where it may have waited for
    peers that skipped), or not (before its setup, in teardown); None where it is not known.

    ``message`` is the one-line crash message; ``details`` the text shown as its traceback
    (faulthandler output, last lines of the rank's log).
    """
    lines = [line + "\n" for line in details.splitlines()] or [message + "\n"]
    crash = ReprFileLocation(location[0], (location[1] or 0) + 1, message)
    longrepr = ExceptionChainRepr([(ReprTracebackNative(lines), crash, None)])
    report = TestReport(nodeid, location, {}, "failed", longrepr, when, start=stop, stop=stop)  # type: ignore[arg-type]
    setattr(report, NOTE_ATTR, note)
    setattr(report, COLLATERAL_ATTR, collateral)
    if in_test is not None:
        setattr(report, IN_TEST_ATTR, in_test)
    if verdict:
        setattr(report, VERDICT_ATTR, verdict)
    return report


def passed_report(
    nodeid: str,
    location: Location,
    when: str,
    *,
    keywords: Iterable[str] = (),
    sections: Sequence[tuple[str, str]] = (),
    duration: float = 0.0,
    start: float = 0.0,
    stop: float = 0.0,
) -> TestReport:
    """A passed report of one phase (``keywords``: the names of the item's keywords)."""
    report = TestReport(nodeid, location, {}, "passed", None, when, list(sections))  # type: ignore[arg-type]
    report.keywords = dict.fromkeys(keywords, 1)
    report.duration, report.start, report.stop = duration, start, stop
    return report


def fill_passed(reports: list[TestReport], nodeid: str, location: Location, when: str) -> None:
    """Passed reports for the phases before ``when`` that a rank finished but had not sent.

    Passing reports travel in one batch at the end of a test, so a rank that died in call had
    passed its setup: the merge shows a call phase only after a passed setup. ``when="end"``
    fills every phase.
    """
    if any(not r.passed for r in reports if r.when == "setup" and not is_subtest(r)):
        return  # no call phase after a failed or skipped setup
    have = {r.when for r in reports if not is_subtest(r)}
    for earlier in ("setup", "call", "teardown"):
        if earlier == when:
            break
        if earlier not in have:
            reports.append(passed_report(nodeid, location, earlier))


def skipped_reports(nodeid: str, location: Location, path: str, reason: str) -> list[TestReport]:
    """The test is skipped in setup for ``reason`` (shown at ``path``), then torn down."""
    longrepr = (path, (location[1] or 0) + 1, f"Skipped: {reason}")
    setup = TestReport(nodeid, location, {}, "skipped", longrepr, "setup")
    return [setup, passed_report(nodeid, location, "teardown")]


def error_reports(nodeid: str, location: Location, message: str) -> list[TestReport]:
    """The test errors in setup with ``message``, its first line as the summary (pool mode: it
    could not reach its ranks), then is torn down."""
    first_line = message.splitlines()[0]
    setup = synthesized_failure(
        nodeid, location, "setup", first_line, message, note="error in setup"
    )
    return [setup, passed_report(nodeid, location, "teardown")]


def setup_error_report(nodeid: str, location: Location, message: str, now: float) -> TestReport:
    """This rank could not even start the test (launcher mode: its process group did not come
    up); ``message``'s last line is the summary."""
    first = message.strip().splitlines()[-1] if message.strip() else "error in setup"
    return synthesized_failure(
        nodeid, location, "setup", first, message, note=f"error in setup: {first}", stop=now
    )


def check_failure(
    nodeid: str, location: Location, rank: int, world_size: int, crash: str, more: str, now: float
) -> TestReport:
    """A failed check after the test (``crash``: :mod:`checks`' line), with ``more``: why it
    matters and what the mode did about it."""
    text = f"{label(rank, world_size)} {crash}\n{more}"
    return synthesized_failure(nodeid, location, "call", crash, text, note=crash, stop=now)


def unmatched_report(
    nodeid: str, location: Location, rank: int, world_size: int, crash: str, after: str, now: float
) -> TestReport:
    """``rank`` issued more collectives on a group than its peers (``crash``:
    :func:`checks.unmatched`'s line); ``after``: what the mode did about it."""
    return check_failure(nodeid, location, rank, world_size, crash, f"{UNMATCHED} {after}", now)


def forked_report(
    nodeid: str,
    location: Location,
    rank: int,
    world_size: int,
    pids: Sequence[int],
    after: str,
    now: float,
) -> TestReport:
    """The test left forks ``pids`` of the rank running the rank's own code; ``after``: what
    the mode did about them."""
    crash = forked_crash(pids)
    text = f"{label(rank, world_size)} {crash}.\n{FORK_ADVICE} {after}"
    return synthesized_failure(nodeid, location, "call", crash, text, note=crash, stop=now)


def crashed_report(
    nodeid: str,
    location: Location,
    when: str,
    rank: int,
    world_size: int,
    crash: str,
    output: str,
    log: str,
    now: float,
) -> TestReport:
    """A rank process that died during the test (pool mode): ``crash`` says how and where,
    ``output`` is its last output (faulthandler's traceback, if any), ``log`` its whole log."""
    text = f"{label(rank, world_size)} {crash}.\n"
    if output.strip():
        text += f"Its last output (with faulthandler's traceback, if any):\n{output}\n"
    else:
        text += "It wrote nothing since the test started.\n"
    text += f"Its whole log: {log}"
    return synthesized_failure(nodeid, location, when, crash, text, note=crash, stop=now)


def stopped_report(
    nodeid: str, location: Location, when: str, at: str, message: str, now: float, more: str = ""
) -> TestReport:
    """A rank whose pytest session ended in the test (``pytest.exit()``, ``KeyboardInterrupt``):
    ``message`` says which and where; ``at`` is where the rank was ("in call", "before its setup
    began"); ``more``: what that means in the mode, if anything."""
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    crash = f"stopped serving {at}: {first or 'its pytest session ended'}"
    text = f"{message}\n{more}" if more else message
    return synthesized_failure(nodeid, location, when, crash, text, note=crash, stop=now)


def silent_report(
    nodeid: str, location: Location, rank: int, world_size: int, log: str, now: float
) -> TestReport:
    """A rank that sent neither its reports nor its stack when asked (launcher mode).

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
    return synthesized_failure(nodeid, location, "call", crash, text, note=note, stop=now)


class Untrusted(Protocol):
    """A control payload that did not verify (launcher mode's ``channel.Forged``)."""

    rank: int
    key: str
    why: str
    headline: str
    advice: str


def forged_report(
    nodeid: str, location: Location, world_size: int, forged: Untrusted, now: float
) -> TestReport:
    """A control payload that did not verify (or a counter no payload backs): it names the key
    and the rank it speaks for, and what that means; never a pass."""
    tag = label(forged.rank, world_size)
    crash = f"{forged.headline}: {forged.key!r} {forged.why}"
    text = (
        f"{tag}: {forged}.\nWhat the rank itself sent for this test may still have come; the "
        "test fails either way, and the run stops after it: its other results could not be "
        f"trusted. {forged.advice}"
    )
    return synthesized_failure(nodeid, location, "call", crash, text, note=crash, stop=now)


def not_exited_report(
    nodeid: str, location: Location, rank: int, world_size: int, why: str, now: float
) -> TestReport:
    """A rank its test expected to exit (a fault plan) that did not: ``why`` says what it did."""
    crash = f"{label(rank, world_size)} {why}"
    text = f"{crash}\n(in {nodeid})"
    return synthesized_failure(
        nodeid, location, "call", crash, text, note=f"did not exit: it {why}", stop=now
    )


def unfinished_report(
    nodeid: str,
    location: Location,
    test_file: str,
    rank: int,
    world_size: int,
    info: Unfinished,
    wall: float,
) -> TestReport:
    """A failed report for a rank that did not finish the test (killed, stuck or timed out)."""
    tag = label(rank, world_size)
    pos, game = info.position, info.endgame
    where = (
        where_blocked(info.dump, test_file)
        if info.dump
        else (info.no_dump_reason or "no stack (the rank did not answer the dump signal)")
    )
    if info.collective:
        where = f"{info.collective}; {where}"
    waited = info.verdict.waited.get(rank, "")
    ending = ""
    if game.is_collateral(rank):
        assert game.failed_at is not None
        after = info.now - game.failed_at
        note = f"{info.verb} {pos.at} {after:.1f} s after {game.trigger}; {where}"
        crash = f"{info.verb} {pos.at}: {game.trigger} first"
        collateral = True
    elif pos is LATE:
        timeout = game.timeout
        note = f"finished, but only after its deadline of {timeout:g} s"
        crash = f"Timeout: finished only after its deadline of {timeout:g} s "
        crash += f"(timeout from {game.timeout_source})"
        collateral = False
    else:
        ending, crash = _ending(game, pos)
        # Left waiting for the ranks the verdict blames: collateral, not a failure of its own.
        note = f"{waited}; {ending}" if waited else f"{ending}; {where}"
        collateral = bool(waited)
    if info.dump:
        stack = format_stack(info.dump, test_file, info.log)
    else:
        stack = f"(no stack; its log: {info.log})"
    text = f"{tag}: {crash}\n{where}\n{stack}"
    report = synthesized_failure(
        nodeid,
        location,
        pos.when,
        crash,
        text,
        note=note,
        collateral=collateral,
        stop=wall,
        verdict=info.verdict.text,
        in_test=pos.when in ("setup", "call") and pos == Position.in_phase(pos.when),
    )
    setattr(report, UNFINISHED_ATTR, True)
    if ending and not collateral:
        setattr(report, ENDING_ATTR, ending)
    if ending and game.interrupted_at is not None:
        mark_interrupted(report, game.interrupt)  # no root cause of its own (interrupted.py)
    if info.verdict.root:
        verdict = info.verdict
        setattr(report, CAUSE_ATTR, (verdict.root, verdict.subject, verdict.predicate))
    return report


def _ending(game: Endgame, pos: Position) -> tuple[str, str]:
    """How a rank that did not finish was stopped: the table's words and the crash line."""
    source = f"timeout from {game.timeout_source}"
    if game.interrupted_at is not None:
        after = game.interrupted_at - game.started
        return (
            f"interrupted {pos.at} by {game.interrupt} after {after:.1f} s",
            f"Interrupted: {pos.still} when {game.interrupt} came after {after:.1f} s",
        )
    if game.deadlock_at is None:
        timeout = game.timeout
        return (
            f"timed out {pos.at} after {timeout:g} s",
            f"Timeout: {pos.still} after {timeout:g} s ({source})",
        )
    after = game.deadlock_at - game.started
    seconds = effective_timeout(game.timeout)
    deadline = f"deadline was {seconds:g} s" if seconds is not None else "no deadline"
    return (
        f"ended {pos.at} after {after:.1f} s: a deadlock ({deadline})",
        f"Deadlock: {pos.still} after {after:.1f} s, which can never finish: ended early "
        f"({deadline}, {source})",
    )
