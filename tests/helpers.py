"""Shared helpers of the plugin's tests; they run in the outer pytest process.

Every end-to-end test runs pytest in a subprocess (``runpytest_subprocess``) so that rank
processes never belong to this process, with a hard timeout, and afterwards checks that no
process the inner session started is still alive: each inner session is tagged through an
environment variable that its fork server and ranks inherit.

This module holds what those checks share: the tag's variable (``TAG_ENV``), the bound on one
inner run (``RUN_TIMEOUT``), the search for tagged processes (``tagged_pids``, ``wait_gone``) and
the type of the ``run_pytest`` fixture (``RunPytest``), and ``run_in_terminal``, which runs
pytest under a pseudo-terminal and types answers at its debugger prompts, and
``failure_section``, one report section of a session's output; ``start_beside`` and
``finish_beside`` run a session at the same time as another (its idle waits and start overlap the
other's); ``session_families`` says which test files run the same shared sessions (``conftest.py``
keeps each family on one xdist worker). The fixtures themselves are in ``conftest.py``.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import fcntl
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from .zygote import OFF_ENV as ZYGOTE_OFF_ENV
from .zygote import ZYGOTE, Forked, Session

TAG_ENV = "DISTRANK_TEST_TAG"
#: Bound on one inner pytest run; a deadlocked case fails instead of hanging CI.
RUN_TIMEOUT = 180


def tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries ``DISTRANK_TEST_TAG=tag``."""
    needle = f"{TAG_ENV}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def describe_process(pid: int) -> str:
    """``pid``'s command line and parent, for a message (empty if it is gone)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return ""
    return f"{command.strip()[:200]} (parent {parent})"


def wait_gone(tag: str, seconds: float) -> list[int]:
    """Wait until no tagged process is left, nor one that a session forked from the suite's zygote
    left (``zygote.ZYGOTE``: its environment is not the session's); return the ones still alive
    after ``seconds``."""
    end = time.monotonic() + seconds
    while True:
        alive = tagged_pids(tag) + ZYGOTE.descendants()
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.1)


#: The ``run_pytest`` fixture: ``run_pytest(*args, timeout=RUN_TIMEOUT)``.
RunPytest = Callable[..., pytest.RunResult]
#: The ``shared_session`` fixture: ``shared_session(name, write, *args, env=None)``.
SharedSession = Callable[..., pytest.RunResult]


@dataclasses.dataclass
class TerminalRun:
    """What a pytest run under a pseudo-terminal printed (colours off) and its exit code."""

    output: str
    returncode: int
    #: The lines typed, in order, with how long each waited for its prompt.
    typed: list[str]

    def lines(self) -> list[str]:
        return self.output.replace("\r\n", "\n").replace("\r", "\n").splitlines()


#: What a debugger prompt looks like at the end of the output: pdb's, or an input() prompt.
PROMPTS = (b"(Pdb) ", b"? ")


#: An answer that is Ctrl-C (the terminal sends SIGINT to pytest's process group), not a line.
CTRL_C = "\x03"


def _take_terminal() -> None:
    """In the child: a session of its own whose controlling terminal is the pty (its stdin), so
    that Ctrl-C typed there is SIGINT, as in a real terminal. SIGINT is reset to its default: a
    CI job started without job control inherits it ignored, and Python keeps it ignored."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def run_in_terminal(
    args: list[str], answers: list[str], cwd: Path, timeout: float, pause: float = 0.0
) -> TerminalRun:
    """Run ``python -m pytest ARGS`` with a pseudo-terminal as its stdin and stdout (forked
    from the suite's zygote where its environment allows).

    Each time the output stops at a prompt (:data:`PROMPTS`), the next of ``answers`` is typed
    (after ``pause`` seconds); once they are used up, ``c`` is. :data:`CTRL_C` is typed as
    itself, without a newline. The whole run is bounded by
    ``timeout``: then its process group is killed and the run fails the test that made it.
    """
    master, slave = pty.openpty()
    env = dict(os.environ, COLUMNS="200")
    process: Started
    if ZYGOTE.accepts(env) or os.environ.get(ZYGOTE_OFF_ENV) == "off":
        process = subprocess.Popen(
            [sys.executable, "-m", "pytest", "--color=no", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            preexec_fn=_take_terminal,
            env=env,
        )
    else:  # the child opens the terminal by its name: the slave stays open until it wrote
        terminal = os.ttyname(slave)
        session = Session(
            ["--color=no", *args], cwd, env, terminal=terminal, signals=[signal.SIGINT]
        )
        process = ZYGOTE.popen(session)
    output = b""
    answered = 0  # the output up to here has been answered
    todo = list(answers)
    typed: list[str] = []
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not data:
                    break
                if slave >= 0:  # the child has it open: its end is the terminal's (EIO)
                    os.close(slave)
                    slave = -1
                output += data
                if output.endswith(PROMPTS) and len(output) > answered:
                    time.sleep(pause)
                    line = todo.pop(0) if todo else "c"
                    typed.append(line)
                    os.write(master, line.encode() if line == CTRL_C else (line + "\n").encode())
                    answered = len(output)
            elif process.poll() is not None:
                break
        else:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail(f"pytest {' '.join(args)} ran past {timeout} s:\n{output.decode()}")
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    return TerminalRun(output.decode("utf-8", "replace"), process.wait(30), typed)


#: The ``in_terminal`` fixture: ``in_terminal(ARGS, answers, pause=0.0) -> TerminalRun``.
InTerminal = Callable[..., TerminalRun]


def failure_section(lines: list[str], title: str) -> pytest.LineMatcher:
    """The lines of the report section ``____ title ____`` (a failure's, an error's) in the
    output ``lines`` of a session."""
    start = next(
        (i for i, line in enumerate(lines) if line.strip("_ ") == title and line[:1] == "_"),
        None,
    )
    assert start is not None, f"no section {title!r} in:\n" + "\n".join(lines)
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].startswith(("____", "===="))),
        len(lines),
    )
    return pytest.LineMatcher(lines[start:end])


