"""The controller's side of a rank's debugger: its terminal, lent to one rank at a time.

Runs in the controller (pool mode). A rank that opens a debugger (``breakpoint()``, ``--pdb``,
``--trace``, the ``--distrank-debug-rank`` rank reading its stdin; see :mod:`worker.rankpdb`) sends
:class:`~protocol.DebugOpen` and waits. :meth:`DebugTerminal.serve` answers it: the controller's
stdin is taken back from pytest's capture, the rank's output is shown labelled ``[rank r/n]``,
each line typed goes back to the rank, until the rank's :class:`~protocol.DebugClose`. Meanwhile
the controller reads no other rank's pipe, so ranks that stop too wait their turn; the caller
(:mod:`attempt`) holds the test's deadline and failure grace still for as long as it took.

Without a terminal (a pytest-xdist worker, stdin a pipe or /dev/null, ``-p no:terminal``) the
answer is no, with why: ``breakpoint()`` then fails its rank saying so, ``--pdb`` and ``--trace``
go on without a debugger after one line saying why. A debugger that opens while a pool starts
(``breakpoint()`` in ``pytest_distrank_rank_setup`` or at a test module's import in a rank) is
served the same way (:meth:`DebugTerminal.serve_start`), the start's clock stopped meanwhile.

:class:`LiveTail` shows the ``--distrank-debug-rank`` rank's log as it grows. The terminal also
announces that rank's pid, and echoes the ranks' output after each test under ``-s``.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from ...settings import Value
from ..protocol import (
    DebugClose,
    DebugLine,
    DebugOpen,
    DebugOutput,
    DebugRead,
    DebugReply,
    FromRank,
)

if TYPE_CHECKING:
    from .ranks import Rank, Ranks

#: Under -s: at most this many bytes of each rank's output are echoed per test.
ECHO_LIMIT = 1024 * 1024

Receive = Callable[[], "FromRank | None"]
Send = Callable[[Any], None]


class DebugTerminal:
    """The controller's terminal, as rank debuggers borrow it."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        #: Set by ``q`` in a rank's debugger: the session stops after the running test.
        self.quit = ""
        self._line_start = True
        self._said: set[str] = set()
        #: Pools whose debug rank's pid was announced (--distrank-debug-rank).
        self._announced: set[int] = set()

    @property
    def reporter(self) -> Any:
        return self.config.pluginmanager.get_plugin("terminalreporter")

    @property
    def capman(self) -> Any:
        return self.config.pluginmanager.get_plugin("capturemanager")

    def announce_debug_rank(self, pool: Ranks, live: Value[int | None]) -> None:
        """``--distrank-debug-rank``: name the rank's pid once per pool (for py-spy, gdb)."""
        rank, size = live.value, pool.world_size
        if rank is None or pool.id in self._announced:
            return
        if rank >= size:  # said once per world size: a size the option reaches in no pool
            ranks = "rank 0 only" if size == 1 else f"ranks 0-{size - 1}"
            self.say(
                f"{live.source}: pool {pool.describe()} has no rank {rank} ({ranks}), so "
                "none of its ranks is debugged; the option picks that rank in every pool that "
                "has one",
                once=f"debug rank beyond world size {size}",
            )
            return
        self._announced.add(pool.id)
        pid = pool.ranks[rank].pid
        self.say(
            f"rank {rank}/{pool.world_size} of pool {pool.describe()} is pid {pid}: its "
            f"output is shown live, its stdin is this terminal ({live.source}); to see its "
            f"stack: py-spy dump --pid {pid}"
        )

    def echo_rank_output(self, pool: Ranks, live_rank: int | None) -> None:
        """Under ``-s`` ranks write straight to their logs; show it, one line per rank line.

        Shown when the test ends (not live), each line prefixed with its rank, so that the
        output of N ranks stays readable; the live rank's was shown as it came.
        """
        reporter = self.reporter
        if reporter is None:
            return
        for rank, text in pool.output_of_last_test(ECHO_LIMIT).items():
            if rank == live_rank:
                continue
            tag = f"[rank {rank}/{pool.world_size}] "
            for line in text.splitlines():
                reporter.write_line(tag + line)

    # -- the terminal --------------------------------------------------------------------------

    @contextlib.contextmanager
    def stdin(self) -> Iterator[None]:
        """pytest's capture keeps stdin at /dev/null between tests: the real one, for a while.

        Between tests pytest's global capture has stdout and stderr suspended and stdin still
        captured (``suspend_global_capture(in_=False)``); this suspends stdin too and puts the
        same state back afterwards (resume all, suspend output again).
        """
        capman = self.capman
        if capman is None or not capman.is_globally_capturing():
            yield
            return
        capman.suspend_global_capture(in_=True)
        try:
            yield
        finally:
            capman.resume_global_capture()
            capman.suspend_global_capture(in_=False)

    def unavailable(self) -> str:
        """Why no debugger can open on this terminal, or ""."""
        if os.environ.get("PYTEST_XDIST_WORKER"):
            return (
                "this pytest process is a pytest-xdist worker (-n), which has no terminal "
                "(xdist refuses --pdb for the same reason); run the test without -n"
            )
        if self.reporter is None:
            return "pytest's terminal reporter is off (-p no:terminal)"
        with self.stdin():
            try:
                tty = sys.stdin is not None and sys.stdin.isatty()
            except (ValueError, OSError):
                tty = False
        if not tty:
            return "the controller's stdin is not a terminal (CI, a pipe or /dev/null)"
        return ""

    def write(self, label: str, text: str) -> None:
        """Rank output, each line labelled ``[rank r/n]`` (a prompt without its newline too)."""
        pieces = []
        for piece in text.splitlines(keepends=True):
            if self._line_start:
                pieces.append(f"[{label}] ")
            pieces.append(piece)
            self._line_start = piece.endswith("\n")
        if pieces:
            self.reporter.write("".join(pieces), flush=True)

    def say(self, text: str, once: str = "") -> None:
        """A line of the plugin's own (``distrank:``); ``once``: only the first time per key."""
        if self.reporter is None or (once and once in self._said):
            return
        self._said.add(once)
        self._newline()
        self.reporter.write_line(f"distrank: {text}")

    def _newline(self) -> None:
        if not self._line_start:
            self.reporter.write("\n")
            self._line_start = True
        self.reporter.ensure_newline()

    # -- a session -----------------------------------------------------------------------------

    def serve(
        self,
        label: str,
        opened: DebugOpen,
        nodeid: str,
        receive: Receive,
        send: Send,
        other: Callable[[FromRank | None], None],
        tail: LiveTail | None = None,
    ) -> None:
        """One rank's debugger, from its DebugOpen to its DebugClose (or its death).

        ``receive`` reads that rank's pipe (None: it died); ``other`` takes what is not part of
        the session (reports the rank sends while stepping, its death).
        """
        why = self.unavailable()
        if why:
            send(DebugReply(False, why))
            if opened.kind != "breakpoint":
                self.say(f"no debugger opened in {label} for {nodeid}: {why}", once=why)
            return
        with self.stdin():
            if tail is not None:
                tail.pump(final=True)
            if opened.header:
                self._newline()
                self.reporter.write_sep(">", f"{opened.header} for {nodeid}")
            send(DebugReply(True))
            closed = self._converse(label, receive, send, other, tail)
            if closed is not None and closed.done and opened.kind != "input":
                self._newline()
                verb = "quit" if closed.quit else "continue"
                self.reporter.write_sep(">", f"PDB {verb} in {label}")

    def serve_start(self, pool: Ranks, rank: Rank, opened: DebugOpen) -> list[FromRank | None]:
        """A debugger a rank opens while its pool starts (``breakpoint()`` in
        ``pytest_distrank_rank_setup`` or in a test module it imports), served as a test's
        (or refused, with why); returns what else the rank sent meanwhile (None: it died)."""
        others: list[FromRank | None] = []

        def receive() -> FromRank | None:
            while True:  # in steps, so that Ctrl-C is seen (SIGNAL_CHECK)
                for _, got in pool.wait_for([rank], SIGNAL_CHECK):
                    return got

        label = f"rank {rank.rank}/{pool.world_size}"
        what = f"the start of pool {pool.describe()}"
        self.serve(label, opened, what, receive, rank.conn.send, others.append)
        return others

    def _converse(
        self,
        label: str,
        receive: Receive,
        send: Send,
        other: Callable[[FromRank | None], None],
        tail: LiveTail | None,
    ) -> DebugClose | None:
        """Output, input, until the rank gives the terminal back (None: it died first)."""
        while True:
            message = receive()
            if isinstance(message, DebugOutput):
                self.write(label, message.text)
            elif isinstance(message, DebugRead):
                if tail is not None:
                    tail.pump(final=True)
                line = _read_line()
                self._line_start = True  # the terminal echoed the line and its newline
                send(DebugLine(line))
            elif isinstance(message, DebugClose):
                if message.quit:
                    self.quit = f"Quitting debugger (q in {label})"
                return message
            elif isinstance(message, DebugOpen):
                send(DebugReply(True))  # already its session
            else:
                other(message)
                if message is None:
                    return None


