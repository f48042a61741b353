"""Expected deaths: a rank that is meant to exit, and whether it exited that way.

Runs in the controller (pool mode): :mod:`pool.exits` asks it while it waits for a test's ranks.
Pure logic over marker arguments, exit statuses and text: no torch, no processes, so that it is
unit-tested without ranks (``tests/unit/test_expectations.py``).

An expectation comes from one of three places, named in every message as its ``source``:

- the ``expect_rank_exit`` marker: ``@pytest.mark.expect_rank_exit(rank=1, signal="SIGKILL")``,
  ``exit_code=3``, ``match="regex"`` (on the rank's last output), several ranks at once;
- a fault that fired (``faults.kill(rank=2, ...)``: the rank said so before it died);
- a PyTorch harness class's ``special_return_code_checks`` (its rank said so before its test).

A rank with an expectation passes when it exits that way; it fails, saying which expectation was
not met, when it survives the test or dies another way. Statuses are ``multiprocessing``'s
``exitcode``: ``-N`` for death by signal ``N``, ``N >= 0`` for an exit code.
"""

from __future__ import annotations

import dataclasses
import re
import signal
from collections.abc import Iterable
from typing import Any

from .stacks import signal_name

#: The marker's name.
MARKER = "expect_rank_exit"
#: Why launcher mode skips expected deaths and kills.
POOL_ONLY = (
    "torchrun's agent stops every worker when one dies, so a rank cannot die alone; run this "
    "test without a launcher (pool mode)"
)
#: ``match=`` reads this many last lines of what the rank wrote since the test started.
MATCH_LINES = 50


class ExpectationError(ValueError):
    """A marker that cannot be honoured; the message names the marker and the bad value."""


@dataclasses.dataclass(frozen=True)
class ExpectedExit:
    """How one rank is meant to end the test."""

    rank: int
    #: The status it must end with (``-9``: SIGKILL; ``3``: exit code 3); None: any death.
    code: int | None = None
    #: A regular expression its last output must match ("" : none).
    match: str = ""
    #: Where the expectation comes from, in the user's words (the marker, the call).
    source: str = ""

    def words(self) -> str:
        """``exit by SIGKILL``, ``exit with code 3``, ``exit``; with the output it must show."""
        if self.code is None:
            how = "exit"
        elif self.code < 0:
            how = f"exit by {_signal_word(-self.code)}"
        else:
            how = f"exit with code {self.code}"
        if self.match:
            how += f" with output matching {self.match!r}"
        return how


