"""One pool of rank processes: start, run a test, detect crashes and hangs, kill, stop.

Runs in the controller (the pytest process). A pool is ``world_size`` rank processes that share one
process group; it serves one test at a time. Every wait here is bounded and waits on the ranks'
result pipes AND their process sentinels, so a rank that dies is noticed at once (the loky way).

A pool that saw a crash, a hang, a fatal start-up error, a damaged process group or any other
sign of being unfit (:mod:`outcome.checks`) is ``broken``: the controller kills it and starts a
new one for the next test. Running one test (waiting by the end-of-test rule, judging what the ranks
sent) is :mod:`attempt`'s; this module owns the processes, their pipes and their lifecycle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Sequence
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler
from typing import Any

from ...outcome.endgame import (
    AFTER_TEARDOWN,
    BEFORE_SETUP,
    NOT_RECEIVED,
    Endgame,
    Position,
    clamp_wait,
)
from ...outcome.expectations import ExpectedExit
from ...outcome.records import Reports, RunTest
from ...outcome.stacks import (
    format_stack,
    read_from,
    signal_name,
    tail,
    user_file,
    where_blocked,
)
from ...rank import reaper
from ..onetest.attempt import Attempt, Deserialize
from ..onetest.debugrelay import DebugTerminal
from ..onetest.exits import Exits
from ..onetest.probes import dump_stacks, why_silent
from ..onetest.ranks import Rank, TestRun
from ..protocol import (
    Collectives,
    CountCollectives,
    DebugOpen,
    DebugReply,
    Fatal,
    FromRank,
    Phase,
    PhaseFile,
    RankConfig,
    Ready,
    Shutdown,
    Stopped,
    phase_slots,
)
from ..worker.entry import rank_main
from .gpus import GpuLease
from .poolkey import PoolKey
from .templates import AskFork, fork_all

Location = tuple[str, int | None, str]
#: How long ranks get to count their collectives (a flight recorder dump: tens of ms).
PROBE_WAIT = 30.0


@dataclasses.dataclass(frozen=True)
class Sent:
    """A test sent to every rank of a pool: when (monotonic seconds, and wall-clock ns for the
    flight recorder's records)."""

    test: RunTest
    started: float
    ns: int


class PoolUnfit(Exception):
    """The pool could not take a test (a rank died just before it was sent); says why."""


class PoolStartError(Exception):
    """A pool that could not start; the message names the rank and shows its output."""


class Pool:
    """``world_size`` rank processes, started together, serving one test at a time."""

    def __init__(
        self,
        key: PoolKey,
        pool_id: int,
        context: Any,
        configs: Sequence[RankConfig],
        parent_pid: int,
        fork: AskFork | None = None,
    ) -> None:
        self.key = key
        self.id = pool_id
        self.context = context
        self.configs = configs
        self.parent_pid = parent_pid
        #: How its ranks start: forked from templates (templates.py), or by the fork server.
        self.fork = fork
        #: Per rank: its phase and the index of the test it is in (protocol.phase_slots).
        self.phases: Any = (
            context.RawArray("i", 2 * key.world_size)
            if fork is None
            else PhaseFile(configs[0].phases_path, 2 * key.world_size)
        )
        self.ranks: list[Rank] = []
        self.ready: list[Ready] = []
        self.broken: str | None = None
        self.closed = False
        self.started_at = 0.0
        self.start_seconds = 0.0
        #: The pool's start (the fork server's wait included) not yet charged to a test: the
        #: first test it serves carries it in its setup report's duration (controller).
        self.uncharged = 0.0
        self.fork_seconds = 0.0
        self.ready_seconds = 0.0
        #: Per rank: its groups' sequence numbers after the last test found in step.
        self.sequence_base: dict[int, dict[str, int]] = {}
        #: The test it ran last (named when a rank dies between tests).
        self.last_test: RunTest | None = None
        #: The test before :attr:`last_test`.
        self.previous_test: RunTest | None = None
        #: The pool's GPUs, given back when it is killed or stopped (gpus.py).
        self.lease: GpuLease | None = None
        #: Per rank that stopped cleanly: (CPU seconds spent serving tests, tests served).
        self.serving_cpu: dict[int, tuple[float, int]] = {}

    @property
    def tag(self) -> str:
        """The pool's tag in its ranks' environment (reaper.POOL_TAG_ENV): its store's path."""
        return self.configs[0].store_path if self.configs else ""

    @property
    def pids(self) -> list[int]:
        return [r.pid for r in self.ranks]

    @property
    def world_size(self) -> int:
        return self.key.world_size

    @property
    def backend(self) -> str:
        return self.key.backend

    def describe(self) -> str:
        return self.key.describe()

    def marks(self, rank: Rank) -> tuple[int, int]:
        phase_slot, index_slot = phase_slots(rank.rank)
        return self.phases[phase_slot], self.phases[index_slot]

    # -- start ---------------------------------------------------------------------------------

    def start(self, timeout: float, terminal: DebugTerminal | None = None) -> None:
        """Start every rank and wait until all are ready; raise :class:`PoolStartError`.

        A rank that opens a debugger meanwhile (``breakpoint()`` in its rank setup, or in a
        test module it imports) gets ``terminal`` as a test's does (refused, with why, where
        there is none); the start's clock stands still while the debugger is open.
        """
        self.started_at = time.monotonic()
        if self.fork is not None:
            fork_all(self.configs, self.context, self.fork, self.ranks)
        else:
            for cfg in self.configs:
                parent_conn, child_conn = self.context.Pipe(duplex=True)
                process = self.context.Process(
                    target=rank_main,
                    args=(cfg, child_conn, self.phases, self.parent_pid),
                    name=f"distrank-pool{self.id}-rank{cfg.rank}",
                )
                process.start()
                child_conn.close()
                rank = Rank(cfg.rank, process, parent_conn, cfg.log_path, process.pid)
                self.ranks.append(rank)
        forked_at = time.monotonic()
        #: Waiting for the fork server (its first start imports torch) and forking the ranks.
        self.fork_seconds = forked_at - self.started_at
        deadline = self.started_at + timeout if timeout > 0 else None
        pending = {r.rank: r for r in self.ranks}
        while pending:
            left = None if deadline is None else deadline - time.monotonic()
            ready = self.wait_for(list(pending.values()), left)
            if not ready:
                self.broken = "did not start in time"
                stacks = dump_stacks(list(pending.values()))
                self.kill()
                lines = [f"  rank {r}: {where_blocked(stacks[r], '')}" for r in sorted(pending)]
                raise PoolStartError(
                    f"rank processes of pool {self.key.describe()} did not start within "
                    f"{timeout:.0f} s:\n" + "\n".join(lines) + "\n\n" + stacks[min(pending)]
                )
            while ready:
                rank, message = ready.pop(0)
                if isinstance(message, DebugOpen):
                    began = time.monotonic()
                    if terminal is None:
                        rank.conn.send(DebugReply(False, "no terminal is lent to pool starts"))
                    else:  # what else it sent meanwhile comes next
                        ready[:0] = [(rank, m) for m in terminal.serve_start(self, rank, message)]
                    if deadline is not None:
                        deadline += time.monotonic() - began
                    continue
                if isinstance(message, Ready):
                    self.ready.append(message)
                    del pending[rank.rank]
                    continue
                self.broken = "start-up failed"
                story = self._startup_failure(rank, message)
                self.kill()
                raise PoolStartError(story)
        self.start_seconds = time.monotonic() - self.started_at
        #: From the last fork to every rank ready: their pytest sessions, collection, the group.
        self.ready_seconds = time.monotonic() - forked_at

    def _startup_failure(self, rank: Rank, message: object) -> str:
        head = f"rank {rank.rank}/{self.key.world_size} "
        if isinstance(message, Fatal):
            head += f"failed to start: {message.message}"
        elif message is None:
            head += f"died during start-up ({signal_name(rank.process.exitcode)})."
        else:  # alive: never word it as dead
            head += f"sent {type(message).__name__} during start-up, where only Ready may come."
        output = tail(read_from(rank.log_path, 0))
        if not output.strip():
            return f"{head}\nIts log ({rank.log_path}) is empty."
        return f"{head}\nIts last output (log: {rank.log_path}):\n{output}"

    # -- waiting -------------------------------------------------------------------------------

    def wait_for(
        self, ranks: list[Rank], timeout: float | None
    ) -> list[tuple[Rank, FromRank | None]]:
        """Messages from ``ranks`` (or ``None`` for a rank that died), or [] after ``timeout``."""
        by_obj: dict[Any, Rank] = {}
        for r in ranks:
            by_obj[r.conn] = r
            by_obj[r.process.sentinel] = r
        out: list[tuple[Rank, FromRank | None]] = []
        ready = wait(list(by_obj), clamp_wait(timeout))
        seen: set[int] = set()
        for obj in ready:
            rank = by_obj[obj]
            if rank.rank not in seen:  # its pipe and its sentinel may both be ready
                seen.add(rank.rank)
                readable = any(o is rank.conn for o in ready)
                out.extend((rank, m) for m in self._receive(rank, readable))
        return out

    def _receive(self, rank: Rank, readable: bool) -> list[FromRank | None]:
        """One message from the rank, or ``[None]`` if it is gone.

        One per call: a rank with more messages queued is ready again at the next wait, so no
        extra ``poll()`` (a selector of its own each time) is spent looking for them.
        """
        try:
            if readable or rank.conn.poll():
                message: FromRank = rank.conn.recv()
                return [message]
        except (EOFError, OSError):
            rank.process.join(5)
            return [None]
        except Exception as exc:  # a garbled pipe: two processes wrote to it at once
            text = f"sent a message the controller could not read ({exc!r}); a process forked "
            text += "by the test writing to the rank's pipe?"
            return [Fatal(rank.rank, text)]
        return [] if rank.process.is_alive() else [None]

    def check_idle(self) -> str | None:
        """Before a test is sent: is every rank alive and silent, as an idle rank must be?

        A rank that died between tests (an alarm left running, a daemon thread calling
        ``os._exit``, NCCL's watchdog, the OOM killer) or that sent something after its last
        test ended (reports from a process that test forked) makes the pool unfit. Returns what
        happened, naming the rank and the test it last ran, or None. One ``select`` per test.
        """
        after = f"after {self.last_test.nodeid}" if self.last_test else "before its first test"
        by_obj: dict[Any, Rank] = {}
        for r in self.ranks:
            by_obj[r.conn] = r
            by_obj[r.process.sentinel] = r
        ready = wait(list(by_obj), 0)
        for obj in ready:
            rank = by_obj[obj]
            tag = f"rank {rank.rank}/{self.key.world_size} (pid {rank.pid})"
            if obj is rank.conn:
                try:
                    message = rank.conn.recv()
                except Exception:
                    message = None
                if isinstance(message, Reports):
                    return (
                        f"{tag} sent reports for {message.nodeid} from pid {message.pid} "
                        f"{after} had ended: a process forked by that test? "
                        "Its outcome may be wrong"
                    )
                if message is not None:
                    return f"{tag} sent {type(message).__name__} while idle, {after}"
            rank.process.join(1)
            status = signal_name(rank.process.exitcode)
            return f"{tag} died while idle ({status}), {after}"
        return None

    # -- running a test ------------------------------------------------------------------------

    def send(self, test: RunTest) -> Sent:
        """Send ``test`` to every rank; raise :class:`PoolUnfit` if one is gone."""
        previous, self.last_test = self.last_test, test
        self.previous_test = previous
        sent = Sent(test, time.monotonic(), time.time_ns())
        data = bytes(ForkingPickler.dumps(test))  # once for every rank: what conn.send pickles
        for r in self.ranks:
            with contextlib.suppress(OSError):
                r.log_offset = os.stat(r.log_path).st_size
            try:
                r.conn.send_bytes(data)
            except OSError as exc:  # it died after the idle check: not this test's doing
                r.process.join(1)
                after = f"after {previous.nodeid}" if previous else "before its first test"
                raise PoolUnfit(
                    f"rank {r.rank}/{self.key.world_size} (pid {r.pid}) died before the test "
                    f"reached it ({signal_name(r.process.exitcode)}; {exc!r}), {after}"
                ) from None
        return sent

    def run(
        self,
        test: RunTest,
        location: Location,
        test_file: str,
        deserialize: Deserialize,
        timeout: float,
        timeout_source: str,
        grace: float,
        terminal: DebugTerminal | None = None,
        end_deadlocks: bool = False,
        expected: dict[int, ExpectedExit] | None = None,
    ) -> TestRun:
        """Run one test on every rank (see :class:`~attempt.Attempt`); ``expected``: the ranks
        its markers expect to exit (exits.py)."""
        sent = self.send(test)
        game = Endgame(
            frozenset(r.rank for r in self.ranks),
            sent.started,
            timeout,
            grace,
            timeout_source=timeout_source,
        )
        live = self.configs[0].debug.live_rank if self.configs and self.configs[0].debug else None
        attempt = Attempt(
            self,
            sent.test,
            dict(self.sequence_base),
            location,
            test_file,
            deserialize,
            game,
            sent.ns,
            terminal,
            live,
            end_deadlocks,
            Exits(dict(expected or {})),
        )
        run = attempt.run()
        self.broken = self.broken or run.broken
        if run.next_base is not None:
            self.sequence_base = run.next_base
        return run

    def position(self, rank: Rank, test: RunTest) -> Position:
        """Where ``rank`` was in ``test`` when last seen, from the shared phase array."""
        phase_slot, index_slot = phase_slots(rank.rank)
        if self.phases[index_slot] != test.index:
            return NOT_RECEIVED
        try:
            phase = Phase(self.phases[phase_slot])
        except ValueError:
            return Position.in_phase("call")
        if phase is Phase.RECEIVED:
            return BEFORE_SETUP
        if phase in (Phase.FINISHED, Phase.IDLE, Phase.STOPPING):
            return AFTER_TEARDOWN
        return Position.in_phase(phase.when)

    def count_collectives(self) -> dict[int, dict[str, tuple[int, str]]] | None:
        """Every rank's collective counts per group, or None when some rank cannot tell."""
        for r in self.ranks:
            r.conn.send(CountCollectives())
        answers: dict[int, dict[str, tuple[int, str]]] = {}
        deadline = time.monotonic() + PROBE_WAIT
        pending = list(self.ranks)
        while pending:
            events = self.wait_for(pending, deadline - time.monotonic())
            if not events:
                return None
            for rank, message in events:
                if not isinstance(message, Collectives) or message.counts is None:
                    return None
                answers[rank.rank] = message.counts
                pending = [r for r in pending if r is not rank]
        return answers

    def output_of_last_test(self, limit: int) -> dict[int, str]:
        """What each rank wrote to its log (fds 1 and 2) since the last test started."""
        return {r.rank: read_from(r.log_path, r.log_offset, limit) for r in self.ranks}

    # -- kill, stop ------------------------------------------------------------------------------

    def kill(self) -> None:
        """SIGKILL every rank and whatever it started (each rank leads its process group).

        Then release the pipes and sentinels: a session that replaces pools thousands of times
        (``--distrank-isolate``) must not run out of file descriptors. Idempotent.
        """
        if self.closed:
            return
        # Everything the ranks started, found before the ranks die (see reaper.py): their
        # descendants (orphans included: ranks are subreapers) and what carries the pool's tag.
        live = [r.pid for r in self.ranks if r.process.exitcode is None]
        leftovers = reaper.tagged(self.tag)  # no walk for descendants when every rank is gone
        leftovers |= reaper.descendants(live) if live else set()
        for r in self.ranks:
            # Its process group even when the rank already died: its children may live on.
            with contextlib.suppress(OSError):
                os.killpg(r.pid, signal.SIGKILL)
            if r.process.exitcode is None:
                with contextlib.suppress(OSError):
                    os.kill(r.pid, signal.SIGKILL)
        reaper.kill_all(leftovers - {r.pid for r in self.ranks})
        for r in self.ranks:
            r.process.join(5)
            r.conn.close()
            with contextlib.suppress(ValueError):  # still running after SIGKILL and 5 s
                r.process.close()
        if self.lease is not None:
            self.lease.release()
        self.closed = True

    def request_stop(self) -> None:
        """Ask every rank to tear down and exit; :meth:`finish_stop` collects them."""
        for r in self.ranks:
            with contextlib.suppress(OSError, ValueError):
                r.conn.send(Shutdown())

    def finish_stop(self, timeout: float) -> list[str]:
        """Wait for the ranks to stop; return teardown errors; kill what does not stop."""
        errors: list[str] = []
        if self.closed:
            return errors
        deadline = time.monotonic() + timeout
        pending = [r for r in self.ranks if r.process.exitcode is None and not r.conn.closed]
        while pending:
            events = self.wait_for(pending, deadline - time.monotonic())
            if not events:
                break
            for rank, message in events:
                if isinstance(message, Stopped):
                    errors.extend(f"rank {rank.rank}: {e}" for e in message.errors)
                    ready = next((r for r in self.ready if r.rank == rank.rank), None)
                    if ready is not None and message.tests:
                        self.serving_cpu[rank.rank] = (message.cpu - ready.cpu, message.tests)
                if isinstance(message, Stopped) or message is None:
                    pending = [r for r in pending if r is not rank]
        if pending:
            errors.extend(self._stuck_at_stop(pending, timeout))
        for r in self.ranks:
            r.process.join(max(0.0, deadline - time.monotonic()))
        self.kill()
        return errors

    def _stuck_at_stop(self, stuck: list[Rank], timeout: float) -> list[str]:
        """Ranks that did not finish their session teardown in time: where each was blocked."""
        stacks = dump_stacks(stuck)
        ws = self.key.world_size
        out = []
        for rank in stuck:
            dump = stacks[rank.rank]
            where = where_blocked(dump, user_file(dump)) if dump else why_silent(rank.pid)
            out.append(
                f"rank {rank.rank}/{ws} of pool {self.key.describe()} did not finish tearing "
                "down its remaining fixtures (session, module, class scope) "
                f"within {timeout:g} s and was killed; {where or 'no stack'}\n"
                f"{format_stack(dump, user_file(dump), rank.log_path)}"
            )
        return out