#: Longest a blocking wait of the controller lasts before it looks at its signals again.
SIGNAL_CHECK = 0.5


def _read_line() -> str:
    """A line from the terminal ("" at its end), waiting in steps: a Ctrl-C whose SIGINT the
    kernel gave to another thread of the controller (a plugin's) still interrupts within
    :data:`SIGNAL_CHECK`. Read from the fd, unbuffered: a terminal in canonical mode gives one
    line per read, so lines typed ahead stay in the terminal for the next prompt."""
    fd = sys.stdin.fileno()
    data = b""
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], SIGNAL_CHECK)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    return data.decode("utf-8", "replace")


class LiveTail:
    """The ``--distrank-debug-rank`` rank's log, shown labelled as it grows during a test."""

    def __init__(self, terminal: DebugTerminal, label: str, path: str, offset: int) -> None:
        self.terminal = terminal
        self.label = label
        self.path = path
        self.offset = offset
        self.partial = ""

    def pump(self, final: bool = False) -> None:
        """Show what the log gained; a last line without its newline only when ``final``."""
        try:
            with open(self.path, "rb") as log:
                log.seek(self.offset)
                data = log.read()
        except OSError:
            return
        self.offset += len(data)
        text = self.partial + data.decode("utf-8", "replace")
        if final:
            self.partial = ""
        else:
            cut = text.rfind("\n") + 1
            text, self.partial = text[:cut], text[cut:]
        if text and self.terminal.reporter is not None:
            self.terminal.write(self.label, text)
