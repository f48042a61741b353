"""Reading what ranks left behind: faulthandler stack dumps, log tails, exit statuses.

Runs in the controller (pool mode), in rank 0 of a launched world (launcher mode), and in the ranks
of both modes (:func:`interruption_message`, for a session that ended in a test). Pure text
processing over a rank's log file and stack dumps (stdlib only), so that a failure report can say
where a rank was blocked ("blocked in barrier at ...:5356, called from test_x at test_x.py:12") and
show just the frames that matter.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import traceback

#: Lines of a rank's own output shown when it crashed.
LOG_TAIL_LINES = 30


def signal_name(exitcode: int | None) -> str:
    """``-11`` -> ``SIGSEGV(-11)``; ``3`` -> ``exit code 3``."""
    if exitcode is None:
        return "an unknown exit status (the process was not reaped)"
    if exitcode < 0:
        try:
            return f"{signal.Signals(-exitcode).name}({exitcode})"
        except ValueError:
            return f"signal {-exitcode}({exitcode})"
    return f"exit code {exitcode}"


#: The plugin's own wrappers of a library call, left out of a rank's stack: the process tree's
#: ``os.waitpid`` (tree/reaped.py) would read as the place a rank is blocked.
_WRAPPERS = ("pytest_distrank/tree/reaped.py",)
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def main_thread_frames(dump: str) -> list[tuple[str, int, str]]:
    """The frames (innermost first) of the rank's main thread in a faulthandler dump."""
    blocks: list[list[tuple[str, int, str]]] = []
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append([])
            continue
        match = _FRAME.match(line)
        if match and blocks and not match["file"].endswith(_WRAPPERS):
            blocks[-1].append((match["file"], int(match["line"]), match["func"]))
    for frames in blocks:
        if any(func == "rank_main" for _, _, func in frames):
            return frames
    return blocks[-1] if blocks else []


def where_blocked(dump: str, test_file: str) -> str:
    """One line: the innermost frame, and the innermost frame in the test's own file."""
    frames = main_thread_frames(dump)
    if not frames:
        return "no stack (the rank did not answer the dump signal)"
    file, line, func = frames[0]
    text = f"blocked in {func} at {_short_path(file)}:{line}"
    own = next(((f, n, fn) for f, n, fn in frames if f == test_file), None)
    if own is not None and own != frames[0]:
        text += f", called from {own[2]} at {_short_path(own[0])}:{own[1]}"
    return text


def collective_entered(dump: str, test_file: str) -> str:
    """The ``torch.distributed`` call a dump's main thread is inside, in words, or "".

    ``"all_reduce, called from test_x at test_x.py:10"``: the innermost frame in
    ``torch/distributed/``, and the innermost frame in the test's own file.
    """
    frames = main_thread_frames(dump)
    inner = next(((f, n, fn) for f, n, fn in frames if "/torch/distributed/" in f), None)
    if inner is None or frames[0] != inner:
        return ""
    text = inner[2]
    own = next(((f, n, fn) for f, n, fn in frames if f == test_file), None)
    if own is not None:
        text += f", called from {own[2]} at {_short_path(own[0])}:{own[1]}"
    return text


def user_file(dump: str) -> str:
    """The file of the innermost main-thread frame outside Python, pytest and this plugin.

    Where no test file is known (a fixture torn down at session end), that is the user's code:
    a conftest.py, a fixture module.
    """
    for file, _, _ in main_thread_frames(dump):
        if "site-packages/" in file or "/lib/python3" in file or "/pytest_distrank/" in file:
            continue
        return file
    return ""


def format_stack(dump: str, test_file: str, log_path: str) -> str:
    """The main thread's frames down to the test function, innermost first (faulthandler style).

    Frames below the test (pytest's and the plugin's own machinery) are left out; the whole dump,
    every thread included, stays in the rank's log.
    """
    frames = main_thread_frames(dump)
    if not frames:
        return f"(no stack: the rank did not answer the dump signal; its log: {log_path})"
    own = [i for i, (f, _, _) in enumerate(frames) if f == test_file]
    keep = frames[: own[-1] + 1] if own else frames[:15]
    threads = sum(1 for line in dump.splitlines() if line.startswith(("Thread 0x", "Current")))
    lines = ["Stack of its main thread (most recent call first):"]
    lines += [f'  File "{f}", line {n} in {fn}' for f, n, fn in keep]
    if len(keep) < len(frames) or threads > 1:
        plural = "s" if threads != 1 else ""
        lines.append(f"(full dump of {threads} thread{plural} in {log_path})")
    return "\n".join(lines)


def trim_fault_dump(text: str, test_file: str) -> str:
    """A rank's last output with faulthandler's frames cut below the test function.

    Frames under the test (pytest, pluggy, the plugin, multiprocessing) and the long
    "Extension modules" line say nothing about the crash; the log keeps them.
    """
    out: list[str] = []
    below_test = False
    for line in tail(text, 200).splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            below_test = False
        elif line.startswith("Extension modules:"):
            continue
        elif _FRAME.match(line):
            if below_test:
                continue
            below_test = f'"{test_file}"' in line
        out.append(line)
    return tail("\n".join(out))


def _short_path(path: str) -> str:
    marker = "site-packages/"
    if marker in path:
        return path.split(marker, 1)[1]
    with contextlib.suppress(ValueError):
        return os.path.relpath(path)
    return path


def read_from(path: str, offset: int, limit: int = 256 * 1024) -> str:
    """What a rank wrote to its log since ``offset`` (the last ``limit`` bytes of it)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def interruption_message(exc: BaseException, nodeid: str) -> str:
    """Why ``pytest.exit()`` or ``KeyboardInterrupt`` ended a rank's session, and where.

    Used by both modes (pool/worker/main.py, launch/plugin.py) for the rank's row and its text.
    """
    frames = traceback.format_exception(exc)
    where = "".join(frames[-4:]) if len(frames) > 1 else ""
    msg = getattr(exc, "msg", None)
    if msg is not None and type(exc).__name__ == "Exit":  # pytest.exit.Exception
        head = f"pytest.exit({msg!r}) was called in {nodeid}"
        returncode = getattr(exc, "returncode", None)
        if returncode is not None:
            head += f" (returncode={returncode})"
    else:
        head = f"KeyboardInterrupt was raised in {nodeid} ({exc})"
    return f"{head}\n{where}" if where else head
