"""A rank's hygiene around a test, in either mode: what earlier tests left, output, forks.

Runs in rank processes of both modes (:mod:`pool.worker.main` in a pool; :mod:`launch.plugin` and
:mod:`launch.session` in a launched world): fixtures the previous test left that this one does not
need, cutting huge output sections, and forks of the rank that a test left running its code.
pytest and the standard library only; the process groups' state is :mod:`groupstate`'s.
"""

from __future__ import annotations

import builtins
import importlib
import sys
import traceback
from collections.abc import Generator, Mapping, Sequence
from types import TracebackType
from typing import Any

import pytest

from .. import _compat
from .reaper import living_children

#: Captured output sections longer than this are cut to their head and tail before sending.
SECTION_LIMIT = 256 * 1024


def teardown_unneeded(item: pytest.Item) -> None:
    """Close modules and classes the previous test left set up that this one does not need,
    printing a teardown error to the rank's output (launcher mode; pool ranks report it:
    :class:`Leftovers`)."""
    error = teardown_left(item)
    if error is not None:
        print(
            f"pytest-distrank: error tearing down fixtures before {item.nodeid}:\n"
            + "".join(traceback.format_exception(error)),
            file=sys.stderr,
            flush=True,
        )


class LeftoverTeardownError(Exception):
    """Tearing down what an earlier test of this rank left set up failed, at the start of a
    later test that does not need it."""

    #: Named without its module on the report's crash line, as pytest names its ``Failed``.
    __module__ = "builtins"


def kept_by(chain: Sequence[str], nodeid: str) -> int:
    """How many nodes of ``chain`` (node ids, outermost first) the test ``nodeid`` lies in:
    the part of the chain that pytest keeps set up when ``nodeid`` comes next."""
    kept = 0
    for parent in chain:
        if parent and not nodeid.startswith((parent + "::", parent + "/")):
            break
        kept += 1
    return kept


def next_node(item: pytest.Item, items: Mapping[str, pytest.Item], nodeid: str | None) -> Any:
    """What ``item``'s teardown tears down for: the test ``nodeid`` if this rank collected it;
    else (an ordinary test, another pool's, a file this rank did not collect) the innermost
    node of ``item``'s chain that ``nodeid`` lies in, as pytest keeps exactly what the next
    item's chain holds (its teardown reads only ``nextitem.listchain()``); None: everything."""
    if not nodeid:
        return None
    found = items.get(nodeid)
    if found is not None:
        return found
    chain = item.listchain()
    return chain[max(1, kept_by([node.nodeid for node in chain], nodeid)) - 1]


def leftover_message(what: Sequence[str], previous: str, expected: str | None) -> str:
    """Whose fixtures failed to tear down at the start of a later test, and why only then."""
    head = f"tearing down {', '.join(what)} failed"
    if not previous:
        return head
    kept = f", kept for {expected}, which this rank was told came next" if expected else ""
    return (
        f"{head}: left set up after {previous}, this rank's previous test{kept}.\n"
        f"pytest reports this error at the teardown of {previous}; that test had already been "
        "reported, so the error is reported at the teardown of this one."
    )


def teardown_left(
    item: pytest.Item, previous: str = "", expected: str | None = None
) -> LeftoverTeardownError | None:
    """Tear down what earlier tests left set up that ``item`` does not need; its error, if any.

    A rank tears down after each test for the test it is told comes next (``RunTest``'s
    ``next_nodeid``). When another came (pytest-xdist picks each worker's next test as it goes; a
    test sent ahead before its successor was known), the rest is torn down here, before ``item``.
    ``previous``: the rank's test before ``item``; ``expected``: the one it tore down for.
    """
    needed = set(item.listchain())
    left = [node for node in _compat.setup_stack(item.session) if node not in needed]
    if not left:
        return None
    try:
        _compat.teardown_exact(item.session, item)
    except (KeyboardInterrupt, pytest.exit.Exception):
        raise
    except BaseException as exc:
        what = [str(getattr(node, "nodeid", node)) for node in reversed(left)]
        error = LeftoverTeardownError(leftover_message(what, previous, expected))
        error.__cause__ = exc.with_traceback(_outside_the_plugin(exc.__traceback__))
        return error
    return None


def _outside_the_plugin(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` from its first frame outside this package (the fixture's own, pytest's)."""
    start = tb
    while start is not None and str(start.tb_frame.f_globals.get("__name__")).startswith(
        "pytest_distrank."
    ):
        start = start.tb_next
    return start or tb


def _errors(*errors: BaseException) -> BaseException:
    """Several teardown errors as pytest raises them (``BaseExceptionGroup``; the backport that
    pytest depends on before Python 3.11)."""
    group: Any = getattr(builtins, "BaseExceptionGroup", None)
    if group is None:  # pragma: no cover - Python 3.10
        group = importlib.import_module("exceptiongroup").BaseExceptionGroup
    return group("errors during test teardown", list(errors))  # type: ignore[no-any-return]


class Leftovers:
    """Pool ranks: the error of :func:`teardown_left` is reported at the teardown of the test
    before which it was met, as a failed teardown (an error in pytest's words).

    Not of its setup: the test itself is fine, and runs on every rank as usual (a setup error on
    some ranks only would leave its peers waiting in its collectives), so it passes or fails as
    it would have, and the run counts the error once, as plain pytest-xdist does.
    """

    def __init__(self) -> None:
        self.error: LeftoverTeardownError | None = None
        self.previous = ""
        self.expected: str | None = None

    def before(self, item: pytest.Item, next_nodeid: str | None) -> None:
        """At the start of ``item``, torn down for ``next_nodeid`` after it."""
        self.error = teardown_left(item, self.previous, self.expected)
        self.previous, self.expected = item.nodeid, next_nodeid

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self) -> Generator[None, None, None]:
        __tracebackhide__ = True
        error, self.error = self.error, None
        if error is None:
            return (yield)
        try:
            yield
        except BaseException as exc:  # the test's own teardown failed too: both
            raise _errors(exc, error) from None
        raise error


def cap_section(content: str) -> str:
    """Keep the head and tail of a huge captured section (tens of MB help nobody)."""
    if len(content) <= SECTION_LIMIT:
        return content
    half = SECTION_LIMIT // 2
    cut = len(content) - 2 * half
    return f"{content[:half]}\n[... pytest-distrank cut {cut} characters ...]\n{content[-half:]}"


def stray_forks(pid: int) -> tuple[int, ...]:
    """Children of this rank that still run its own code (forked, not exec'd, not managed).

    A child of ``os.fork()`` that returns into pytest runs the rest of the test a second time.
    Children that ``exec``'d (subprocess) have another command line; multiprocessing's own
    children (DataLoader workers with the fork start method) are known to it and left alone.
    """
    import multiprocessing

    def cmdline(p: int | str) -> bytes:
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                return f.read()
        except OSError:
            return b""

    own = cmdline(pid)
    managed = {p.pid for p in multiprocessing.active_children()}
    found = [c for c in living_children(pid) if c not in managed and cmdline(c) == own]
    return tuple(sorted(found))
