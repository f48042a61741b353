"""DeepSpeed's own distributed test harness, ``DistributedTest`` (``tests/unit/common.py`` of
DeepSpeed's source tree, not of its package): the private methods and rules of its
``DistributedExec`` base that pool mode reads, calls or stands in for to run its tests on warm
pools.

Runs in pool mode's controller (which classes, at what world size: :mod:`pool.suites`) and in its
ranks (a test run as the harness's child runs it: :mod:`pool.worker.dsrank`); through
:mod:`pytest_distrank._compat`. Neither DeepSpeed nor its harness is imported here: the harness
is found through the test class, and DeepSpeed's modules in ``sys.modules``. Each function says
what breaks if the harness renames what it reads.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any

#: The harness's base class, found by name in a test class's MRO (its module is DeepSpeed's test
#: tree's own ``unit.common``, imported under whatever name the tests' rootdir gives it).
DS_EXEC = "DistributedExec"
#: The parent's ways to start the test's processes (a multiprocessing pool of daemonic workers,
#: or spawned processes): replaced in a rank, whose pool's ranks are the test's processes.
DS_SPAWNERS = ("_launch_daemonic_procs", "_launch_non_daemonic_procs")
#: What the spawners' child runs (the group's start, then the test), and the parent's loop over
#: the world sizes around the spawners (a file store each, then half a second's sleep).
DS_CHILD = "_dist_run"
DS_LAUNCH = "_launch_with_file_store"
#: DeepSpeed's modules whose globals hold its communication state (``cdb``, the backend over
#: torch.distributed; the groups of ``deepspeed.utils.groups``): a fresh child imports them as
#: they are after import; a warm rank gets them back so after every test.
DS_STATE_MODULES = ("deepspeed.comm.comm", "deepspeed.utils.groups")


def ds_harness_base(cls: object) -> type | None:
    """The harness's ``DistributedExec`` when ``cls`` is one of its test classes
    (``is_dist_test``, as DeepSpeed's conftest asks) whose base still has the methods pool mode
    stands in for; None otherwise. If those are renamed no class is taken over: the harness's
    own conftest hook runs its tests in the pytest process, as without pytest-distrank."""
    if not isinstance(cls, type) or getattr(cls, "is_dist_test", False) is not True:
        return None
    for base in cls.__mro__:
        if base.__name__ == DS_EXEC and all(
            name in vars(base) for name in (*DS_SPAWNERS, DS_CHILD, DS_LAUNCH)
        ):
            return base
    return None


def ds_requested_size(cls: Any, function: Any, params: Mapping[str, Any]) -> object:
    """What ``DistributedTest.__call__`` hands its launcher: the first ``world_size`` mark on
    the test function itself, else a ``world_size`` argument of the test (``params``: its
    parametrized values), else the class's ``world_size``. An int or a list of sizes; None where
    it cannot be known before the test runs (a ``world_size`` fixture)."""
    for mark in getattr(function, "pytestmark", []):
        if getattr(mark, "name", None) == "world_size":
            return mark.args[0] if mark.args else None
    try:
        arguments = inspect.getfullargspec(function).args
    except TypeError:
        arguments = []
    if "world_size" in arguments:
        return params.get("world_size")
    return cls().world_size


def ds_stand_in(cls: type, base: type, replacements: Mapping[str, Callable[..., Any]]) -> Any:
    """Put ``replacements`` (harness method name -> function) on ``cls`` where ``cls`` resolves
    that name to ``base``'s own (a class that overrides a launcher keeps its override, which
    calls the spawners in turn); returns the function that takes them off again."""
    put: list[str] = []
    for name, function in replacements.items():
        if inspect.getattr_static(cls, name, None) is vars(base).get(name):
            setattr(cls, name, function)
            put.append(name)

    def undo() -> None:
        for name in put:
            delattr(cls, name)

    return undo


def ds_fixture_kwargs(test: Any) -> dict[str, Any]:
    """The fixture values ``__call__`` gathered for the test (``_fixture_kwargs``), which the
    parent pickles to every child."""
    return dict(getattr(test, "_fixture_kwargs", {}))


def ds_set_fixture_kwargs(test: Any, values: dict[str, Any]) -> None:
    test._fixture_kwargs = values


def ds_run_child(test: Any, rank: int, size: int, port: str, init_method: str, msgs: Any) -> Any:
    """One child's part, as the harness's pool runs it: ``_dist_run(local_rank, num_procs,
    master_port, init_method[, skip queue])`` sets the rank's variables, initialises the group
    (``init_distributed``) and runs the test; it returns a skip message ("" for none), or puts
    it in ``msgs`` for the spawned kind. If its signature changes, every test errors."""
    if msgs is None:
        return getattr(test, DS_CHILD)(rank, size, port, init_method)
    return getattr(test, DS_CHILD)(rank, size, port, init_method, msgs)


def ds_launch_procs(test: Any, size: int, init_method: str) -> None:
    """The parent's launch of one world size (``_launch_procs``, which a class may override: it
    checks the device count, picks the start method and calls a spawner)."""
    test._launch_procs(size, init_method)


def ds_destroy(test: Any) -> None:
    """The harness's end of a child's group (``_dist_destroy``: a barrier, then
    ``deepspeed.comm.destroy_process_group``), as its ``_close_pool`` runs it in every worker."""
    test._dist_destroy()


def ds_state() -> dict[str, dict[str, Any]]:
    """DeepSpeed's communication state as it is now (:data:`DS_STATE_MODULES`, those imported):
    each module's plain globals (None, numbers, strings, containers), containers copied."""
    state: dict[str, dict[str, Any]] = {}
    for name in DS_STATE_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        state[name] = {
            key: _copy(value)
            for key, value in vars(module).items()
            if not key.startswith("__") and _plain(value)
        }
    return state


def ds_restore_state(state: Mapping[str, Mapping[str, Any]]) -> None:
    """Put back what :func:`ds_state` read (new containers each time, so that no test changes
    the kept ones)."""
    for name, values in state.items():
        module = sys.modules.get(name)
        if module is not None:
            for key, value in values.items():
                setattr(module, key, _copy(value))


def _plain(value: object) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, dict, list, set, tuple))


def _copy(value: Any) -> Any:
    return type(value)(value) if isinstance(value, (dict, list, set)) else value