def _signal_word(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def marker_words(marker: Any) -> str:
    """``@pytest.mark.expect_rank_exit(rank=1, signal='SIGKILL')``: the marker as written."""
    args = [repr(a) for a in marker.args] + [f"{k}={v!r}" for k, v in marker.kwargs.items()]
    return f"@pytest.mark.{marker.name}({', '.join(args)})"


def parse_signal(value: object, where: str) -> int:
    """A signal's number from its name (``"SIGKILL"``, ``"KILL"``) or number; ``where`` names
    the marker or call in the error."""
    if isinstance(value, signal.Signals):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return int(signal.Signals(value))
        except ValueError:
            pass
    elif isinstance(value, str):
        name = value.upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        found = getattr(signal.Signals, name, None)
        if isinstance(found, signal.Signals):
            return int(found)
    raise ExpectationError(
        f"{where}: signal {value!r} is not a signal of this platform; write a name such as "
        "'SIGKILL', 'SIGTERM', 'SIGSEGV' or 'SIGABRT'."
    )


def _ranks(value: object, where: str, world_size: int) -> tuple[int, ...]:
    raw = value if isinstance(value, list | tuple | set | frozenset | range) else (value,)
    ranks = tuple(raw)
    if not ranks:
        raise ExpectationError(f"{where}: rank={value!r} names no rank; give e.g. rank=1.")
    for rank in ranks:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ExpectationError(
                f"{where}: rank {rank!r} is not a rank of this test's world of {world_size} "
                f"(0 to {world_size - 1})."
            )
    return ranks


def from_marker(marker: Any, world_size: int) -> list[ExpectedExit]:
    """The expectations one ``expect_rank_exit`` marker states (an error names it)."""
    where = marker_words(marker)
    known = {"rank", "signal", "exit_code", "match"}
    unknown = sorted(set(marker.kwargs) - known)
    if unknown:
        raise ExpectationError(
            f"{where}: unknown keyword {unknown[0]!r}; expect_rank_exit takes rank, and one of "
            "signal or exit_code, and match."
        )
    if len(marker.args) > 1 or (marker.args and "rank" in marker.kwargs):
        raise ExpectationError(f"{where}: give the rank(s) once, e.g. rank=1 or rank=(1, 2).")
    if not marker.args and "rank" not in marker.kwargs:
        raise ExpectationError(f"{where}: which rank? write e.g. expect_rank_exit(rank=1).")
    ranks = _ranks(marker.args[0] if marker.args else marker.kwargs["rank"], where, world_size)
    sig, code = marker.kwargs.get("signal"), marker.kwargs.get("exit_code")
    if sig is not None and code is not None:
        raise ExpectationError(
            f"{where}: signal={sig!r} and exit_code={code!r} contradict each other: a process "
            "dies by a signal or exits with a code, not both. Keep one."
        )
    expected: int | None = None
    if sig is not None:
        expected = -parse_signal(sig, where)
    elif code is not None:
        if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
            raise ExpectationError(
                f"{where}: exit_code={code!r} is not an exit code (0 to 255); for a death by a "
                "signal write signal='SIGKILL'."
            )
        expected = code
    match = marker.kwargs.get("match") or ""
    if not isinstance(match, str):
        raise ExpectationError(f"{where}: match={match!r} must be a regular expression string.")
    try:
        re.compile(match)
    except re.error as exc:
        bad = f"{where}: match={match!r} is no regular expression: {exc}."
        raise ExpectationError(bad) from None
    return [ExpectedExit(rank, expected, match, where) for rank in ranks]


def from_markers(markers: Iterable[Any], world_size: int) -> dict[int, ExpectedExit]:
    """Every rank's expectation from a test's ``expect_rank_exit`` markers; two markers that
    disagree about one rank are an error naming both."""
    out: dict[int, ExpectedExit] = {}
    for marker in markers:
        for new in from_marker(marker, world_size):
            old = out.get(new.rank)
            if old is not None and (old.code, old.match) != (new.code, new.match):
                raise ExpectationError(
                    f"{old.source} and {new.source} contradict each other for rank {new.rank}: "
                    f"it cannot {old.words()} and {new.words()}. Keep one marker for that rank."
                )
            out.setdefault(new.rank, new)
    return out


def item_expectations(item: Any, world_size: int) -> dict[int, ExpectedExit]:
    """A test item's expectations (its ``expect_rank_exit`` markers)."""
    return from_markers(item.iter_markers(MARKER), world_size)


def last_lines(text: str, count: int = MATCH_LINES) -> str:
    return "\n".join(text.splitlines()[-count:])


def unmet_death(expected: ExpectedExit, status: int | None, output: str) -> str | None:
    """Why a rank that died with ``status`` did not meet ``expected`` (None: it did)."""
    died = signal_name(status)
    if expected.code is not None and status != expected.code:
        return f"was expected to {expected.words()} ({expected.source}), not {died}"
    if expected.match and re.search(expected.match, last_lines(output)) is None:
        return (
            f"printed nothing matching {expected.match!r} in its last {MATCH_LINES} lines of "
            f"output ({expected.source} expects it with the {died} it exited with); match= "
            "reads the rank's log, and output pytest captured dies with the rank: only under -s "
            "does all of it reach the log"
        )
    return None


def met_note(expected: ExpectedExit, status: int | None) -> str:
    """The table's words for a rank that died as expected."""
    return f"exited as expected: {signal_name(status)} ({expected.source})"


def survived(expected: ExpectedExit, how: str) -> str:
    """Why a rank that ``how`` ("finished the test", "was still running at the end") failed."""
    return (
        f"was expected to {expected.words()} ({expected.source}) but {how}; nothing ended it. "
        "Check the code meant to end it, or drop the expectation."
    )


def harness_source(fn: Any, code: int) -> str:
    """The source words of a harness class's return-code rule for its test ``fn``."""
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    return f"the harness class's return code check: {name} ends with {code}"
