"""One pool of rank processes: start, run a test, detect crashes and hangs, kill, stop.

Runs in the controller (the pytest process). A pool is ``world_size`` rank processes that share one
process group; it serves one test at a time. Every wait here is bounded and waits on the ranks'
result pipes AND their process sentinels, so a rank that dies is noticed at once (the loky way).

A pool that saw a crash, a hang, a fatal start-up error or a damaged process group is ``broken``:
the controller kills it and starts a new one for the next test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from _pytest.reports import TestReport

from .gpus import GpuLease
from .merge import synthesized_failure
from .protocol import Fatal, FromRank, Phase, RankConfig, Ready, Reports, RunTest, Shutdown, Stopped
from .stacks import format_stack, read_from, signal_name, tail, trim_fault_dump, where_blocked
from .worker import DUMP_SIGNAL, rank_main

Location = tuple[str, int | None, str]
Deserialize = Callable[[Any], TestReport]

#: After the grace period: how long ranks that failed themselves get to finish their teardown
#: when no other rank is left waiting (only then; a peer stuck in a collective is not kept).
FINISH_WAIT = 5.0
#: How long the ranks get to write their stacks after the dump signal.
DUMP_WAIT = 2.0


@dataclasses.dataclass(frozen=True)
class PoolKey:
    """What makes rank processes incompatible: tests with equal keys share a pool."""

    world_size: int
    backend: str
    init_process_group: bool
    #: Non-zero under --distrank-isolate: a pool of its own for one test.
    isolated: int = 0
    #: GPUs the pool leases for its lifetime (gpus.py); 0 for CPU-only pools.
    gpus: int = 0

    def describe(self) -> str:
        init = "" if self.init_process_group else ", init_process_group=False"
        gpus = f", {self.gpus} GPU{'s' if self.gpus > 1 else ''}" if self.gpus else ""
        return f"world_size={self.world_size}, backend={self.backend}{init}{gpus}"


class PoolStartError(Exception):
    """A pool that could not start; the message names the rank and shows its output."""


@dataclasses.dataclass
class Rank:
    rank: int
    process: Any
    conn: Connection
    log_path: str
    #: Kept apart from ``process``: it stays readable after the process object is closed.
    pid: int
    log_offset: int = 0
    done: bool = False


@dataclasses.dataclass
class TestRun:
    """What one test did on every rank; the input of the merge."""

    reports: dict[int, list[TestReport]]
    broken: str | None = None


class Pool:
    """``world_size`` rank processes, started together, serving one test at a time."""

    def __init__(
        self,
        key: PoolKey,
        pool_id: int,
        context: Any,
        configs: Sequence[RankConfig],
        parent_pid: int,
    ) -> None:
        self.key = key
        self.id = pool_id
        self.context = context
        self.configs = configs
        self.parent_pid = parent_pid
        self.phases = context.RawArray("i", key.world_size)
        self.ranks: list[Rank] = []
        self.ready: list[Ready] = []
        self.broken: str | None = None
        self.closed = False
        self.started_at = 0.0
        self.start_seconds = 0.0
        self.fork_seconds = 0.0
        self.ready_seconds = 0.0
        #: The pool's GPUs, given back when it is killed or stopped (gpus.py).
        self.lease: GpuLease | None = None

    @property
    def pids(self) -> list[int]:
        return [r.pid for r in self.ranks]

    # -- start ---------------------------------------------------------------------------------

    def start(self, timeout: float) -> None:
        """Start every rank and wait until all are ready; raise :class:`PoolStartError`."""
        self.started_at = time.monotonic()
        for cfg in self.configs:
            parent_conn, child_conn = self.context.Pipe(duplex=True)
            process = self.context.Process(
                target=rank_main,
                args=(cfg, child_conn, self.phases, self.parent_pid),
                name=f"distrank-pool{self.id}-rank{cfg.rank}",
            )
            process.start()
            child_conn.close()
            self.ranks.append(Rank(cfg.rank, process, parent_conn, cfg.log_path, process.pid))
        forked_at = time.monotonic()
        #: Waiting for the fork server (its first start imports torch) and forking the ranks.
        self.fork_seconds = forked_at - self.started_at
        deadline = self.started_at + timeout if timeout > 0 else None
        pending = {r.rank: r for r in self.ranks}
        while pending:
            ready = self._wait(list(pending.values()), deadline)
            if not ready:
                self.broken = "did not start in time"
                stacks = self.dump_stacks(list(pending.values()))
                self.kill()
                lines = [f"  rank {r}: {where_blocked(stacks[r], '')}" for r in sorted(pending)]
                raise PoolStartError(
                    f"rank processes of pool {self.key.describe()} did not start within "
                    f"{timeout:.0f} s:\n" + "\n".join(lines) + "\n\n" + stacks[min(pending)]
                )
            for rank, message in ready:
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
        else:
            head += f"died during start-up ({signal_name(rank.process.exitcode)})."
        output = tail(read_from(rank.log_path, 0))
        if not output.strip():
            return f"{head}\nIts log ({rank.log_path}) is empty."
        return f"{head}\nIts last output (log: {rank.log_path}):\n{output}"

    # -- waiting -------------------------------------------------------------------------------

    def _wait(
        self, ranks: list[Rank], deadline: float | None
    ) -> list[tuple[Rank, FromRank | None]]:
        """Messages from ``ranks`` (or ``None`` for a rank that died), or [] at the deadline."""
        by_obj: dict[Any, Rank] = {}
        for r in ranks:
            by_obj[r.conn] = r
            by_obj[r.process.sentinel] = r
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        out: list[tuple[Rank, FromRank | None]] = []
        ready = wait(list(by_obj), timeout)
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
        return [] if rank.process.is_alive() else [None]

    # -- running a test ------------------------------------------------------------------------

    def run(
        self,
        test: RunTest,
        location: Location,
        test_file: str,
        deserialize: Deserialize,
        timeout: float,
        timeout_source: str,
        grace: float,
    ) -> TestRun:
        """Run one test on every rank; a crash or hang becomes a synthesized failed report."""
        for r in self.ranks:
            r.done = False
            with contextlib.suppress(OSError):
                r.log_offset = os.stat(r.log_path).st_size
            r.conn.send(test)
        started = time.monotonic()
        deadline = started + timeout if timeout > 0 else None
        result = TestRun({r.rank: [] for r in self.ranks})
        failed_at: float | None = None
        trigger = ""  # what started the grace period, e.g. "rank 0 failed"
        finishing = 0.0  # extra time for ranks that failed and are still tearing down
        while True:
            pending = [r for r in self.ranks if not r.done]
            if not pending:
                break
            until = deadline
            if failed_at is not None:
                until = min(until or float("inf"), failed_at + grace + finishing)
            events = self._wait(pending, until)
            if not events:
                own = all(any(rep.failed for rep in result.reports[r.rank]) for r in pending)
                if failed_at is not None and own and not finishing:
                    # Only ranks that failed themselves are left, finishing their teardown: no
                    # peer is stuck waiting for them, so give them a moment before killing.
                    finishing = FINISH_WAIT
                    continue
                break
            for rank, message in events:
                if isinstance(message, Reports):
                    new = [deserialize(d) for d in message.reports]
                    result.reports[rank.rank].extend(new)
                    if failed_at is None and any(rep.failed for rep in new):
                        failed_at, trigger = time.monotonic(), f"rank {rank.rank} failed"
                    elif failed_at is None and any(_plain_skip(rep) for rep in new):
                        # A rank skipped while its peers go on: if they wait for it in a
                        # collective, only the grace period saves them (PITFALLS 8).
                        failed_at, trigger = time.monotonic(), f"rank {rank.rank} skipped"
                    if message.done:
                        rank.done = True
                        if not message.pg_healthy and self.broken is None:
                            self.broken = f"{test.nodeid} left the default process group destroyed"
                    continue
                if rank.done:
                    continue
                rank.done = True
                result.reports[rank.rank].extend(
                    self._crash_reports(rank, message, test, location, test_file, result)
                )
                status = "stopped serving" if isinstance(message, Fatal) else "crashed"
                self.broken = self.broken or f"rank {rank.rank} {status} in {test.nodeid}"
                if failed_at is None:
                    failed_at, trigger = time.monotonic(), f"rank {rank.rank} {status}"
        hung = [r for r in self.ranks if not r.done]
        if hung:
            self._hung_reports(
                hung,
                test,
                location,
                test_file,
                result,
                timeout,
                timeout_source,
                failed_at,
                trigger,
            )
        result.broken = self.broken
        return result

    def _phase_of(self, rank: Rank) -> Phase:
        try:
            return Phase(self.phases[rank.rank])
        except ValueError:
            return Phase.CALL

    def _fill_passed(
        self, rank: Rank, when: str, test: RunTest, location: Location, result: TestRun
    ) -> None:
        """Passing reports are batched, so a rank that died in call passed setup: say so."""
        reports = result.reports[rank.rank]
        have = {r.when for r in reports}
        if any(not r.passed for r in reports if r.when == "setup"):
            return  # no call phase after a failed or skipped setup
        for earlier in ("setup", "call", "teardown"):
            if earlier == when:
                break
            if earlier not in have:
                result.reports[rank.rank].append(
                    TestReport(test.nodeid, location, {}, "passed", None, earlier)
                )

    def _crash_reports(
        self,
        rank: Rank,
        message: object,
        test: RunTest,
        location: Location,
        test_file: str,
        result: TestRun,
    ) -> list[TestReport]:
        when = self._phase_of(rank).when
        self._fill_passed(rank, when, test, location, result)
        ws = self.key.world_size
        if isinstance(message, Fatal):
            text = message.message
            crash = f"stopped serving in {when}: its pytest session failed"
            note = f"error in {when}: the rank's pytest session failed"
        else:
            rank.process.join(5)
            status = signal_name(rank.process.exitcode)
            output = trim_fault_dump(read_from(rank.log_path, rank.log_offset), test_file)
            crash = f"crashed in {when} with {status}"
            text = f"rank {rank.rank}/{ws} {crash}.\n"
            if output.strip():
                text += f"Its last output (with faulthandler's traceback, if any):\n{output}\n"
            else:
                text += "It wrote nothing since the test started.\n"
            text += f"Its whole log: {rank.log_path}"
            note = f"crashed in {when} with {status}"
        return [
            synthesized_failure(
                test.nodeid, location, when, crash, text, note=note, stop=time.time()
            )
        ]

    def _hung_reports(
        self,
        hung: list[Rank],
        test: RunTest,
        location: Location,
        test_file: str,
        result: TestRun,
        timeout: float,
        timeout_source: str,
        failed_at: float | None,
        trigger: str,
    ) -> None:
        stacks = self.dump_stacks(hung)
        self.kill()
        now = time.monotonic()
        ws = self.key.world_size
        failed_before = {r.rank for r in hung if any(x.failed for x in result.reports[r.rank])}
        victims = [r.rank for r in hung if r.rank not in failed_before]
        names = ", ".join(str(r) for r in victims or sorted(failed_before))
        if failed_at is None:
            why = f"rank(s) {names} timed out after {timeout:g} s in {test.nodeid}"
        elif victims:
            why = f"rank(s) {names} killed after {trigger} in {test.nodeid}"
        else:
            why = f"rank(s) {names} killed while tearing down after failing {test.nodeid}"
        self.broken = self.broken or why
        for rank in hung:
            phase = self._phase_of(rank)
            if phase in (Phase.IDLE, Phase.STOPPING):
                # It had finished the test and was about to say so: nothing was lost.
                self._fill_passed(rank, "end", test, location, result)
                continue
            when = phase.when
            self._fill_passed(rank, when, test, location, result)
            if any(r.failed for r in result.reports[rank.rank]):
                # Its own failure is already reported; it was killed while cleaning up after it.
                continue
            where = where_blocked(stacks[rank.rank], test_file)
            if failed_at is not None:
                after = now - failed_at
                note = f"killed {after:.1f} s after {trigger}; {where}"
                crash = f"killed in {when}: {trigger} first"
                collateral = True
            else:
                note = f"timed out in {when} after {timeout:g} s; {where}"
                crash = (
                    f"Timeout: still in {when} after {timeout:g} s (timeout from {timeout_source})"
                )
                collateral = False
            stack = format_stack(stacks[rank.rank], test_file, rank.log_path)
            text = f"rank {rank.rank}/{ws}: {crash}\n{where}\n{stack}"
            report = synthesized_failure(
                test.nodeid,
                location,
                when,
                crash,
                text,
                note=note,
                collateral=collateral,
                stop=time.time(),
            )
            result.reports[rank.rank].append(report)

    def output_of_last_test(self, limit: int) -> dict[int, str]:
        """What each rank wrote to its log (fds 1 and 2) since the last test started."""
        return {r.rank: read_from(r.log_path, r.log_offset, limit) for r in self.ranks}

    # -- stacks, kill, stop --------------------------------------------------------------------

    def dump_stacks(self, ranks: list[Rank]) -> dict[int, str]:
        """Ask each rank for the stacks of all its threads (faulthandler, works inside C++)."""
        offsets = {}
        for r in ranks:
            try:
                offsets[r.rank] = os.stat(r.log_path).st_size
                os.kill(r.pid, DUMP_SIGNAL)
            except OSError:
                offsets[r.rank] = -1
        end = time.monotonic() + DUMP_WAIT
        sizes: dict[int, int] = {}
        while time.monotonic() < end:
            time.sleep(0.05)
            now = {r.rank: _size(r.log_path) for r in ranks}
            grew = all(now[k] > offsets[k] for k in now if offsets[k] >= 0)
            if grew and now == sizes:
                break
            sizes = now
        return {
            r.rank: read_from(r.log_path, offsets[r.rank]) if offsets[r.rank] >= 0 else ""
            for r in ranks
        }

    def kill(self) -> None:
        """SIGKILL every rank and whatever it started (each rank leads its process group).

        Then release the pipes and sentinels: a session that replaces pools thousands of times
        (``--distrank-isolate``) must not run out of file descriptors. Idempotent.
        """
        if self.closed:
            return
        for r in self.ranks:
            if r.process.exitcode is None:
                with contextlib.suppress(OSError):
                    os.killpg(r.pid, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.kill(r.pid, signal.SIGKILL)
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
            events = self._wait(pending, deadline)
            if not events:
                break
            for rank, message in events:
                if isinstance(message, Stopped):
                    errors.extend(f"rank {rank.rank}: {e}" for e in message.errors)
                if isinstance(message, Stopped) or message is None:
                    pending = [r for r in pending if r is not rank]
        for r in self.ranks:
            r.process.join(max(0.0, deadline - time.monotonic()))
        self.kill()
        return errors


def _plain_skip(report: TestReport) -> bool:
    """A skip (not an xfail): the rank will not take part in this test's collectives."""
    return report.skipped and not hasattr(report, "wasxfail")


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1