#: Where a session started by :func:`start_beside` writes its output, in its folder.
BESIDE_OUTPUT = ("beside-stdout.txt", "beside-stderr.txt")


def run_at_once(
    cmds: Sequence[Sequence[str]],
    envs: Sequence[Mapping[str, str]],
    cwd: Path,
    outputs: Sequence[Path],
    timeout: float,
    umask: int | None = None,
) -> list[int] | None:
    """Run every command at once in ``cwd`` (each its environment, its stdout and stderr to its
    output file), under ``umask``: their exit codes, or None past ``timeout`` (every one
    killed). ``python -m MODULE`` commands are forked from the suite's zygote together where
    their environments allow (a launched world, sessions that meet), else all are
    subprocesses."""
    if (
        all(cmd[:2] == [sys.executable, "-m"] for cmd in cmds)
        and not any(ZYGOTE.accepts(env) for env in envs)
        and os.environ.get(ZYGOTE_OFF_ENV) != "off"
    ):
        sessions = [
            Session(cmd[3:], cwd, env, (out, out), module=cmd[2], umask=umask)
            for cmd, env, out in zip(cmds, envs, outputs, strict=True)
        ]
        return ZYGOTE.run(sessions, timeout)[0]
    procs = []
    for cmd, env, output in zip(cmds, envs, outputs, strict=True):
        with open(output, "w") as out:
            procs.append(
                subprocess.Popen(
                    cmd,
                    env=dict(env),
                    cwd=cwd,
                    stdout=out,
                    stderr=out,
                    umask=-1 if umask is None else umask,
                )
            )
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(max(1.0, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        return None


#: A session started and not waited for yet: forked from the suite's zygote, or a subprocess.
Started = Forked | subprocess.Popen[bytes]


def start_pytest(
    args: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    outputs: tuple[Path, Path],
    new_session: bool = False,
    signals: Sequence[int] = (),
) -> Started:
    """Start ``python -m pytest ARGS`` in ``cwd`` with environment ``env`` and an empty stdin
    (never a terminal), its stdout and stderr to ``outputs`` (one file twice: as ``2>&1``), in
    a session of its own if ``new_session``, with ``signals`` at their defaults and unblocked
    (those a terminal session has: a CI job without job control inherits SIGINT ignored, and
    Python and the plugin leave it so): forked from the suite's zygote where ``env`` allows,
    else a subprocess. Return at once."""
    if not ZYGOTE.accepts(env) and os.environ.get(ZYGOTE_OFF_ENV) != "off":
        session = Session(args, cwd, env, outputs, new_session=new_session, signals=signals)
        return ZYGOTE.popen(session)

    def defaults() -> None:  # in the child, before the exec
        for number in signals:
            signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(signals))

    with contextlib.ExitStack() as files:
        out = files.enter_context(open(outputs[0], "wb"))
        err = out if outputs[1] == outputs[0] else files.enter_context(open(outputs[1], "wb"))
        return subprocess.Popen(
            [sys.executable, "-m", "pytest", *args],
            cwd=cwd,
            stdin=subprocess.DEVNULL,  # never a terminal (Pytester.popen: a closed pipe)
            env=dict(env),
            stdout=out,
            stderr=err,
            start_new_session=new_session,
            preexec_fn=defaults if signals else None,
        )


def start_beside(
    args: Sequence[str], folder: Path, env: Mapping[str, str] | None = None
) -> Started:
    """Start ``python -m pytest -p distrank ARGS`` in ``folder`` (its basetemp there) with this
    process's environment and ``env``, in a session of its own (:func:`start_pytest`): inside a
    test that uses ``run_pytest``, that is an inner session's, its process tag included, so that
    fixture's leak check covers it too. Its output goes to files (:data:`BESIDE_OUTPUT`), not
    pipes that nobody reads while another session runs. End it with :func:`finish_beside`
    before that leak check."""
    args = ["-p", "distrank", f"--basetemp={folder / 'temp'}", *args]
    # as Pytester.popen does: the folder on PYTHONPATH
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "PYTHONPATH": path, **(env or {})}
    outputs = (folder / BESIDE_OUTPUT[0], folder / BESIDE_OUTPUT[1])
    return start_pytest(args, folder, environment, outputs, new_session=True)


