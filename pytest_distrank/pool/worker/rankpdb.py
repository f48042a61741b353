"""The rank side of the debugger: ``pdb`` whose terminal is the controller's.

Runs in each pool rank. A rank has no terminal (its stdin is /dev/null, its output a log file,
its process group its own), so a debugger that opens here talks to the person through the
controller: :class:`Relay` sends what ``pdb`` writes and asks for each line it reads over the
rank's pipe (:class:`~protocol.DebugOpen` ... :class:`~protocol.DebugClose`), and the controller
(:mod:`debugrelay`) shows it labelled ``[rank r/n]`` and answers with what was typed. While a
rank's debugger is open the controller serves that rank alone, so several ranks that stop take
turns, and the test's deadline and failure grace stand still.

Four ways in (see docs/debugging.md): ``breakpoint()`` or ``pdb.set_trace()`` in a test
(:func:`install`), ``--pdb`` (:func:`post_mortem`, in the first rank that fails), ``--trace``
(:func:`traced`, in one rank) and ``--distrank-debug-rank`` (the rank's ``sys.stdin`` reads from
the terminal, :class:`LiveInput`).

Only the rank's own main thread owns its pipe: a breakpoint in a thread or a process the test
started fails there with a message instead of writing into the pipe beside the main thread.
"""

from __future__ import annotations

import functools
import os
import pdb
import sys
import threading
from collections.abc import Callable, Generator
from multiprocessing.connection import Connection
from types import FrameType, TracebackType
from typing import IO, Any, TypeVar, cast

import pytest

from ..protocol import (
    DebugClose,
    DebugLine,
    DebugOpen,
    DebugOutput,
    DebugRead,
    DebugReply,
)

T = TypeVar("T")

#: Kinds of debugger session (DebugOpen.kind).
BREAKPOINT = "breakpoint"
POST_MORTEM = "post_mortem"
TRACE = "trace"
INPUT = "input"


class Relay:
    """The rank's end of the controller's terminal: its pipe, used by the main thread only."""

    def __init__(self, conn: Connection, rank: int, world_size: int) -> None:
        self.conn = conn
        self.rank = rank
        self.world_size = world_size
        self.pid = os.getpid()
        #: A session is open: the controller serves this rank alone until it is closed.
        self.open = False
        #: The debugger of the running test, while it traces (between its prompts too).
        self.debugger: RelayPdb | None = None

    @property
    def label(self) -> str:
        return f"rank {self.rank}/{self.world_size}"

    def why_not_here(self) -> str:
        """Why the calling thread or process may not use the pipe, or ""."""
        if os.getpid() != self.pid:
            return (
                f"in a process the test forked (pid {os.getpid()}); only the {self.label} "
                f"process itself (pid {self.pid}) reaches the controller's terminal"
            )
        if threading.current_thread() is not threading.main_thread():
            name = threading.current_thread().name
            return (
                f"in thread {name!r}; only the main thread of {self.label} reaches the "
                "controller's terminal (its pipe is the main thread's)"
            )
        return ""

    def begin(self, kind: str, header: str) -> DebugReply:
        """Ask for the terminal; the controller answers when it is this rank's turn."""
        if self.open:
            return DebugReply(True)
        self.conn.send(DebugOpen(self.rank, kind, header))
        reply = self._receive(DebugReply)
        self.open = reply.ok
        return reply

    def end(self, quit: bool = False, done: bool = True) -> None:
        """Give the terminal back (no-op when no session is open)."""
        if self.open:
            self.open = False
            self.conn.send(DebugClose(self.rank, quit, done))

    def release(self) -> None:
        """The test is over: a debugger still stepping stops tracing (as pdb's ``continue``
        does), so it does not stop in the rank's own loop or in the next test."""
        debugger, self.debugger = self.debugger, None
        if debugger is not None and not debugger.done:
            debugger.set_continue()
            sys.settrace(None)
        self.end()

    def write(self, text: str) -> None:
        if text:
            self.conn.send(DebugOutput(self.rank, text))

    def readline(self) -> str:
        self.conn.send(DebugRead(self.rank))
        return self._receive(DebugLine).text

    def _receive(self, kind: type[T]) -> T:
        message = self.conn.recv()
        if not isinstance(message, kind):
            raise RuntimeError(
                f"pytest-distrank: {self.label} expected {kind.__name__} from the controller "
                f"during a debugger session, got {type(message).__name__}"
            )
        return message


