"""Injected faults, the rank side: the ``faults`` fixture's object and its dispatch mode.

Runs in rank processes of both modes, only in tests that take the ``faults`` fixture: nothing
here runs, and no dispatch mode is entered, in any other test. The fixture (:mod:`fixtures`)
enters a :class:`TorchDispatchMode` at its setup and leaves it at its teardown, whatever
happened. The mode sees every ``c10d::`` op (``torch.distributed.*``, DDP's broadcasts and its
backward all-reduce) and every ``_c10d_functional::`` op (DTensor, tensor parallel), counts them
per group and per op (:mod:`faultplan`), and fires an armed fault just before the op it names
runs: the rank never enters that collective. It does not see inside ``torch.compile``d graphs.
The plugin's own collectives are not the test's and are not counted: those on the checks'
twin groups (:mod:`rank.ownedgroups`, known by their ``group_desc``) and every op while
``reference()`` runs (its one-rank world is then torch's default group, not the test's).

A fired fault is reported before it acts: in pool mode through the rank's pipe (the channel
the pool rank sets, :func:`rank.context.set_channel`), so that a killed rank is an expected exit
and its line reaches the test's report; in launcher mode as a section of the rank's own report
(kills are pool mode only there: torchrun's agent stops every worker when one dies).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .. import _compat
from ..outcome.expectations import POOL_ONLY
from ..rank import context
from ..rank.groupstate import FAULTS_MODE
from ..rank.ownedgroups import OWNED_DESC
from .faultplan import (
    OPS,
    USER_NAME,
    Fault,
    Group,
    Plan,
    Slot,
    call_words,
    fired_line,
    make_fault,
    never_fired,
)

#: The report section of a fired fault when there is no channel (launcher mode).
SECTION_KEY = "distrank injected fault"


class Faults:
    """What ``faults`` gives a test: arm a fault at a chosen collective, on one rank.

    Every rank makes the same calls; each checks them (a bad call fails the test on every rank)
    and the fault is armed on its ``rank`` only.
    """

    def __init__(self, rank: int, world_size: int, item: Any) -> None:
        self.rank = rank
        self.world_size = world_size
        self.item = item
        #: The faults armed on this rank, and the test's ops counted.
        self.plan = Plan()
        #: The test's default group (torch's ``group.WORLD``) when the fixture was set up:
        #: another one is ``reference()``'s one-rank world. None: none yet (the test makes it).
        self.world: Any = None
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
        if context.channel() is None:
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
            self.plan.armed.append(fault)

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
        missed = faults.plan.missed()
        if missed:
            text = "\n".join(never_fired(f, rank, faults.plan.counts) for f in missed)
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
        import torch.distributed as dist

        self.world = dist.group.WORLD if dist.is_available() else None
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
        group = _group_of(args, self._in_reference())
        with self._lock:
            slot, due = self.plan.see(op, group)
        for fault in due:
            assert slot is not None
            self._fire(fault, slot)

    def _in_reference(self) -> bool:
        """Whether ``reference()`` runs: torch's default group is then its one-rank world's,
        not the test's: the one it had when the fixture was set up, or one of its world size
        that it made (or made again) since. (At world size 1 a world made after the fixture's
        setup is taken for the test's only where it had none.)"""
        import torch.distributed as dist

        world = dist.group.WORLD
        if (
            world is not self.world
            and world is not None
            and world.size() == self.world_size
            and (self.world is None or self.world_size > 1)
        ):
            self.world = world  # the test made its world after the fixture's setup
        return world is not self.world

    def _fire(self, fault: Fault, slot: Slot) -> None:
        when, seconds = self._phase()
        line = fired_line(fault, self.rank, slot, seconds, when)
        kill = fault.kind == "kill"
        channel = context.channel()
        if channel is not None:
            channel(-fault.signal if kill else None, fault.call if kill else "", line, when)
        else:
            self.item.add_report_section(when, SECTION_KEY, line)
        if kill:
            _die(fault, line, when)
        elif fault.kind == "raise_in":
            assert fault.exc is not None
            raise fault.exc
        elif fault.kind == "delay":
            time.sleep(fault.seconds)
        else:
            while True:  # hang: the test's deadline (or a proven deadlock) ends it
                time.sleep(3600)


#: How long a kill waits for its signal to end the rank before it ends it by SIGKILL.
SIGNAL_WAIT_S = 2.0


def _die(fault: Fault, line: str, when: str) -> None:
    """End this rank by the fault's signal, after a word in its log.

    Whatever the rank or the test set for the signal is undone first, so that its default
    action (to end the process) is what happens: faulthandler's dump (a pool rank's SIGUSR1),
    a Python handler of the test's or an ignored disposition (SIGPIPE), a block (a pool rank
    keeps SIGUSR2 blocked: it is sent to this thread alone, unblocked here). Where the signal
    still does not end the rank (a handler, when the fault fires in a thread other than the
    main one: only the main thread may reset it), the rank says so and ends by SIGKILL,
    announced first as its expected exit: the kit never fails a test for the exit it
    produced.
    """
    signum = fault.signal
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(2, f"{line}\n".encode())
    if signum != signal.SIGKILL:
        with contextlib.suppress(Exception):
            faulthandler.unregister(signum)
        with contextlib.suppress(ValueError, OSError):  # ValueError: not the main thread
            signal.signal(signum, signal.SIG_DFL)
        with contextlib.suppress(OSError):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        signal.pthread_kill(threading.get_ident(), signum)
        time.sleep(SIGNAL_WAIT_S)
        name = signal.Signals(signum).name
        why = (
            f"{fault.call}: {name} did not end the rank within {SIGNAL_WAIT_S:g} s (a handler "
            "the kit cannot reset took it), so the kit ended it by SIGKILL"
        )
        channel = context.channel()
        if channel is not None:
            channel(-int(signal.SIGKILL), why, "", when)
        with contextlib.suppress(Exception):
            os.write(2, f"{why}\n".encode())
    os.kill(os.getpid(), signal.SIGKILL)


def _group_of(args: tuple[Any, ...], in_reference: bool) -> Group:
    """The op's process group: its name (the counting key), members, and whether it is one of
    the plugin's own (a twin of the checks across ranks; anything inside ``reference()``)."""
    import torch
    import torch.distributed as dist

    pg: Any = None
    name = "?"
    for arg in args:
        if isinstance(arg, torch.ScriptObject):
            try:  # a c10d op's group, boxed (ProcessGroup.unbox: torch's own binding)
                pg = dist.ProcessGroup.unbox(arg)
            except Exception:
                continue
            break
    else:
        names = [a for a in args if isinstance(a, str)]
        if names:  # a functional collective names its group last
            name = names[-1]
            pg = _compat.group_named(name)
    if pg is None:
        return Group(name, plugin=in_reference)
    try:
        members: tuple[int, ...] | None = tuple(dist.get_process_group_ranks(pg))
    except Exception:
        members = None
    twin = str(getattr(pg, "group_desc", "")) == OWNED_DESC
    return Group(
        str(pg.group_name),
        members,
        default=pg is dist.group.WORLD,
        plugin=in_reference or twin,
    )


_MODE: type | None = None


def _mode_class() -> type:
    """The dispatch mode's class, made at the first test that takes ``faults`` (imports torch)."""
    global _MODE
    if _MODE is not None:
        return _MODE
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    def see(
        mode: FaultInjectionMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None
    ) -> Any:
        op = USER_NAME.get(func.name()) if func.namespace[0] in "c_" else None
        if op is not None:
            mode.faults.before(op, args)
        return func(*args, **(kwargs or {}))

    unseen_by_dynamo = torch._disable_dynamo(see, recursive=True)

    class FaultInjectionMode(TorchDispatchMode):  # type: ignore[misc]
        """Sees every op of the rank while a test holds the ``faults`` fixture."""

        def __init__(self, faults: Faults) -> None:
            super().__init__()
            self.faults = faults

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            """Not torch's wrapper: its first call imports torch._dynamo (~2 s of CPU in each
            fresh rank, where fault tests kill ranks); Dynamo is kept out below, where it
            is imported, as that wrapper would."""
            return False

        def __torch_dispatch__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: dict[str, Any] | None = None,
        ) -> Any:
            if "torch._dynamo" in sys.modules:  # torch.compile may trace: not into this
                return unseen_by_dynamo(self, func, args, kwargs)
            return see(self, func, args, kwargs)

    assert FaultInjectionMode.__name__ == FAULTS_MODE
    _MODE = FaultInjectionMode
    return _MODE
