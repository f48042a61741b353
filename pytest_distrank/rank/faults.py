"""Injected faults, the rank side: the ``faults`` fixture's object and its dispatch mode.

Runs in rank processes of both modes, only in tests that take the ``faults`` fixture: nothing
here runs, and no dispatch mode is entered, in any other test. The fixture (:mod:`fixtures`)
enters a :class:`TorchDispatchMode` at its setup and leaves it at its teardown, whatever
happened. The mode sees every ``c10d::`` op (``torch.distributed.*``, DDP's broadcasts and its
backward all-reduce) and every ``_c10d_functional::`` op (DTensor, tensor parallel), counts them
per group and per op (:mod:`faultplan`), and fires an armed fault just before the op it names
runs: the rank never enters that collective. It does not see inside ``torch.compile``d graphs.

A fired fault is reported before it acts: in pool mode through the rank's pipe (the channel the
pool rank sets, :func:`set_channel`), so that a killed rank is an expected exit and its line
reaches the test's report; in launcher mode as a section of the rank's own report (kills are
pool mode only there: torchrun's agent stops every worker when one dies).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ..outcome.expectations import POOL_ONLY
from .faultplan import (
    MODE_NAME,
    OPS,
    USER_NAME,
    Counts,
    Fault,
    call_words,
    fired_line,
    make_fault,
    never_fired,
)

#: ``(code, source, injected line, phase)`` -> the controller (pool mode; None elsewhere).
Channel = Callable[[int | None, str, str, str], None]
_channel: Channel | None = None
#: The report section of a fired fault when there is no channel (launcher mode).
SECTION_KEY = "distrank injected fault"


def set_channel(channel: Channel | None) -> None:
    """Pool mode: how this rank tells its controller, during a test, what it must know."""
    global _channel
    _channel = channel


def announce_exit(code: int | None, source: str) -> None:
    """This rank is meant to end the running test with ``code`` (``-6``: SIGABRT), for
    ``source``'s reason (a harness class's ``special_return_code_checks``); None: it is not
    any more (it lived, and was judged in place)."""
    if _channel is not None:
        _channel(code, source, "", "call")


class Faults:
    """What ``faults`` gives a test: arm a fault at a chosen collective, on one rank.

    Every rank makes the same calls; each checks them (a bad call fails the test on every rank)
    and the fault is armed on its ``rank`` only.
    """

    def __init__(self, rank: int, world_size: int, item: Any) -> None:
        self.rank = rank
        self.world_size = world_size
        self.item = item
        #: The faults armed on this rank.
        self.armed: list[Fault] = []
        self.counts = Counts()
        self.started = time.monotonic()
        self.call_started: float | None = None
        self.call_ended: float | None = None
        self.mode: Any = None
        self._lock = threading.Lock()

    # -- the API -------------------------------------------------------------------------------

    def kill(
        self,
        *,
        rank: int,
        at: str,
        nth: int = 1,
        signal: str | int = "SIGKILL",
        optional: bool = False,
    ) -> None:
        """Kill ``rank`` with ``signal`` just before its ``nth`` ``at`` op on a group: an
        expected exit of that rank (pool mode only)."""
        __tracebackhide__ = True
        call = call_words("kill", {"rank": rank, "at": at, "nth": nth, "signal": signal})
        if _channel is None:
            pytest.skip(f"{call}: kills are pool mode only: {POOL_ONLY}")
        self._fault("kill", call, rank, at, nth, optional, signal_=signal)

    def raise_in(
        self,
        *,
        rank: int,
        at: str,
        nth: int = 1,
        exc: BaseException | type[BaseException] | None = None,
        optional: bool = False,
    ) -> None:
        """Raise ``exc`` (default: ``RuntimeError("injected by ...")``) on ``rank`` instead of
        its ``nth`` ``at`` op."""
        __tracebackhide__ = True
        call = call_words("raise_in", {"rank": rank, "at": at, "nth": nth, "exc": exc})
        self._fault("raise_in", call, rank, at, nth, optional, exc=exc)

    def delay(
        self, *, rank: int, at: str, seconds: float, nth: int = 1, optional: bool = False
    ) -> None:
        """Sleep ``seconds`` on ``rank`` before its ``nth`` ``at`` op, then run it."""
        __tracebackhide__ = True
        call = call_words("delay", {"rank": rank, "at": at, "nth": nth, "seconds": seconds})
        self._fault("delay", call, rank, at, nth, optional, seconds=seconds)

    def hang(self, *, rank: int, at: str, nth: int = 1, optional: bool = False) -> None:
        """Block ``rank`` forever before its ``nth`` ``at`` op: the test's deadline ends it."""
        __tracebackhide__ = True
        call = call_words("hang", {"rank": rank, "at": at, "nth": nth})
        self._fault("hang", call, rank, at, nth, optional)

    def _fault(
        self, kind: str, call: str, rank: int, at: str, nth: int, optional: bool, **extra: Any
    ) -> None:
        """Arm one fault of ``kind`` (``extra``: its own argument, as make_fault takes it)."""
        __tracebackhide__ = True
        self._arm(
            make_fault(
                kind,
                self.world_size,
                rank=rank,
                at=at,
                nth=nth,
                optional=optional,
                call=call,
                **extra,
            )
        )

    #: The op names ``at=`` takes.
    ops = tuple(sorted(OPS))

    def _arm(self, fault: Fault) -> None:
        if fault.rank == self.rank:
            self.armed.append(fault)

    # -- the test's life -----------------------------------------------------------------------

    @classmethod
    @contextlib.contextmanager
    def for_test(cls, rank: int, world_size: int, item: Any) -> Iterator[Faults]:
        """Count from now, arm during the test, disarm after it; a fault armed on this rank
        that never fired (and is not optional) then fails the test."""
        faults = cls(rank, world_size, item)
        faults._enter()
        restore = faults._watch_call()
        try:
            yield faults
        finally:
            restore()
            faults._leave()
        missed = [f for f in faults.armed if not f.fired and not f.optional]
        if missed:
            text = "\n".join(never_fired(f, rank, faults.counts) for f in missed)
            pytest.fail(text, pytrace=False)

    def _watch_call(self) -> Callable[[], None]:
        """Note when the test's call phase starts and ends (``0.41 s into call``): the item's
        ``runtest`` is wrapped for this test only."""
        item = self.item
        own = "runtest" in vars(item)
        original = item.runtest

        def runtest() -> None:
            self.call_started = time.monotonic()
            try:
                original()
            finally:
                self.call_ended = time.monotonic()

        item.runtest = runtest

        def restore() -> None:
            if own:
                item.runtest = original
            else:
                with contextlib.suppress(AttributeError):
                    del item.runtest

        return restore

    def _enter(self) -> None:
        self.mode = _mode_class()(self)
        self.mode.__enter__()

    def _leave(self) -> None:
        mode, self.mode = self.mode, None
        if mode is not None:
            with contextlib.suppress(Exception):
                mode.__exit__(None, None, None)

    def _phase(self) -> tuple[str, float]:
        now = time.monotonic()
        if self.call_started is None:
            return "setup", now - self.started
        if self.call_ended is None:
            return "call", now - self.call_started
        return "teardown", now - self.call_ended

    # -- the dispatch mode's side --------------------------------------------------------------

    def before(self, op: str, args: tuple[Any, ...]) -> None:
        """The rank is about to run ``op`` (a user op name): count it, fire what is due."""
        key, words = _group_of(args)
        with self._lock:
            nth, number = self.counts.note(key, op, words)
            due = [f for f in self.armed if not f.fired and f.at == op and f.nth == nth]
            for fault in due:
                fault.fired = True
        for fault in due:
            self._fire(fault, nth, number, words)

    def _fire(self, fault: Fault, nth: int, number: int, words: str) -> None:
        when, seconds = self._phase()
        line = fired_line(fault, self.rank, nth, number, words, seconds, when)
        kill = fault.kind == "kill"
        if _channel is not None:
            _channel(-fault.signal if kill else None, fault.call if kill else "", line, when)
        else:
            self.item.add_report_section(when, SECTION_KEY, line)
        if kill:
            _die(fault.signal, line)
        elif fault.kind == "raise_in":
            assert fault.exc is not None
            raise fault.exc
        elif fault.kind == "delay":
            time.sleep(fault.seconds)
        else:
            while True:  # hang: the test's deadline (or a proven deadlock) ends it
                time.sleep(3600)


