"""What a test's child process came back with, judged: the verdict of ``in_child``.

Runs in the process that started the child: the pytest process for an ordinary test, a rank for
a distributed one (:mod:`api.children` reads the child's result file and exit status, and raises
what :func:`judge` decides). Pure: text and numbers in, a verdict out; no processes.

The rule, strictest first: a child that did not end in time failed (its stack when stopped, and
the signal that had stopped it: ``SIGTTIN`` when it read the terminal under ``-s``); a
child that wrote no result, or one that cannot be read, failed (naming its signal or exit code),
whatever its exit status: a child runner that never called the function cannot pass (vLLM
#41415); a result followed by a signal or a non-zero exit failed (naming both); otherwise (a
clean exit, or one another SIGCHLD handler reaped, so unknown) the function's own outcome
stands: passed, failed (its traceback), skipped or xfailed (its reason).
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal

from .stacks import signal_name, where_blocked

#: What the child's result file may say of the function.
OUTCOMES = ("passed", "failed", "skipped", "xfailed")


@dataclasses.dataclass(frozen=True)
class ChildResult:
    """What the child wrote once the function returned or raised."""

    outcome: str
    #: failed: the traceback as pytest prints it; skipped, xfailed: the reason; passed: "".
    text: str = ""
    #: failed: its one line (``AssertionError: assert 1 == 2``).
    crash: str = ""
    #: Processes the function left running, which the child killed: one line each.
    left: tuple[str, ...] = ()
    #: failed: the exception's class as ``module:qualname`` (``xfail(raises=...)`` compares it).
    raised: str = ""
    #: Warnings the function raised: ``(category as module:qualname, message, file, line)``.
    warned: tuple[tuple[str, str, str, int], ...] = ()

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()


@dataclasses.dataclass(frozen=True)
class ChildEnd:
    """How the child ended, as its parent saw it."""

    #: ``test_x's child (fork, pid 4711)``.
    who: str
    #: Exit code (``-N``: killed by signal N); None when unknown (another handler reaped it).
    status: int | None
    #: The result file's bytes; None when the child wrote none.
    raw: bytes | None
    timed_out: bool = False
    timeout: float | None = None
    #: The child's faulthandler dump at the timeout ("" when it gave none).
    stack: str = ""
    #: The test's file (to cut the dump below the test function, and say where it was blocked).
    test_file: str = ""
    #: Processes of the child's tree the parent killed (one line each).
    killed: tuple[str, ...] = ()
    #: The signal that had stopped the child when its time was up (``SIGTTIN``...); 0: none.
    stopped_by: int = 0


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The test's outcome: ``message`` is the failure's text or the skip's/xfail's reason."""

    outcome: str
    message: str = ""
    #: Processes left running that were killed (named in a warning, or the failure): "" if none.
    left: str = ""


def parse_result(raw: bytes | None) -> ChildResult | str | None:
    """The result file read back; a text saying why it cannot be; None when there is none."""
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        return f"its result file is not JSON ({exc}; {len(raw)} bytes)"
    fields = {f.name for f in dataclasses.fields(ChildResult)}
    if not isinstance(data, dict) or set(data) != fields:
        return f"its result file holds {type(data).__name__} {_short(repr(data))}, not a result"
    outcome, text, crash, left, raised, warned = (data[k] for k in _FIELDS)
    if outcome not in OUTCOMES or not all(isinstance(v, str) for v in (text, crash, raised)):
        return f"its result file says outcome {_short(repr(outcome))}, not one of {OUTCOMES}"
    if not isinstance(left, list) or not all(isinstance(line, str) for line in left):
        return f"its result file's list of left processes is {_short(repr(left))}"
    if not isinstance(warned, list) or not all(map(_is_warning, warned)):
        return f"its result file's list of warnings is {_short(repr(warned))}"
    warnings = tuple((c, m, f, n) for c, m, f, n in warned)
    return ChildResult(outcome, text, crash, tuple(left), raised, warnings)


_FIELDS = ("outcome", "text", "crash", "left", "raised", "warned")


def _is_warning(entry: object) -> bool:
    """``[category, message, file, line]`` as the result file holds a warning."""
    return (
        isinstance(entry, list)
        and len(entry) == 4
        and all(isinstance(v, str) for v in entry[:3])
        and type(entry[3]) is int
    )


