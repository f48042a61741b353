"""PyTorch's own distributed test harness, ``torch.testing._internal.common_distributed``: the
private methods and tables of ``MultiProcessTestCase`` and ``MultiProcContinuousTest`` that pool
mode calls to run their tests on warm pools.

Runs in pool mode's controller (which classes to take, at what world size: :mod:`pool.suites`) and
in its ranks (a test run as the harness's child would run it: :mod:`pool.worker.suiterank`,
:mod:`pool.worker.suiteclass`); through :mod:`pytest_distrank._compat`. The harness is never
imported here: a test file that uses it did. Each function says what breaks if the harness
renames what it reads.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Collection, Mapping
from typing import Any, Literal

#: The harness's module: its classes are found in ``sys.modules`` under this name.
HARNESS_MODULE = "torch.testing._internal.common_distributed"
#: The harness's ways to start the test's processes (``_fork_processes``: torch before 2.9, or
#: a class's own), turned off in a rank: the pool's ranks are the test's processes.
HARNESS_SPAWNERS = ("_spawn_processes", "_start_processes", "_fork_processes")


def harness_module() -> Any | None:
    """The harness's module, when the test files imported it (never imported here)."""
    return sys.modules.get(HARNESS_MODULE)


def harness_kind(cls: type, module: Any) -> Literal["spawn", "continuous"] | None:
    """Which of the harness's classes ``cls`` is and whether it spawns its own ranks:
    ``spawn`` (a ``MultiProcessTestCase`` whose ``join_or_run`` is the harness's own),
    ``continuous`` (a ``MultiProcContinuousTest`` whose ``_ensure_processes_spawned`` is), or
    None. If those are renamed, no class is taken over: its own harness runs it."""
    import inspect

    spawn, continuous = module.MultiProcessTestCase, module.MultiProcContinuousTest
    if issubclass(cls, spawn):
        # A subclass that runs the test in place (LocalDTensorTestBase) does not spawn.
        own = inspect.getattr_static(cls, "join_or_run", None)
        return "spawn" if own is inspect.getattr_static(spawn, "join_or_run") else None
    if issubclass(cls, continuous):
        # LocalDTensorContinuousTestBase fakes its group in the process itself.
        own = inspect.getattr_static(cls, "_ensure_processes_spawned", None)
        base = inspect.getattr_static(continuous, "_ensure_processes_spawned")
        return "continuous" if own is base else None
    return None


def harness_world_size(cls: Any, module: Any) -> int:
    """A ``MultiProcContinuousTest`` class's world size, as its ``_ensure_processes_spawned``
    reads it (``_get_world_size(device_type)``); raises ``unittest.SkipTest`` where that would
    skip before spawning (its backend is not built in). If renamed, the class's tests error with
    the exception (reading the world size failed)."""
    import unittest

    size = int(cls._get_world_size(_device_type(cls)))
    backend = cls.backend_str() if callable(cls.backend_str) else cls.backend_str
    available = getattr(module.c10d, f"is_{backend}_available", None) if backend else None
    if available is not None and not available():
        raise unittest.SkipTest(f"Backend '{backend}' is not available")
    return size


def _device_type(cls: Any) -> str:
    """``MultiProcContinuousTest._ensure_processes_spawned``'s reading of the device type (a
    classmethod, a property read on the class, a callable or a string)."""
    attr = cls.__dict__.get("device_type", cls.device_type)
    if isinstance(attr, classmethod):
        return str(attr.__func__(cls))
    if isinstance(attr, property) and attr.fget is not None:
        return str(attr.fget(cls))
    if callable(attr):
        return str(attr())
    return str(attr)


def harness_init_group(cls: Any, rank: int, world_size: int, rendezvous_file: str) -> None:
    """A continuous class's own ``_init_pg``, as the harness's worker loop calls it once; if
    renamed, every test of such a class errors with AttributeError."""
    cls._init_pg(rank, world_size, rendezvous_file)


def harness_run_continuous(cls: Any, test_id: str) -> None:
    """One test of a continuous class, as its worker runs it (``_run_test_given_id``); if
    renamed, every test of such a class errors with AttributeError."""
    cls._run_test_given_id(test_id)


def harness_run_spawned(
    cls: Any, rank: int, name: str, file_name: str, conn: Any, fake_pg: bool
) -> None:
    """One test of a ``MultiProcessTestCase`` class, as its spawned child runs it (``_run``);
    if its signature changes, every test of such a class errors."""
    cls._run(rank, name, file_name, conn, fake_pg=fake_pg)


def harness_error_code() -> int:
    """The exit code of a child whose test raised (``TEST_ERROR_EXIT_CODE``)."""
    return int(sys.modules[HARNESS_MODULE].MultiProcessTestCase.TEST_ERROR_EXIT_CODE)


def harness_skip_message(code: object) -> str | None:
    """The message of the harness's skip exit code ``code`` (``TEST_SKIPS``), or None."""
    for skip in sys.modules[HARNESS_MODULE].TEST_SKIPS.values():
        if skip.exit_code == code:
            return str(skip.message)
    return None


def harness_generic_skip_code() -> int:
    """The exit code of a child that raised ``unittest.SkipTest`` (``TEST_SKIPS["generic"]``)."""
    return int(sys.modules[HARNESS_MODULE].TEST_SKIPS["generic"].exit_code)


def harness_return_code_rules(parent: Any) -> tuple[Collection[Any], Mapping[Any, int]]:
    """The parent instance's rules for its children's exit codes, after its ``setUp``: the test
    functions whose codes are not checked (``skip_return_code_checks``) and those expected to
    exit with another code (``special_return_code_checks``); empty where it has none."""
    return (
        getattr(parent, "skip_return_code_checks", ()),
        getattr(parent, "special_return_code_checks", {}),
    )


def harness_no_spawning(parent: Any) -> list[str]:
    """Turn off the spawners ``parent`` has (:data:`HARNESS_SPAWNERS`; one it lacks fails as
    under the harness); the returned list fills with the start method of each one ``setUp``
    then calls. If the harness starts its children another way, they start beside the ranks."""
    started: list[str] = []

    def stub(name: str) -> Any:
        def no_spawn(*args: object, **kwargs: object) -> None:
            started.append(_start_method(name, args, kwargs))

        return no_spawn

    for name in HARNESS_SPAWNERS:
        if hasattr(parent, name):
            setattr(parent, name, stub(name))
    return started


def _start_method(spawner: str, args: tuple[object, ...], kwargs: dict[str, object]) -> str:
    """How the harness's ``spawner`` would have started the children: ``fork``, ``spawn``...
    (a multiprocessing context's Process class keeps it in ``_start_method``)."""
    if spawner == "_fork_processes":
        return "fork"
    if spawner == "_spawn_processes":
        return "spawn"
    proc = args[0] if args else kwargs.get("proc")  # _start_processes(proc): a Process class
    method = getattr(proc, "_start_method", None)  # None: the default context's
    if method is None:
        method = multiprocessing.get_start_method(allow_none=True)
    return str(method or multiprocessing.get_all_start_methods()[0])
