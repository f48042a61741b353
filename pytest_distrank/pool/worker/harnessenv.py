"""Inside a pool rank: the environment a test of PyTorch's harness sees is its child's.

Runs in pool-mode rank processes only (:mod:`suiterank` wraps a harness class's ``setUp``, test
and ``tearDown`` in :func:`child_environment`). A rank's environment is the controller's plus
what the pool sets for plugin tests (torchrun's ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``, ``TORCHELASTIC_USE_AGENT_STORE`` ..., the rank's ``DISTRANK_*`` and its own
``PYTEST_XDIST_WORKER``). The harness's child has none of that: it has what its parent, the
pytest process, had when it spawned the child, plus what the child's code sets itself. Code
under test reads those variables (dcp's ``_ProcessGroupInitInfo`` finds a ``MASTER_PORT``; a
bare ``init_process_group("gloo")`` succeeds where the child raises ``ValueError``), so for the
length of a harness test the rank's environment is the controller's (:data:`CONTROLLER_ENV`),
with pytest's ``PYTEST_CURRENT_TEST``, which the parent had at spawn too. Afterwards the rank's
own environment comes back whole, unnamed: what the test set there was its child's.

The plugin's own traffic uses store objects made at the rank's start, not the environment, so
the pool's rendezvous keeps working. One variable stays, where Python code does not see it: the
pool's tag (:data:`~envvars.POOL_TAG_ENV`), put in the C-level environment only
(``os.putenv``), so that processes the test starts still carry it into their own environment and
the reaper finds them once their rank is gone. ``os.environ`` and ``os.getenv`` in the test do
not show it; a child process's ``os.environ`` does.

A ``MultiProcContinuousTest`` class's worker lives as long as its class: what it sets in one
test (``_init_pg``'s ``LOCAL_RANK``) it still has in the next (:class:`WorkerEnv`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from ...envvars import POOL_TAG_ENV
from ...options import WORLD_SIZE

#: The controller's environment, as the rank received it (:func:`remember`, at the rank's start).
CONTROLLER_ENV: dict[str, str] = {}
#: pytest's variable for the test in progress: the harness's parent has it when it spawns.
CURRENT_TEST = "PYTEST_CURRENT_TEST"


#: The pool's tag, as the rank's environment had it at its start (:func:`pool_tag`).
_TAG: list[str] = []


def remember(controller_env: dict[str, str]) -> None:
    """At the rank's start: the environment a harness's child inherits from its parent, and
    the pool's tag (which ``os.environ`` does not show during a harness test). What the pool
    received is the controller's environment plus its GPU lease (``CUDA_VISIBLE_DEVICES``, which
    stays: the child may use those GPUs only) and the default world size for its plugin tests
    (``DISTRANK_WORLD_SIZE``, which goes)."""
    CONTROLLER_ENV.clear()
    CONTROLLER_ENV.update(controller_env)
    CONTROLLER_ENV.pop(WORLD_SIZE.env, None)
    _TAG[:] = [os.environ.get(POOL_TAG_ENV, "")]


def pool_tag() -> str:
    """The pool's tag ("" if the rank has none), whatever the test did to its environment."""
    return _TAG[0] if _TAG else os.environ.get(POOL_TAG_ENV, "")


def _replace(env: dict[str, str]) -> None:
    """Make ``os.environ`` (and the C-level environment under it) exactly ``env``."""
    for name in [name for name in os.environ if name not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


@contextlib.contextmanager
def child_environment(start: dict[str, str] | None = None) -> Iterator[dict[str, str]]:
    """For a while, the environment of the harness's child: ``start`` (default: the
    controller's) plus pytest's current test; the rank's own afterwards. Yields the dict the
    child's environment is copied into when the block ends (a continuous worker keeps it)."""
    own = dict(os.environ)
    child = dict(CONTROLLER_ENV if start is None else start)
    if CURRENT_TEST in own:
        child[CURRENT_TEST] = own[CURRENT_TEST]
    left: dict[str, str] = {}
    _replace(child)
    tag = own.get(POOL_TAG_ENV)
    if tag and POOL_TAG_ENV not in child:
        os.putenv(POOL_TAG_ENV, tag)  # C level only: see the module's docstring
    try:
        yield left
    finally:
        left.update(os.environ)
        left.pop(CURRENT_TEST, None)
        _replace(own)


class WorkerEnv:
    """A continuous class's worker's environment, kept from one of its tests to the next."""

    def __init__(self) -> None:
        self.kept: dict[str, str] | None = None

    @contextlib.contextmanager
    def around(self) -> Iterator[None]:
        with child_environment(self.kept) as left:
            try:
                yield
            finally:
                self.kept = left

    def end(self) -> None:
        """The class's worker is gone: the next class's worker starts from the controller's."""
        self.kept = None
