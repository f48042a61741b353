"""The control channel of launcher mode: a c10d store of its own, apart from the tests' group.

Runs in every pytest process of a launched world (each is one rank), used by its main thread
and by its watchdog thread. Per-rank results, verdicts, stacks and the exit code travel here, so a
test that breaks or destroys its process group cannot break reporting.

Two connections per process, each made once (new TCPStore client connections occasionally stall for
seconds): ``control`` for this module's keys, used only for short operations (``check`` before
``get``, never a blocking ``get`` of a key that may not exist: a TCPStore client holds its lock for
the whole wait, and the watchdog thread must never be stuck behind the main thread), and ``data``
for ``init_process_group`` and the ``dist_store`` fixture, whose waits may block. A process that a
test forked never uses them: it makes one connection of its own (:meth:`Channel.for_fork`) to say
so, then leaves.

Who hosts the store at MASTER_ADDR:MASTER_PORT: torchrun's agent when it says so
(``TORCHELASTIC_USE_AGENT_STORE=True``, every rank is a client); otherwise rank 0
(``is_master=True``), the other ranks connect to it.

The store has no authentication: :meth:`Channel.put` seals every payload with a MAC
(:class:`auth.Auth`) and :meth:`Channel.get` raises :class:`Forged` for one that does not verify,
then reads it with its kind's reader (:func:`keys.read_stack`, ...): :class:`Malformed` for one
that is not what its kind says. Counters (:meth:`Channel.add`) carry none: a moved counter only
says "go read".
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from . import keys
from .auth import MEANING, Auth
from .env import Launch

#: Polling of the control store: start fast (a test costs milliseconds), back off to this.
POLL_MAX = 0.02
#: Exit code of a rank that lost the control channel (pytest's INTERNAL_ERROR).
LOST_EXIT = 3
#: A waiter on rank 0 gives up when rank 0's heartbeat has not moved for this long.
HEARTBEAT_STALE = 60.0


class ChannelError(Exception):
    """The control store cannot be reached: rank 0 or the launcher's agent is gone."""


class Rank0Silent(ChannelError):
    """Rank 0's heartbeat stood still for ``HEARTBEAT_STALE`` seconds; ``since``: the wall-clock
    time it last moved (:mod:`gaveup` tells rank 0, should it wake up)."""

    def __init__(self, message: str, since: float) -> None:
        super().__init__(message)
        self.since = since


class Forged(ChannelError):
    """A payload whose MAC does not verify: who wrote it is unknown.

    A rank that reads a forged verdict, plan or exit code leaves as one that lost the channel;
    rank 0's gathering fails the test with it instead (:func:`reports.forged_report`).
    """

    #: The failed report's first words (:func:`reports.forged_report`), what it means, and what
    #: to do about it.
    headline = "control store tampered with"
    meaning = MEANING
    advice = (
        "Set DISTRANK_SECRET to the same value for every rank (docs/multi-node.md, Security), "
        "and keep MASTER_PORT out of reach of other users and hosts."
    )

    def __init__(self, key: str, rank: int, why: str) -> None:
        self.key = key
        self.rank = rank
        self.why = why
        super().__init__(f"the control store's {key!r} (rank {rank}) {why}: {self.meaning}")

    def ends_run(self, nodeid: str) -> str:
        """Why the run stops after the test it failed (the remaining tests' skip reason)."""
        return (
            f"the control store was written by someone other than the ranks in {nodeid} "
            f"({self.key!r} was tampered with): no later result could be trusted"
        )


class Malformed(Forged):
    """A payload that verified but is not what its kind says (:class:`keys.MessageError`): the
    test fails with it as with a forged one, naming the key."""

    headline = "malformed control payload"
    meaning = (
        "a rank wrote what this version of pytest-distrank does not read (a protocol bug, or "
        "another version of pytest-distrank on that rank)"
    )
    advice = "Run one version of pytest-distrank on every rank; if it is one, please report this."

    def ends_run(self, nodeid: str) -> str:
        return (
            f"a rank wrote a malformed {self.key!r} in {nodeid}: no later result could be trusted"
        )


T = TypeVar("T")


