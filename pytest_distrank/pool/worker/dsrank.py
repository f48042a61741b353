"""Inside a pool rank: run a test of DeepSpeed's ``DistributedTest`` the way its harness's pool
worker runs it.

Runs in pool-mode rank processes only (registered by :mod:`main`). DeepSpeed's harness
dispatches from its own ``conftest.py``: a ``pytest_runtest_call`` hook calls
``item.cls()(item._request)``, whose ``__call__`` gathers the test's fixture values, picks the
world size and launches processes (``_launch_with_file_store`` -> ``_launch_procs`` -> a
spawner: a ``multiprocessing`` pool, or spawned processes) in which ``_dist_run`` sets the rank's
variables, initialises the group (``deepspeed.init_distributed`` over a file store) and runs the
test. That conftest hook runs here as it is, in every rank. For the items :mod:`pool.suites`
took over (its ``DS_CASE`` key) :class:`DeepSpeedRunner` stands in, for the length of the call,
for what would start processes:

- the spawners run the child's part in place: ``_dist_run(rank, world size, MASTER_PORT, file
  store)``, with this rank's rank, the pool's ``MASTER_PORT`` and one file store in the test's
  shared folder (the same for every rank, new for every test); then, as the harness's
  ``_close_pool`` does in every worker, its ``_dist_destroy`` (a barrier, then the group's end).
  A test that raised leaves its group to the pool, which destroys it;
- the fixture values every rank runs the test with are rank 0's, as every child of the harness
  gets its parent's, pickled (one ``tmpdir`` for all ranks: a checkpoint one rank writes, the
  others read); values that do not pickle fail the test, as they fail the harness's pool;
- a skip inside the test (``pytest.skip``) skips it with its reason, as the harness's parent
  re-raises it; a failure is the test's own exception, with its own traceback;
- the parent's loop over the world sizes runs without its half-second sleep after each.

What the child's part sets in the environment (``RANK``, ``LOCAL_SIZE``, ``CUDA_VISIBLE_DEVICES``
and the rest of :data:`CHILD_ENV`) is the harness's, as a child's exit drops it: put back after
the test, unnamed. ``PYTEST_XDIST_WORKER`` is the controller's while the child's part runs (unset
without xdist), as a child inherits it from the pytest process. DeepSpeed's communication state
(``deepspeed.comm``'s backend, ``deepspeed.utils.groups``) is put back after every test as this
rank imported it, as a fresh child has it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from ... import _compat
from ...rank.context import RANK_CONTEXT, RankContext
from ..suites import DS_CASE

#: What the harness's child sets or drops in its environment (``_dist_run``,
#: ``set_accelerator_visible``): put back after each test.
CHILD_ENV = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_RANK",
    "RANK",
    "LOCAL_SIZE",
    "WORLD_SIZE",
    "NCCL_DEBUG",
    "CUDA_VISIBLE_DEVICES",
    "HABANA_VISIBLE_MODULES",
    "PYTEST_XDIST_WORKER",
)
#: Store key, under the test's prefix: rank 0's fixture values (pickled), or why they are not.
FIXTURES_KEY = "deepspeed-fixtures"
#: How long a rank waits for rank 0's fixture values.
PEER_WAIT = 60.0
#: The rank's worker id is ``<controller's>-pool<P>-rank<R>`` (pool/workerinput.py); the
#: controller's is ``distrank`` without xdist.
NO_XDIST = "distrank"


class DeepSpeedRunner:
    """The rank's runner of DeepSpeed ``DistributedTest`` tests (a pytest plugin of the rank's
    session)."""

    def __init__(self) -> None:
        #: DeepSpeed's communication state as this rank imported it (None: no such test here).
        self.fresh: dict[str, dict[str, Any]] | None = None

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if any(DS_CASE in item.stash for item in session.items):
            self.fresh = _compat.ds_state()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        size = item.stash.get(DS_CASE, None)
        cls = getattr(item, "cls", None)
        base = _compat.ds_harness_base(cls)
        if size is None or base is None or cls is None:
            return (yield)
        child = Child(item.config.stash[RANK_CONTEXT], size)
        stand_ins: dict[str, Callable[..., Any]] = {_compat.DS_LAUNCH: child.launcher()}
        for name in _compat.DS_SPAWNERS:
            stand_ins[name] = child.spawner(queue=name != _compat.DS_SPAWNERS[0])
        undo = _compat.ds_stand_in(cls, base, stand_ins)
        try:
            return (yield)
        finally:
            undo()
            if self.fresh is not None:
                _compat.ds_restore_state(self.fresh)


class Child:
    """The harness's launch for one test, in this rank: the rank is one of its processes."""

    def __init__(self, ctx: RankContext, size: int) -> None:
        self.ctx = ctx
        self.size = size
        assert ctx.test is not None
        self.shared = Path(ctx.test.shared_dir)

    def launcher(self) -> Callable[[Any, Any, Any], None]:
        """A stand-in for ``_launch_with_file_store``: each world size's launch, without the
        sleep after it."""

        def launch(test: Any, request: Any, world_size: Any) -> None:
            for size in [world_size] if isinstance(world_size, int) else list(world_size):
                _compat.ds_launch_procs(test, size, self.file_store(size))

        return launch

    def file_store(self, size: int) -> str:
        self.shared.mkdir(parents=True, exist_ok=True)
        return f"file://{self.shared / f'deepspeed-filestore-{size}'}"

    def spawner(self, queue: bool) -> Callable[[Any, int, str], None]:
        """A stand-in for ``_launch_daemonic_procs`` (``queue``: ``_launch_non_daemonic_procs``,
        whose child puts its skip message in a queue)."""

        def spawn(test: Any, num_procs: int, init_method: str) -> None:
            self.run(test, num_procs, queue)

        return spawn

    def run(self, test: Any, num_procs: int, queue: bool) -> None:
        if num_procs != self.ctx.world_size:
            pytest.fail(
                f"the test launched {num_procs} processes; its pool has {self.ctx.world_size} "
                f"ranks (the world size read before it ran was {self.size})",
                pytrace=False,
            )
        _compat.ds_set_fixture_kwargs(test, self.parents_fixtures(test))
        messages = _Messages() if queue else None
        port = os.environ.get("MASTER_PORT", "")
        with _child_environment():
            skip = _compat.ds_run_child(
                test, self.ctx.rank, num_procs, port, self.file_store(num_procs), messages
            )
            _compat.ds_destroy(test)  # _close_pool's end of every worker's group
        reason = messages.first() if messages is not None else skip
        if reason:
            raise _compat.skip_exception(str(reason))

    def parents_fixtures(self, test: Any) -> dict[str, Any]:
        """Rank 0's fixture values, as every child of the harness gets its parent's."""
        store = self.ctx.test_store()
        if self.ctx.rank == 0:
            values = _compat.ds_fixture_kwargs(test)
            try:
                data = b"v" + pickle.dumps(values)
            except Exception as exc:
                store.set(FIXTURES_KEY, b"e" + _unpicklable(exc).encode())
                raise
            store.set(FIXTURES_KEY, data)
            return values
        try:
            store.wait([FIXTURES_KEY], timedelta(seconds=PEER_WAIT))
        except Exception:
            raise RuntimeError(
                f"rank {self.ctx.rank} waited {PEER_WAIT:g} s for rank 0's fixture values (the "
                "harness's parent part, whose values every rank takes); rank 0 is stuck or gone"
            ) from None
        data = store.get(FIXTURES_KEY)
        if data[:1] == b"e":
            pytest.fail(data[1:].decode(), pytrace=False)
        return dict(pickle.loads(data[1:]))


def _unpicklable(exc: BaseException) -> str:
    return (
        f"the test's fixture values do not pickle on rank 0 ({type(exc).__name__}: {exc}); "
        "DeepSpeed's harness pickles them to its processes, and fails the same way"
    )


class _Messages:
    """The queue the spawned kind of child puts its skip message in."""

    def __init__(self) -> None:
        self.items: list[object] = []

    def put(self, item: object) -> None:
        self.items.append(item)

    def first(self) -> object:
        return self.items[0] if self.items else ""


@contextlib.contextmanager
def _child_environment() -> Iterator[None]:
    """The child's environment for a while: the controller's ``PYTEST_XDIST_WORKER``; what the
    child sets (:data:`CHILD_ENV`) is put back afterwards."""
    before = {name: os.environ.get(name) for name in CHILD_ENV}
    worker = before["PYTEST_XDIST_WORKER"]
    controller = worker.split("-pool")[0] if worker else NO_XDIST
    if controller == NO_XDIST:
        os.environ.pop("PYTEST_XDIST_WORKER", None)
    else:
        os.environ["PYTEST_XDIST_WORKER"] = controller
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
