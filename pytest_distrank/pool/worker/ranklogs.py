"""pytest's log capture, minus its per-phase cost, for rank processes.

Runs in rank processes only (installed by the worker before the rank's pytest session starts).

pytest captures log records per test phase with ``_pytest.logging.catching_logs``: on every
enter it adds its handler to the root logger and to every non-propagating logger, and on exit
removes it again. ``import torch`` creates about 42 non-propagating loggers, so each phase of
each test paid about 170 ``addHandler``/``removeHandler`` calls, each under logging's lock: about
half of a rank's CPU time per trivial test (measured with ``DISTRANK_PROFILE_RANKS``).

:class:`RankCatchingLogs` does the same job with the same results. Every non-propagating logger
gets one :class:`_Relay` handler, once; the relay hands each record to the handlers that pytest
is capturing with at that moment, with the level check ``Logger.callHandlers`` would make. Entering
and leaving a phase then only changes which handlers are active. The root logger is handled as
pytest does it. A logger that later starts propagating is skipped by its relay (its records reach
the root). Finding the non-propagating loggers walks every logger of the process (~140 after
``import torch``: 17 us), so the walk is made once per test, before its setup (:func:`new_test`),
and again at a phase only when loggers were created since: a new logger gets its relay at the
next phase, as pytest would give it its handler; an existing logger turned non-propagating
during a test, or a relay a test removed (``logger.handlers.clear()``), is covered again from the
next test on.

A test of PyTorch's harness classes runs in a process without pytest (the harness's child), and
such tests look at loggers' handlers (``test_c10d_logger.py`` asserts c10d's logger has exactly
its ``NullHandler``). While one runs (:func:`out_of_sight`), neither pytest's handlers nor the
relays are in any logger's ``handlers``: every record reaches the capture handlers through a wrap
of ``logging.Logger.callHandlers`` instead, once per record, whatever logger it came from.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from types import TracebackType
from typing import Generic, TypeVar

from ... import _compat

_HandlerType = TypeVar("_HandlerType", bound=logging.Handler)


class _Relay(logging.Handler):
    """Attached once to one non-propagating logger; forwards to the active capture handlers."""

    def __init__(self, logger: logging.Logger, relays: _Relays) -> None:
        super().__init__(logging.NOTSET)
        self.logger = logger
        self.relays = relays

    def handle(self, record: logging.LogRecord) -> bool:
        if self.logger.propagate:
            return False  # its records reach the root logger, where capture sees them
        for handler in self.relays.active:
            if record.levelno >= handler.level:
                handler.handle(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:  # pragma: no cover - handle() overrides
        pass


class _Relays:
    """The relays of this process and the handlers pytest is capturing with right now."""

    def __init__(self) -> None:
        self.by_logger: dict[logging.Logger, _Relay] = {}
        #: Replaced, never mutated: a record logged from another thread sees a consistent tuple.
        self.active: tuple[logging.Handler, ...] = ()
        #: How many loggers the process had at the last walk (-1: never walked).
        self.walked = -1
        self.installed = False

    def cover_new_loggers(self) -> None:
        """Walk every logger: a relay on each non-propagating one."""
        root = logging.getLogger()
        self.walked = len(root.manager.loggerDict)
        for logger in list(root.manager.loggerDict.values()):
            if isinstance(logger, logging.Logger) and not logger.propagate and logger is not root:
                relay = self.by_logger.get(logger)
                if relay is None:
                    relay = self.by_logger[logger] = _Relay(logger, self)
                if relay not in logger.handlers:
                    # New, or a test removed it (logger.handlers.clear()): pytest would re-add
                    # its handler at the next phase, so the relay comes back too.
                    logger.addHandler(relay)

    def activate(self, handler: logging.Handler) -> bool:
        if handler in self.active:
            return False  # like addHandler: a handler is attached once
        self.active = (*self.active, handler)
        return True

    def deactivate(self, handler: logging.Handler) -> None:
        self.active = tuple(h for h in self.active if h is not handler)


RELAYS = _Relays()


class RankCatchingLogs(Generic[_HandlerType]):
    """Drop-in for ``_pytest.logging.catching_logs`` (same constructor, same effect)."""

    __slots__ = ("activated", "handler", "level", "orig_level")

    def __init__(self, handler: _HandlerType, level: int | None = None) -> None:
        self.handler = handler
        self.level = level
        self.activated = False
        self.orig_level = logging.NOTSET

    def __enter__(self) -> _HandlerType:
        root_logger = logging.getLogger()
        if self.level is not None:
            self.handler.setLevel(self.level)
        root_logger.addHandler(self.handler)
        if len(root_logger.manager.loggerDict) != RELAYS.walked:
            RELAYS.cover_new_loggers()  # loggers were created: the new ones get relays
        self.activated = RELAYS.activate(self.handler)
        if self.level is not None:
            self.orig_level = root_logger.level
            root_logger.setLevel(min(self.orig_level, self.level))
        return self.handler

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        root_logger = logging.getLogger()
        if self.level is not None:
            root_logger.setLevel(self.orig_level)
        root_logger.removeHandler(self.handler)
        if self.activated:
            RELAYS.deactivate(self.handler)
            self.activated = False


def install() -> bool:
    """Make pytest's logging plugin use :class:`RankCatchingLogs` in this process.

    Returns False (and changes nothing) if this pytest has no ``catching_logs`` to replace.
    """
    RELAYS.installed = _compat.replace_catching_logs(RankCatchingLogs)
    return RELAYS.installed


def new_test() -> None:
    """A test is about to start: walk every logger (see the module docstring)."""
    if RELAYS.installed:
        RELAYS.cover_new_loggers()


@contextlib.contextmanager
def out_of_sight() -> Iterator[None]:
    """For a while, capture without a handler in sight (see the module docstring): pytest's
    handlers leave the root logger and the relays their loggers, and a wrap of
    ``Logger.callHandlers`` hands each record to the capture handlers; all back afterwards."""
    if not RELAYS.installed:
        yield
        return
    root = logging.getLogger()
    ours = [handler for handler in root.handlers if handler in RELAYS.active]
    relayed = [(lg, relay) for lg, relay in RELAYS.by_logger.items() if relay in lg.handlers]
    for handler in ours:
        root.removeHandler(handler)
    for lg, relay in relayed:
        lg.removeHandler(relay)
    original = logging.Logger.callHandlers

    def call_handlers(self: logging.Logger, record: logging.LogRecord) -> None:
        original(self, record)
        for handler in RELAYS.active:
            if record.levelno >= handler.level:
                handler.handle(record)

    logging.Logger.callHandlers = call_handlers  # type: ignore[method-assign]
    try:
        yield
    finally:
        logging.Logger.callHandlers = original  # type: ignore[method-assign]
        for lg, relay in relayed:
            if relay not in lg.handlers:
                lg.addHandler(relay)
        for handler in ours:
            if handler not in root.handlers:
                root.addHandler(handler)
