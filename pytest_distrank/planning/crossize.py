"""Fixtures at another world size: ``pytest_distrank.fixture(world_size=N)``.

Runs in the controller and in every rank process of pool mode (both import the modules and
``conftest.py`` files where the decorator runs, and both must build the same producer items),
and in every rank of a launched world (whose rank 0 skips the tests that request one). Imports
no torch and nothing of either mode: the controller side that runs a producer is
:mod:`pytest_distrank.pool.crossize`, which registers itself under :data:`RUNNER`.

A *producer* is a function that runs on ``world_size`` ranks and writes files into its folder
(the ``fixture_path`` fixture). The decorator registers a session-scoped fixture of the
function's name; a test of any world size (or an ordinary test) that requests it gets that
folder, as a ``pathlib.Path``, once the producer ran. The producer runs as a pytest item of its
own, built here from the function under the module of the first test that requests it
(:func:`producer_item`; node id ``<module>::<name>[distrank-fixture]``): in the controller when
it is needed, in the ranks at collection (:class:`ProducerItems`), so both sides agree on it and
pytest resolves its fixtures in the ranks as for any test.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pytest

from .. import _compat
from ..outcome.records import RunTest
from ..parsing import parse_backend

#: The fixture a producer takes to reach its folder (the same folder on every rank).
OUTPUT_FIXTURE = "fixture_path"
#: The tail of a producer item's name: ``test_x.py::sharded_ckpt[distrank-fixture]``.
ITEM_SUFFIX = "[distrank-fixture]"
#: The attribute of a registered fixture's function that holds its :class:`Producer`.
PRODUCER_ATTR = "_distrank_producer"


@dataclasses.dataclass(eq=False)
class Producer:
    """One function decorated with ``pytest_distrank.fixture``; compared by identity."""

    name: str
    func: Callable[..., Any]
    #: As given: checked by :meth:`problem` when a test requests it, not at import, so that a
    #: bad value errors the tests that request it and nothing else.
    world_size: Any
    backend: Any = None

    @property
    def key(self) -> str:
        """Its identity across processes (controller, ranks, xdist workers): where it is defined
        (the file too: two folders' ``conftest.py`` may both import as ``conftest``)."""
        code = getattr(self.func, "__code__", None)
        where = code.co_filename if code is not None else self.func.__module__
        return f"{where}:{self.func.__module__}.{self.func.__qualname__}"

    @property
    def folder_name(self) -> str:
        digest = hashlib.sha256(self.key.encode()).hexdigest()[:8]
        return f"{self.name}-{digest}"

    def describe(self) -> str:
        return f"fixture {self.name!r} (world size {self.world_size!r})"

    def decorator(self) -> str:
        backend = f", backend={self.backend!r}" if self.backend is not None else ""
        return f"pytest_distrank.fixture(world_size={self.world_size!r}{backend})"

    def problem(self) -> str | None:
        """Why the arguments cannot be honoured on any machine, or None."""
        size = self.world_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            return (
                f"fixture {self.name!r}: {self.decorator()}: world size {size!r} is not a "
                "positive integer; write e.g. pytest_distrank.fixture(world_size=4)."
            )
        if self.backend is not None:
            if not isinstance(self.backend, str):
                return f"fixture {self.name!r}: {self.decorator()}: backend must be a string."
            try:
                parse_backend(self.backend)
            except ValueError as exc:
                return f"fixture {self.name!r}: {self.decorator()}: unknown backend: {exc}."
        return None


def fixture(
    func: Callable[..., Any] | None = None, *, world_size: Any = None, backend: Any = None
) -> Callable[[Callable[..., Any]], Any]:
    """Make ``func`` a fixture that runs once on ``world_size`` ranks of its own and yields the
    folder it wrote, to tests of any world size (docs/fixtures.md, "Fixtures at another world
    size").

    ``func`` takes fixtures as a test does (``rank``, ``world_size``, ``pg``, ``device``, ...)
    and ``fixture_path``, its folder (the same on every rank), and returns nothing. A test that
    requests the fixture by ``func``'s name receives that folder as a ``pathlib.Path``.
    ``backend``: the process group backend of its ranks (default: ``--distrank-backend``).
    """
    if func is not None or world_size is None:
        raise TypeError(
            "pytest_distrank.fixture takes its world size by keyword: write "
            "@pytest_distrank.fixture(world_size=4) above the function."
        )

    def wrap(fn: Callable[..., Any]) -> Any:
        producer = Producer(fn.__name__, fn, world_size, backend)

        def folder(request: pytest.FixtureRequest) -> Path:
            return fixture_value(request, producer)

        folder.__name__ = folder.__qualname__ = fn.__name__
        folder.__doc__ = fn.__doc__
        setattr(folder, PRODUCER_ATTR, producer)
        return pytest.fixture(scope="session", name=fn.__name__)(folder)

    return wrap


class Runner(Protocol):
    """The controller's side (pool/crossize.py): runs a producer for an ordinary test."""

    def value(self, producer: Producer, item: pytest.Item) -> Path: ...


#: The controller's :class:`Runner`; absent in ranks and in launched worlds.
RUNNER = pytest.StashKey[Runner]()


class InRank(Protocol):
    """What this module reads of a rank's context (``rank.context.RankContext``): its test."""

    @property
    def test(self) -> RunTest: ...


#: Where a rank process of either mode keeps its context; absent outside ranks. Defined here, below
#: ``rank/`` (planning imports nothing of it): ``rank.context.RANK_CONTEXT`` is this key, typed
#: as the whole context.
RANK_CONTEXT = pytest.StashKey[InRank]()
#: On a producer item: its producer.
PRODUCER_KEY = pytest.StashKey[Producer]()


def not_prepared_message(producer: Producer, nodeid: str) -> str:
    return (
        f"{nodeid}: {producer.describe()} was not prepared for this test. The controller runs "
        "it before each test that takes it as an argument, directly or through another "
        "fixture; request.getfixturevalue() comes too late for that, and launcher mode (pytest "
        "inside torchrun) runs no fixture at another world size. Take it as an argument."
    )


def fixture_value(request: pytest.FixtureRequest, producer: Producer) -> Path:
    """The registered fixture's value: in a rank, the folder the controller sent with the test;
    in the controller (an ordinary test), the runner's, which runs the producer first."""
    item = _compat.request_item(request)
    ctx = request.config.stash.get(RANK_CONTEXT, None)
    if ctx is not None:
        folder = dict(ctx.test.fixtures).get(producer.key)
        if folder is None:
            pytest.fail(not_prepared_message(producer, item.nodeid), pytrace=False)
        return Path(folder)
    runner = request.config.stash.get(RUNNER, None)
    if runner is None:
        pytest.fail(not_prepared_message(producer, item.nodeid), pytrace=False)
    return runner.value(producer, item)


@pytest.fixture
def fixture_path(request: pytest.FixtureRequest) -> Path:
    """Inside a ``pytest_distrank.fixture`` function: the folder it writes, the same on every
    rank; the tests that request the fixture receive this folder."""
    item = _compat.request_item(request)
    ctx = request.config.stash.get(RANK_CONTEXT, None)
    if PRODUCER_KEY not in item.stash or ctx is None:
        pytest.fail(
            f"{item.nodeid} uses the fixture {OUTPUT_FIXTURE!r}, which exists only in a function "
            "decorated with @pytest_distrank.fixture(world_size=N): the folder that function "
            "writes. A test that requests that fixture receives the folder as its value.",
            pytrace=False,
        )
    path = Path(ctx.test.shared_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def producers_of(item: pytest.Item) -> list[Producer]:
    """The producers an item requests, directly or through other fixtures, in closure order."""
    info = _compat.fixture_info(item)
    if info is None:
        return []
    found: list[Producer] = []
    for name in info.names_closure:
        defs = info.name2fixturedefs.get(name)
        producer = getattr(defs[-1].func, PRODUCER_ATTR, None) if defs else None
        if isinstance(producer, Producer) and producer not in found:
            found.append(producer)
    return found


def producer_item(module: pytest.Module, producer: Producer) -> pytest.Function:
    """The producer as a pytest item under ``module``: built alike in the controller and ranks."""
    item = pytest.Function.from_parent(
        module, name=f"{producer.name}{ITEM_SUFFIX}", callobj=producer.func
    )
    item.stash[PRODUCER_KEY] = producer
    return item


class ProducerItems:
    """Pool ranks: add every producer item a collected test may need to the session's items.

    One item per module and producer that a test of the module requests (producers requested by
    producers too), so that the item the controller builds for the first test that needs one is
    collected in the ranks whatever that test is. Never run unless the controller sends it.
    """

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        made: set[tuple[str, str]] = set()
        todo = list(items)
        while todo:
            item = todo.pop()
            module = item.getparent(pytest.Module)
            if module is None:
                continue
            for producer in producers_of(item):
                if (module.nodeid, producer.key) in made:
                    continue
                made.add((module.nodeid, producer.key))
                extra = producer_item(module, producer)
                items.append(extra)
                todo.append(extra)


def launcher_step(item: pytest.Item, world_size: int, launcher: str) -> tuple[str, str] | None:
    """Launcher mode: ``("error", why)`` or ``("skip", why)`` for a test that requests a
    producer, None for one that requests none.

    A launched world cannot start ranks of another size, and a producer runs once, on ranks of
    its own, before the tests (as in pool mode): tests that request one are skipped, saying
    whose size does not fit (or, at the launched size, that it runs in pool mode only).
    """
    for producer in producers_of(item):
        problem = producer.problem()
        if problem is not None:
            return "error", f"{item.nodeid}: {problem}"
    for producer in producers_of(item):
        ranks = "rank" if world_size == 1 else "ranks"
        if producer.world_size != world_size:
            return "skip", (
                f"{producer.describe()} needs world_size {producer.world_size}, this launched "
                f"world has {world_size} {ranks} ({launcher}); run it in pool mode (pytest "
                "without a launcher)"
            )
        return "skip", (
            f"{producer.describe()} runs on ranks of its own, in pool mode only (pytest "
            f"without a launcher); this launched world has {world_size} {ranks} ({launcher})"
        )
    return None