def _die(signum: int, line: str) -> None:
    """End this rank by ``signum``, as the fault says, after a word in its log."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(2, f"{line}\n".encode())
    if signum != signal.SIGKILL and signal.getsignal(signum) not in (signal.SIG_DFL, None):
        with contextlib.suppress(ValueError, OSError):  # a handler of the test's: not this time
            signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    time.sleep(5)  # a signal that does not end a process (SIGCHLD, SIGURG): end it anyway
    os._exit(128 + signum)


def _group_of(args: tuple[Any, ...]) -> tuple[str, str]:
    """The op's process group: its name (the counting key) and its words."""
    import torch
    import torch.distributed as dist

    from .groupstate import group_words

    for arg in args:
        if isinstance(arg, torch.ScriptObject):
            try:  # a c10d op's group, boxed (ProcessGroup.unbox: torch's own binding)
                pg = dist.ProcessGroup.unbox(arg)
            except Exception:
                continue
            return str(pg.group_name), group_words(pg)
    names = [a for a in args if isinstance(a, str)]
    if names:  # a functional collective names its group last
        name = names[-1]
        try:
            pg = dist.distributed_c10d._resolve_process_group(name)
        except Exception:
            return name, f"group {name!r}"
        return str(pg.group_name), group_words(pg)
    return "?", "an unknown group"


_MODE: type | None = None


def _mode_class() -> type:
    """The dispatch mode's class, made at the first test that takes ``faults`` (imports torch)."""
    global _MODE
    if _MODE is not None:
        return _MODE
    from torch.utils._python_dispatch import TorchDispatchMode

    class FaultInjectionMode(TorchDispatchMode):  # type: ignore[misc]
        """Sees every op of the rank while a test holds the ``faults`` fixture."""

        def __init__(self, faults: Faults) -> None:
            super().__init__()
            self.faults = faults

        def __torch_dispatch__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: dict[str, Any] | None = None,
        ) -> Any:
            op = USER_NAME.get(func.name()) if func.namespace[0] in "c_" else None
            if op is not None:
                self.faults.before(op, args)
            return func(*args, **(kwargs or {}))

    assert FaultInjectionMode.__name__ == MODE_NAME
    _MODE = FaultInjectionMode
    return _MODE
