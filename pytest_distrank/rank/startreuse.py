"""A test's start snapshot taken from the previous test's end, where nothing could have run
between the two but the rank's own code.

Runs in pool-mode rank processes (:mod:`rank.leftovers` asks :class:`StartReuse` at every test's
start and end). The leftover check compares a test's end with its start; after a test that left
nothing, the end's snapshot is the next start's unless code outside the plugin ran between them,
and changed a category that is not read again (a logger, a torch flag, a signal handler would
then be named on the next test, which did not change it). What can run between two tests, and
the mark that says it did not:

- the previous test's reporting, its ``pytest_runtest_logfinish`` and protocol wrappers, and a
  conftest's or another plugin's implementations of them: the rank's caller allows the reuse only
  where every implementation is known (:mod:`pool.worker.leanphases`) and the test did not fail;
- fixtures torn down before the next test (``teardown_left``, a finalizer): the caller says so;
- a ``pytest_runtest_teardown`` wrapper outside the leftover check's (a ``conftest.py`` loaded
  during collection registers after the check): the same reading allows the reuse only where the
  check's wrapper is the first teardown implementation called;
- a Python thread other than the main thread and the plugin's own (``distrank-*``), a Python
  signal handler other than pytest's ``SIGINT`` one, a trace or profile function, a garbage
  collector callback: any of them may run at any moment, so none may exist
  (:func:`quiet_between`, read on the end's snapshot and at the start).

The categories the rank's own code changes between tests, and the cheap ones, are read again at
the reused start (:data:`FRESH`): the environment (the plugin's variables), the working folder,
threads and process groups (the plugin destroys a test's groups after it), torch.compile's
counters, child processes (a fingerprint read); the sockets too where the pool makes a fresh
rendezvous store for every test. ``DISTRANK_LEAN_PHASES=0`` turns the reuse off with the lean
phases.
"""

from __future__ import annotations

import gc
import signal
import sys
from collections.abc import Iterable
from typing import Any

from .snapshot import Snapshot

#: Categories read again at a reused start.
FRESH = ("env", "cwd", "threads", "groups", "compiled", "children")
#: The prefix of the plugin's own Python threads in a rank (its parent's watch, its flight
#: recorder's responder): they change no state a snapshot reads.
OWN_THREADS = "distrank-"


def quiet_between(
    threads: Iterable[Any], handlers: Iterable[Any], tracing: bool, gc_callbacks: int
) -> bool:
    """Whether no code outside the plugin can run on its own between two tests: only the main
    thread and the plugin's own, no Python signal handler but pytest's ``SIGINT`` one (the
    default and ignored dispositions, and C handlers, run no Python), no trace or profile
    function, no garbage collector callback."""
    return (
        not tracing
        and gc_callbacks == 0
        and all(
            t is not None and (t.name == "MainThread" or t.name.startswith(OWN_THREADS))
            for t in threads
        )
        and all(not callable(h) or h is signal.default_int_handler for h in handlers)
    )


def quiet_now(snapshot: Snapshot) -> bool:
    """:func:`quiet_between` for this process, its threads and handlers as ``snapshot`` read."""
    tracing = sys.gettrace() is not None or sys.getprofile() is not None
    return quiet_between(
        snapshot.threads.values(), snapshot.signals.values(), tracing, len(gc.callbacks)
    )


class StartReuse:
    """The end snapshot of the last test, kept while it may stand for the next start."""

    def __init__(self) -> None:
        self.kept: Snapshot | None = None
        #: Starts taken from the previous end, and starts read in full (the rank's numbers).
        self.reused = 0
        self.taken = 0

    def keep(self, end: Snapshot | None) -> None:
        """After a test's teardown: ``end`` when it found nothing at all (None otherwise)."""
        self.kept = end if end is not None and quiet_now(end) else None

    def forget(self) -> None:
        """Code outside the plugin ran since (a fixture torn down between tests)."""
        self.kept = None

    def start(self, allowed: bool, sockets: bool) -> Snapshot:
        """The next test's start: the kept end with :data:`FRESH` read again (and the sockets,
        with ``sockets``) where ``allowed`` and nothing was started since, else read in full."""
        kept, self.kept = self.kept, None
        if kept is not None and allowed:
            kept.refresh((*FRESH, "sockets") if sockets else FRESH)
            if quiet_now(kept):  # the threads read again: none started since
                self.reused += 1
                return kept
        self.taken += 1
        return Snapshot.take()