def finish_beside(process: Started, folder: Path, timeout: float = RUN_TIMEOUT) -> pytest.RunResult:
    """Wait for the session :func:`start_beside` started in ``folder``; its result. One that
    runs past ``timeout`` (from now) is killed, its process group with it, and fails the test."""
    started = time.monotonic()
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail(f"the session beside, in {folder}, ran past {timeout} s")
    out, err = ((folder / name).read_text(errors="replace").splitlines() for name in BESIDE_OUTPUT)
    return pytest.RunResult(code, out, err, time.monotonic() - started)


def _sessions_defined(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level to a ``Session(...)`` (tests/e2e/test_faults.py's
    shared inner sessions)."""
    return {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "Session"
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def session_families(folder: Path) -> dict[str, str]:
    """Test files of ``folder`` that run a shared inner session another file defines, by file
    name: the family each belongs to (its files' names, sorted, joined by ``+``).

    A test file that imports a ``Session`` from a sibling (``from .test_faults import
    NO_RECORDER``) runs that session too; each process that runs both files' tests runs it once
    (``shared_session``), but two xdist workers would run it twice. Files that share no session
    are left out."""
    trees = {path.name: ast.parse(path.read_text()) for path in sorted(folder.glob("test_*.py"))}
    defined = {name: _sessions_defined(tree) for name, tree in trees.items()}
    family = {name: {name} for name in trees}
    for name, tree in trees.items():
        for node in tree.body:
            if not isinstance(node, ast.ImportFrom) or node.level != 1 or not node.module:
                continue
            source = f"{node.module}.py"
            if source in defined and any(a.name in defined[source] for a in node.names):
                joined = family[name] | family[source]
                for member in joined:
                    family[member] = joined
    return {name: "+".join(sorted(f)) for name, f in family.items() if len(f) > 1}