class RelayOutput:
    """``pdb``'s stdout: buffered, sent on ``flush`` (pdb flushes before each prompt)."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.buffer: list[str] = []

    def write(self, text: str) -> int:
        self.buffer.append(text)
        if sum(len(t) for t in self.buffer) > 8192:
            self.flush()
        return len(text)

    def flush(self) -> None:
        text, self.buffer = "".join(self.buffer), []
        self.relay.write(text)

    def isatty(self) -> bool:
        return True  # the person reads it on a terminal (pdb shows its full listings)


class RelayInput:
    """``pdb``'s stdin: each ``readline`` is one line typed at the controller's terminal."""

    def __init__(self, relay: Relay, output: RelayOutput) -> None:
        self.relay = relay
        self.output = output

    def readline(self, size: int = -1) -> str:
        self.output.flush()
        return self.relay.readline()

    def isatty(self) -> bool:
        return True


class RelayPdb(pdb.Pdb):
    """``pdb.Pdb`` on the controller's terminal, borrowed for each stop at its prompt."""

    def __init__(self, relay: Relay, kind: str) -> None:
        self.relay = relay
        self.kind = kind
        self.output = RelayOutput(relay)
        stdin, stdout = RelayInput(relay, self.output), self.output
        super().__init__(stdin=cast(IO[str], stdin), stdout=cast(IO[str], stdout), nosigint=True)
        self.prompt = "(Pdb) "
        #: Tracing stopped (continue without breakpoints): the debugger is done.
        self.done = False
        #: The controller printed this debugger's header (at its first stop).
        self.announced = False

    def interaction(self, frame: FrameType | None, tb: TracebackType | None) -> None:
        """One stop at the prompt: the terminal is this rank's from here to the next command
        that runs code (``n``, ``s``, ``c``), then its peers' turn."""
        header = "" if self.announced else _header(self.relay, self.kind)
        reply = self.relay.begin(self.kind, header)
        if not reply.ok:
            self.set_continue()
            sys.settrace(None)
            if self.kind == BREAKPOINT:
                _no_terminal(self.relay, reply.why)
            return
        self.announced = True
        self.relay.debugger = self
        try:
            super().interaction(frame, tb)
        finally:
            self.output.flush()
            self.relay.end(done=self.done or self.kind == POST_MORTEM)
            if self.done and self.relay.debugger is self:
                self.relay.debugger = None

    def set_continue(self) -> None:
        super().set_continue()
        if not self.breaks:
            self.done = True

    def do_quit(self, arg: str) -> bool | None:
        """``q``: the debugger ends and pytest stops after this test, as ``pytest --pdb`` does."""
        self.output.flush()
        self.relay.end(quit=True)
        if self.kind == POST_MORTEM:
            self.set_quit()
            return True
        self.set_continue()
        sys.settrace(None)
        pytest.fail(f"{self.relay.label}: quit the debugger (q); the session stops", pytrace=False)

    do_q = do_exit = do_EOF = do_quit


def _header(relay: Relay, kind: str) -> str:
    where = f"{relay.label} (pid {relay.pid})"
    if kind == POST_MORTEM:
        return f"PDB post_mortem in {where}"
    if kind == TRACE:
        return f"PDB runcall in {where}"
    return f"PDB set_trace in {where}"


def _no_terminal(relay: Relay, why: str) -> None:
    pytest.fail(
        f"breakpoint() on {relay.label} (pid {os.getpid()}): no debugger can open: {why}. To look "
        "inside: run pytest in a terminal (without -n), attach py-spy or gdb to the pid above, "
        "or set PYTHONBREAKPOINT to a remote debugger (such as remote_pdb.set_trace).",
        pytrace=False,
    )


def install(relay: Relay) -> None:
    """``breakpoint()`` and ``pdb.set_trace()`` in a test open :class:`RelayPdb` here.

    Called after pytest's own debugging plugin has replaced ``pdb.set_trace`` (the rank's
    ``pytest_configure``). A debugger named in ``PYTHONBREAKPOINT`` still wins for
    ``breakpoint()``.
    """

    def set_trace(*args: object, header: str | None = None, **kwargs: object) -> None:
        why = relay.why_not_here()
        if why:
            _no_terminal(relay, why)
        frame = sys._getframe().f_back
        RelayPdb(relay, BREAKPOINT).set_trace(frame)

    pdb.set_trace = set_trace
    if not os.environ.get("PYTHONBREAKPOINT"):
        sys.breakpointhook = set_trace


def post_mortem(relay: Relay, tb: TracebackType | None, longrepr: str) -> None:
    """``--pdb``: the failure's frames in the debugger, if the controller lends the terminal."""
    if relay.why_not_here():
        return
    debugger = RelayPdb(relay, POST_MORTEM)
    reply = relay.begin(POST_MORTEM, _header(relay, POST_MORTEM))
    if not reply.ok:
        return
    debugger.announced = True
    try:
        relay.write(longrepr.rstrip("\n") + "\n")
        debugger.reset()
        debugger.interaction(None, tb)
    finally:
        relay.end()


def traced(relay: Relay, function: Callable[..., Any]) -> Callable[..., Any]:
    """``--trace``: ``function`` (a test function) starts in the debugger on this rank."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debugger = RelayPdb(relay, TRACE)
        return debugger.runcall(function, *args, **kwargs)

    return wrapper


class TracePlugin:
    """``--trace`` on the trace rank: each test function starts in the debugger there."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> Generator[None, Any, Any]:
        function = pyfuncitem.obj
        pyfuncitem.obj = traced(self.relay, function)
        try:
            return (yield)
        finally:
            pyfuncitem.obj = function  # a rerun wraps it afresh


class LiveInput:
    """``sys.stdin`` of the ``--distrank-debug-rank`` rank: lines typed at the terminal.

    Each read lends the terminal for that one line (the test's deadline stands still while the
    rank waits); pending output is flushed first, so an ``input()`` prompt shows.
    """

    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    def readline(self, size: int = -1) -> str:
        why = self.relay.why_not_here()
        if why:
            return ""
        sys.stdout.flush()
        sys.stderr.flush()
        opened = not self.relay.open
        reply = self.relay.begin(INPUT, "")
        if not reply.ok:
            return ""
        try:
            return self.relay.readline()
        finally:
            if opened:
                self.relay.end()

    def read(self, size: int = -1) -> str:
        return self.readline()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError("the debug rank's stdin is the controller's terminal, not a file")