class Channel:
    """The launched world's control store, seen from one rank."""

    def __init__(
        self,
        launch: Launch,
        connect_timeout: float,
        auth: Auth,
        client_only: bool = False,
        connected: Any = None,
    ) -> None:
        """Connect to the store (``connected``: a client of it already made, for both uses)."""
        import torch.distributed as dist

        self.launch = launch
        self.auth = auth
        self.hosts = launch.rank == 0 and not launch.agent_store and not client_only
        control = data = connected
        if connected is None:
            control, data = self._connect(connect_timeout, client_only)
        base = f"distrank/r{launch.restart}/"
        self._raw_data = data
        self._base = base
        self.control = dist.PrefixStore(base + "ctl/", control)
        #: Store of the ``dist_store`` fixture (keys private to each test under it).
        self.user_store = dist.PrefixStore(base + "user/", data)

    def _connect(self, connect_timeout: float, client_only: bool) -> tuple[Any, Any]:
        import torch.distributed as dist

        launch = self.launch
        timeout = timedelta(seconds=connect_timeout)
        addr, port = launch.master_addr, launch.master_port
        where = f"{addr}:{port}"
        try:
            if self.hosts:
                # Listens on every interface: ranks on other nodes connect to MASTER_ADDR.
                control = dist.TCPStore(
                    addr, port, is_master=True, wait_for_workers=False, timeout=timeout
                )
            else:
                control = dist.TCPStore(addr, port, is_master=False, timeout=timeout)
            data = control
            if not client_only:
                data = dist.TCPStore(addr, port, is_master=False, timeout=timeout)
        except Exception as exc:  # DistNetworkError, DistStoreError, RuntimeError
            role = "host" if self.hosts else "reach"
            owner = (
                "torchrun's agent"
                if launch.agent_store
                else "rank 0 (which hosts it)"
                if not self.hosts
                else "this rank 0"
            )
            raise ChannelError(
                f"pytest-distrank: {launch.label()} could not {role} the control store at "
                f"MASTER_ADDR:MASTER_PORT = {where} within {connect_timeout:.0f} s "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}).\n"
                f"It is served by {owner}. Check that MASTER_ADDR names the host of rank 0 and "
                "is reachable from every node, and that MASTER_PORT is free there (another job "
                "on the same node may use it: pick another port)."
            ) from None
        return control, data

    def for_fork(self, connect_timeout: float) -> Channel:
        """A connection of its own for a process the test forked.

        The inherited connections are the rank's: a child that used their socket would
        interleave its requests and answers with the rank's own (and a lock the rank's watchdog
        held at fork time stays held in the child forever).
        """
        return Channel(self.launch, connect_timeout, self.auth, client_only=True)

    def pg_store(self, name: str) -> Any:
        """A key space of its own for one ``init_process_group`` of this run, ``name`` alike on
        every member of the group and unique in the run (:meth:`group.GroupKeeper.ensure`)."""
        import torch.distributed as dist

        return dist.PrefixStore(f"{self._base}pg/{name}/", self._raw_data)

    # -- short operations ----------------------------------------------------------------------

    def _op(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:
            raise ChannelError(
                f"the control store at {self.launch.master_addr}:{self.launch.master_port} "
                f"failed during {what} ({type(exc).__name__}: {exc}); rank 0 or the launcher "
                "has probably ended"
            ) from None

    def put(self, key: str, value: object) -> None:
        """Store ``value`` (JSON) at ``key``, sealed with its MAC."""
        index, rank = keys.subject(key)
        wire = self.auth.seal(key, index, rank, json.dumps(value, default=repr))
        self._op(f"set {key}", lambda: self.control.set(key, wire))

    def has(self, key: str) -> bool:
        return bool(self._op(f"check {key}", lambda: self.control.check([key])))

    def get(self, key: str, read: Callable[[object], T]) -> T:
        """The value of a key that exists (check with :meth:`has` first), read by ``read`` (its
        kind's reader in :mod:`keys`): :class:`Forged` unless its MAC verifies (for this run,
        key, test, rank and attempt), :class:`Malformed` unless ``read`` accepts it."""
        raw = self._op(f"get {key}", lambda: self.control.get(key))
        index, rank = keys.subject(key)
        try:
            text = self.auth.unseal(key, index, rank, bytes(raw))
            value = json.loads(text)
        except ValueError as exc:  # json.JSONDecodeError too: a payload that verified is JSON
            raise Forged(key, rank, str(exc)) from None
        try:
            return read(value)
        except keys.MessageError as exc:
            raise Malformed(key, rank, f"does not read: {exc}") from None

    def take(self, key: str, read: Callable[[object], T]) -> T:
        """Get and delete (reports are read once; the store does not grow with the session). A
        forged payload is deleted too (:class:`Forged`): the genuine one may still come."""
        try:
            return self.get(key, read)
        finally:
            self._op(f"delete {key}", lambda: self.control.delete_key(key))

    def add(self, key: str, amount: int) -> int:
        return int(self._op(f"add {key}", lambda: self.control.add(key, amount)))

    # -- waiting -------------------------------------------------------------------------------

    def wait_any(
        self,
        keys: Sequence[str],
        until: float | None,
        watch_rank0: bool = False,
        stop: Callable[[], bool] | None = None,
    ) -> str | None:
        """The first of ``keys`` that exists; None at ``until`` (monotonic) or when ``stop()``.

        With ``watch_rank0`` it raises :class:`ChannelError` once rank 0's heartbeat (bumped by
        its watchdog every second) has not moved for ``HEARTBEAT_STALE`` seconds.
        """
        delay = 0.0005
        beat = self.add("heartbeat", 0) if watch_rank0 else 0
        beat_at = time.monotonic()
        while True:
            for key in keys:
                if self.has(key):
                    return key
            now = time.monotonic()
            if until is not None and now >= until:
                return None
            if stop is not None and stop():
                return None
            if watch_rank0 and now - beat_at > 1.0:
                current = self.add("heartbeat", 0)
                if current != beat:
                    beat, beat_at = current, now
                elif now - beat_at > HEARTBEAT_STALE:
                    raise Rank0Silent(
                        f"rank 0 has given no sign of life for {HEARTBEAT_STALE:.0f} s "
                        "(its watchdog stopped bumping the heartbeat)",
                        time.time() - (now - beat_at),
                    )
            time.sleep(delay)
            delay = min(delay * 2, POLL_MAX)


def dump_threads(main_ident: int | None) -> str:
    """Every thread's stack, innermost frame first, in faulthandler's format.

    The main thread comes last, which is where :func:`stacks.main_thread_frames` looks for it.
    Works while the main thread waits inside a C++ collective (it does not hold the GIL there).
    """
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    here = threading.get_ident()
    order = sorted(frames, key=lambda ident: ident == main_ident)
    lines: list[str] = []
    for ident in order:
        head = "Current thread" if ident == here else "Thread"
        lines.append(f"{head} 0x{ident:016x} [{names.get(ident, '?')}] (most recent call first):")
        for entry in reversed(traceback.extract_stack(frames[ident])):
            lines.append(f'  File "{entry.filename}", line {entry.lineno} in {entry.name}')
        lines.append("")
    return "\n".join(lines)
