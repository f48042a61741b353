"""How the end of the session reaches the distributed test in flight: a signal, or
pytest-timeout's ``--session-timeout``.

Runs in the controller (pool mode). A CI system cancels a job with SIGTERM or SIGINT (GitHub
Actions: SIGINT, SIGTERM 7.5 s later, a kill 2.5 s after that); a job's time limit is often a
``--session-timeout``. Either way the test that was running is the one a person needs to see:

- SIGTERM and SIGHUP raise a ``KeyboardInterrupt`` (:func:`signal_interrupt`, as Ctrl-C's), which
  :class:`attempt.Attempt` takes while it waits for the ranks: the test ends as a deadline would
  end it (every rank's stack, the collective verdict, the pool killed), reported as failed
  ("interrupted in call by SIGTERM after 12.4 s"), and the controller re-raises the interrupt
  once the reports are logged, so pytest stops as it stops on Ctrl-C (exit code 2, junit
  written). Its ranks were killed before their teardown: a teardown report says so
  (:func:`with_teardown`), so that every report plugin ends the test's row (pytest-html writes a
  row at the teardown report, pytest-reportlog logs every phase). A second signal while the
  stacks are taken raises again and ends at once.
- pytest-timeout stops a session only after a test returns, never inside one: a distributed
  test's deadline is capped at the session time left (:func:`session_capped`), so a hung test
  ends with its stacks when the session's time is up.
"""

from __future__ import annotations

import re
import signal
import time

import pytest
from pytest import TestReport

from ...outcome.endgame import effective_timeout
from ...outcome.reports import passed_report
from ...settings import Value

#: The shortest deadline a test gets when the session's time is (nearly) up.
MIN_LEFT = 0.1


#: What the controller's SIGTERM and SIGHUP handler raises: a ``KeyboardInterrupt`` (pytest
#: prints it as it prints Ctrl-C's) saying which signal.
_GOT = re.compile(r"^pytest-distrank: got (SIG[A-Z]+)$")


def signal_interrupt(signum: int) -> KeyboardInterrupt:
    """SIGTERM or SIGHUP to the controller, handled as Ctrl-C, naming the signal."""
    return KeyboardInterrupt(f"pytest-distrank: got {signal.Signals(signum).name}")


def interrupt_signal(exc: BaseException) -> str:
    """Which signal an interrupt came from: "SIGTERM", "SIGHUP", or "SIGINT" (Ctrl-C)."""
    found = _GOT.match(str(exc))
    return found.group(1) if found else "SIGINT"


def with_teardown(reports: list[TestReport], exc: BaseException) -> list[TestReport]:
    """The merged reports of a test the interrupt ``exc`` ended, with a teardown report when
    its ranks sent none (they were killed first): passed, saying the teardown did not run."""
    if not reports or any(r.when == "teardown" for r in reports):
        return reports
    last = reports[-1]
    why = (
        f"teardown not run: {interrupt_signal(exc)} interrupted the session, its ranks were killed"
    )
    teardown = passed_report(
        last.nodeid,
        last.location,
        "teardown",
        keywords=last.keywords,
        sections=[("distrank", why)],
        start=last.stop,
        stop=last.stop,
    )
    return [*reports, teardown]


def _session_expire(config: pytest.Config) -> float:
    """When pytest-timeout's ``--session-timeout`` expires (``time.time()``), 0 for never
    (pytest-timeout 2.3 and later: older ones have no session timeout)."""
    try:
        from pytest_timeout import SESSION_EXPIRE_KEY  # type: ignore[import-untyped]
    except ImportError:
        return 0.0
    return float(config.stash.get(SESSION_EXPIRE_KEY, 0.0) or 0.0)


def session_capped(config: pytest.Config, timeout: Value[float]) -> Value[float]:
    """A distributed test's deadline, cut to the session time ``--session-timeout`` leaves."""
    expire = _session_expire(config)
    if not expire:
        return timeout
    left = expire - time.time()
    seconds = effective_timeout(timeout.value)
    if seconds is not None and seconds <= left:
        return timeout
    left = round(max(left, MIN_LEFT), 1)
    return Value(left, f"--session-timeout ({left:g} s of the session left)")


def take_signals() -> list[signal.Signals]:
    """SIGTERM and SIGHUP (a CI cancel, a closed terminal or ssh session) end the session like
    Ctrl-C: the test in flight reported, interrupted summary, every pool stopped, what the tests
    started killed. A signal someone ignores (``nohup``) or handles stays theirs. Returns the
    signals taken (given back at unconfigure)."""

    def on_signal(signum: int, frame: object) -> None:
        raise signal_interrupt(signum)

    taken = []
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, on_signal)
            taken.append(signum)
    return taken