def judge(end: ChildEnd, leftovers: str = "warn") -> Verdict:
    """The test's outcome from how its child ended (the rule: the module's docstring).

    ``leftovers`` is ``"warn"`` (processes the function left running are named beside the
    outcome) or ``"fail"`` (they fail a test that would have passed).
    """
    result = parse_result(end.raw)
    left = _left_words(end, result)
    if end.timed_out:
        return Verdict("failed", _hang(end, left), left)
    if result is None:
        first = (
            f"{end.who} ended with {_status(end.status)} and wrote no result: its function "
            "never returned (an os._exit, a signal, or a runner that never called it)."
        )
        return Verdict("failed", _lines(first, left), left)
    if isinstance(result, str):
        first = f"{end.who} ended with {_status(end.status)}, but {result}."
        return Verdict("failed", _lines(first, left), left)
    if end.status not in (0, None):  # None: another handler reaped it; its result stands
        head = f"{end.who} ended with {_status(end.status)} after its function {result.outcome}"
        body = [f"{head}: a child must exit cleanly once its function returned."]
        if result.outcome == "failed":
            body += ["The function's failure:", result.text]
        return Verdict("failed", _lines("\n".join(body), left), left)
    if result.outcome == "failed":
        crash = (result.crash.splitlines() or [""])[0].strip() or "failed"
        first = crash if _NAMED_CHILD.search(crash) else f"{crash} (in {end.who})"
        return Verdict("failed", _lines(f"{first}\n{result.text}", left), left)
    if result.outcome == "passed" and left and leftovers == "fail":
        first = f"{end.who} passed, but left processes running (in_child(leftovers='fail'))"
        return Verdict("failed", _lines(first, left), left)
    return Verdict(result.outcome, result.text, left)


#: The end of a failure's line that already names its child (an in_child inside an in_child).
_NAMED_CHILD = re.compile(r"\(in .+'s child \((fork|spawn), pid \d+\)\)$")


def _hang(end: ChildEnd, left: str) -> str:
    limit = f"{end.timeout:g} s" if end.timeout is not None else "its timeout"
    lines = [f"{end.who} did not finish within {limit}: stopped and killed."]
    if end.stopped_by:
        lines.append(_stopped(end.stopped_by))
    if end.stack.strip():
        lines.append(f"It was {where_blocked(end.stack, end.test_file)}.")
        lines += ["Its stack when stopped (every thread, most recent call first):"]
        lines.append(trim_below_test(end.stack, end.test_file))
    else:
        lines.append("(no stack: it did not answer the dump signal before it was killed)")
    lines.append(
        "Raise in_child(timeout=...) if it needs longer; by default it is the test's "
        "deadline less 10% and 1 s."
    )
    return _lines("\n".join(lines), left)


def _stopped(signum: int) -> str:
    name = signal_name(-signum).split("(")[0]
    if signum in (signal.SIGTTIN, signal.SIGTTOU):
        return (
            f"It had been stopped by {name}: it used the terminal from outside the terminal's "
            "foreground process group (under -s: input(), breakpoint(), pdb); a child cannot "
            "read the terminal: give it its input another way, or debug it without in_child."
        )
    return f"It had been stopped by {name} (a stopped child does not go on by itself)."


def trim_below_test(dump: str, test_file: str, most: int = 20) -> str:
    """A faulthandler dump with each thread's frames below its outermost frame in the test's
    file left out (the child's own machinery, pytest's); a thread with none keeps ``most``."""
    out: list[str] = []
    block: list[str] = []

    def flush() -> None:
        own = [i for i, line in enumerate(block) if f'File "{test_file}"' in line]
        out.extend(block[: own[-1] + 1] if own and test_file else block[:most])
        block.clear()

    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            flush()
            out.append(line)
        elif line.startswith("  File "):
            block.append(line)
        elif line.strip() and not line.startswith("Extension modules:"):
            flush()
            out.append(line)
    flush()
    return "\n".join(out)


def _left_words(end: ChildEnd, result: ChildResult | str | None) -> str:
    """The processes of the child's tree that were still running, killed, in one block."""
    lines = list(result.left) if isinstance(result, ChildResult) else []
    named = {line.split(":", 1)[0] for line in lines}  # "pid 4711"
    lines += [line for line in end.killed if line.split(":", 1)[0] not in named]
    if not lines:
        return ""
    plural = "es" if len(lines) != 1 else ""
    head = f"{end.who} left {len(lines)} process{plural} running, killed:"
    return "\n".join([head, *(f"  {line}" for line in lines)])


def _status(status: int | None) -> str:
    if status is None:
        return "an unknown exit status (another handler reaped it)"
    return f"signal {signal_name(status)}" if status < 0 else signal_name(status)


def _lines(text: str, left: str) -> str:
    return f"{text}\n{left}" if left else text


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
