"""What a test leaves behind in a warm rank: found after every test, restored where it can be.

Runs in pool-mode rank processes: :mod:`pool.worker.main` registers a :class:`LeftoverCheck` in
every rank (``--distrank-leftovers`` other than ``off``), and it watches every test the rank runs,
PyTorch's harness classes included (:mod:`pool.worker.suiterank` tells it what the harness's own
``setUp`` sets).

A fresh process starts every test from the same state; a warm rank starts it from what the test
before left. So the rank takes the process-wide state a test can change when the test starts
(:class:`Snapshot`: environment variables, working folder, torch's defaults and flags, Python
threads, process groups, torch.compile's state) and compares it after the test's teardown with
what the test should have left: the state it started from, plus what fixtures of a wider scope
set up in it and keep set up (their changes are theirs until they are torn down; a fixture's own
changes are measured around its setup), less what such fixtures undid when torn down.

- What can be restored is restored: environment variables, the working folder, the default dtype
  and device, grad mode, deterministic algorithms, torch's thread count and ``torch.backends``
  flags (precision through ``fp32_precision``: reading the legacy ``allow_tf32`` raises once a test
  used the new API; :mod:`torchstate` reads and restores them), torch.compile's compiled code and
  counters (``torch._dynamo.reset``), process groups the test created and left (destroyed). The
  controller names them in the summary.
- What cannot be restored makes the pool unfit (the next test gets fresh ranks): a non-daemon
  thread still running (a fresh process would wait for it at exit), a process group that could not
  be destroyed. A daemon thread, and an idle worker of a ``ThreadPoolExecutor`` (an executor
  typically lives as long as the process), are named only.
- ``--distrank-leftovers=fail`` also fails the test: an error at its teardown naming what it left.

What the plugin sets itself (``PYTEST_CURRENT_TEST``, ``MASTER_PORT``, ``DISTRANK_*``) and what
the ini lists ``distrank_leftovers_ignore_env`` and ``distrank_leftovers_ignore_threads`` name
never count.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import threading
import time
from collections.abc import Callable, Generator, Iterable
from typing import Any

import pytest

from .. import _compat
from ..outcome.checks import and_words
from .ownedgroups import is_owned
from .torchstate import flag_words, set_torch_flag, torch_flags

#: How long the threads a test started get, all together, to end before they count as left.
ENDING_WAIT = 0.1
#: Variables the plugin or pytest set in every test, and that torch sets on first use to the same
#: value every time (the compile caches' folders): never leftovers.
OWN_ENV = (
    "PYTEST_CURRENT_TEST",
    "MASTER_PORT",
    "MASTER_ADDR",
    "DISTRANK_*",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
)
#: What PyTorch's harness sets in every test process: restored after each test, never named.
HARNESS_ENV = ("TORCH_SHOW_CPP_STACKTRACES", "LOCAL_RANK", "WORLD_SIZE")
Category = dict[Any, Any]


class LeftoverError(Exception):
    """A test left process-wide state changed (``--distrank-leftovers=fail``)."""

    #: Named without its module on the report's crash line, as pytest names its ``Failed``.
    __module__ = "builtins"


@dataclasses.dataclass
class Snapshot:
    """The process-wide state a test can change, by category; each category maps a key to its
    value (None: absent)."""

    env: Category
    cwd: Category
    torch: Category
    threads: Category
    groups: Category
    compiled: Category

    @classmethod
    def take(cls) -> Snapshot:
        return cls(
            _compat.environ_data(),  # encoded names and values: decoded only where they differ
            {"": _cwd()},
            torch_flags(),
            {t.ident: t for t in threading.enumerate()},
            _groups(),
            {"": _compat.compile_state()},
        )

    def categories(self) -> dict[str, Category]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def copy(self) -> Snapshot:
        return Snapshot(**{name: dict(values) for name, values in self.categories().items()})


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:  # the test removed the folder it left the rank in
        return "(a removed folder)"


def _groups() -> Category:
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return {}
    # The plugin's own groups (the checks' twins) live as long as the pool: never a leftover.
    return {id(pg): pg for pg in _compat.process_groups() if not is_owned(pg)}


def env_words(name: str, before: str | None, after: str | None) -> str:
    """An environment variable's change in words; values are not shown (they may be secrets)."""
    if before is None:
        return f"{name} set"
    return f"{name} unset" if after is None else f"{name} changed"


#: At most this many environment variables are named one by one (``os.environ.clear()``).
NAMED_VARIABLES = 6


def few(words: list[str], what: str) -> list[str]:
    """``words``, or its first ones and how many more (a test that cleared the environment
    changed every variable; the line names a few)."""
    if len(words) <= NAMED_VARIABLES:
        return words
    rest = len(words) - NAMED_VARIABLES + 1
    return [*words[: NAMED_VARIABLES - 1], f"{rest} more {what}"]


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


@dataclasses.dataclass
class Found:
    """What a test left: restored (words), unfit (why the pool must go), both per rank."""

    restored: list[str] = dataclasses.field(default_factory=list)
    unfit: list[str] = dataclasses.field(default_factory=list)
    #: Process groups to destroy after the test's sequence numbers were read.
    groups: list[Any] = dataclasses.field(default_factory=list)


class LeftoverCheck:
    """The pytest plugin of a rank that finds, restores and names what each test left."""

    def __init__(
        self, rank: int, policy: str, ignore_env: Iterable[str], ignore_threads: Iterable[str]
    ) -> None:
        self.rank = rank
        self.fail = policy == "fail"
        self.ignore_env = (*OWN_ENV, *ignore_env)
        self.ignore_threads = tuple(ignore_threads)
        #: What the running test should leave: its start, with wider fixtures' changes applied.
        self.expected: Snapshot | None = None
        #: Per wider-scoped fixture still set up: (category, key) -> the value before its setup.
        self.owned: dict[int, tuple[str, dict[tuple[str, Any], Any]]] = {}
        #: Keys whose changes are restored without being named (the harness's own setUp's).
        self.quiet: set[tuple[str, Any]] = set()
        self.harness = False
        self.found = Found()
        #: Keys a wider fixture changed and was torn down in the running test: its name.
        self.whose: dict[tuple[str, Any], str] = {}

    # -- the test's life ------------------------------------------------------------------------

    def start(self, item: pytest.Item, harness: bool) -> None:
        """At the start of ``item``, before its setup (after what earlier tests left set up
        and ``item`` does not need was torn down)."""
        self.expected = Snapshot.take()
        self.harness = harness
        self.quiet = {("env", _env_key(name)) for name in HARNESS_ENV} if harness else set()

    def harness_setup_done(self) -> None:
        """PyTorch's harness ran the test's ``setUp`` in what stands for its parent process: what
        it set (variables, torch flags) is the harness's, restored after the test unnamed."""
        if self.expected is None:
            return
        for key, _ in _diff(self.expected, Snapshot.take()):
            if key[0] in ("env", "cwd", "torch"):
                self.quiet.add(key)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, Any, Any]:
        """A fixture of a wider scope than the test owns what its setup changes, until its
        teardown (measured around its setup only: ~0.1 ms, once per such fixture)."""
        if fixturedef.scope == "function" or self.expected is None:
            return (yield)
        before = Snapshot.take()
        try:
            return (yield)
        finally:
            after = Snapshot.take()
            changed = dict(_diff(before, after))
            if changed:
                self.owned[id(fixturedef)] = (fixturedef.argname, changed)
                for (category, key), _ in changed.items():
                    getattr(self.expected, category)[key] = getattr(after, category).get(key)

    @pytest.hookimpl
    def pytest_fixture_post_finalizer(self, fixturedef: pytest.FixtureDef[Any]) -> None:
        """A wider fixture was torn down: what it changed should be back as it was."""
        owned = self.owned.pop(id(fixturedef), None)
        if owned is None:
            return
        name, changed = owned
        if self.expected is None:  # torn down between tests: compared and restored now
            now = Snapshot.take()
            expected = now.copy()
            for (category, key), value in changed.items():
                getattr(expected, category)[key] = value
            self.whose = dict.fromkeys(changed, f"fixture {name!r}")
            self._settle(expected, now)
            return
        for (category, key), value in changed.items():
            getattr(self.expected, category)[key] = value
            self.whose[(category, key)] = f"fixture {name!r}"

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, None, None]:
        """After the test's teardown (every other teardown hook inside this one): compare,
        restore, and under ``--distrank-leftovers=fail`` fail the teardown."""
        __tracebackhide__ = True
        try:
            return (yield)
        finally:
            expected, self.expected = self.expected, None
            if expected is not None:
                self._settle(expected, Snapshot.take())
                found = self.found
                if self.fail and (found.restored or found.unfit or found.groups):
                    self._raise(item)

    def finish(self) -> tuple[tuple[str, ...], str]:
        """After the test's reports and sequence numbers: destroy the groups it left; return
        (what was restored, in words; why the rank is unfit, or "")."""
        found, self.found = self.found, Found()
        # Under init_process_group=False the pool destroys whatever the test left, by design
        # (rankgroup.group_problem, before this): only groups still alive are leftovers.
        live = _groups() if found.groups else {}  # most tests leave none: nothing to list
        for pg in (pg for pg in found.groups if id(pg) in live):
            words = _group_words(pg)
            try:
                import torch.distributed as dist

                dist.destroy_process_group(pg)
            except Exception as exc:
                found.unfit.append(f"left {words} that could not be destroyed ({exc!r})")
            else:
                found.restored.append(words)
        unfit = "; ".join(f"{why} on rank {self.rank}" for why in found.unfit)
        return tuple(found.restored), unfit

    # -- comparing and restoring ----------------------------------------------------------------

    def _settle(self, expected: Snapshot, now: Snapshot) -> None:
        """Restore ``now`` to ``expected`` where it differs and can be; note what differed."""
        whose, self.whose = self.whose, {}
        threads_left: list[tuple[threading.Thread, str]] = []
        variables: list[str] = []
        for (category, key), value in _diff(expected, now):
            by = f" by {whose[category, key]}" if (category, key) in whose else ""
            if (category, key) in self.quiet:
                _restore(category, key, value)
                continue
            if category == "env":
                name = _decoded(key)
                if _matches(name, self.ignore_env):
                    continue
                variables.append(env_words(name, value, now.env.get(key)) + by)
            elif category == "cwd":
                self.found.restored.append("the working folder changed" + by)
            elif category == "torch":
                self.found.restored.append(flag_words(key, now.torch.get(key)) + by)
            elif category == "threads":
                thread = now.threads.get(key)
                if value is None and thread is not None:  # a new one (an ended one is fine)
                    threads_left.append((thread, by))
                continue
            elif category == "groups":
                # The harness's classes own their groups (a continuous class keeps its own).
                if value is None and key in now.groups and not self.harness:
                    self.found.groups.append(now.groups[key])
                continue
            elif category == "compiled":
                if (now.compiled.get(key) or 0) > (value or 0):
                    self.found.restored.append("torch.compile state (torch._dynamo.reset())" + by)
                    _compat.reset_compile_state()
                continue
            _restore(category, key, value)
        self.found.restored[:0] = few(variables, "environment variables")
        self._threads(threads_left)

    def _threads(self, threads: list[tuple[threading.Thread, str]]) -> None:
        until = time.monotonic() + ENDING_WAIT
        for thread, by in threads:
            if _compat.foreign_thread(thread):
                continue  # C++ threads that called into Python (RPC's): not started by a test
            if _matches(thread.name, self.ignore_threads) or _ending(thread, until):
                continue
            if thread.daemon or _compat.executor_worker(thread):
                # Named only: a daemon never holds a process's exit up, nor does an executor's
                # idle worker (its executor lives per process, typically: inductor's compile
                # pool, DCP's async saves; exit shuts it down).
                kind = "daemon thread" if thread.daemon else "executor thread"
                self.found.restored.append(f"{kind} {thread.name!r}{by} still running")
            else:
                self.found.unfit.append(
                    f"left thread {thread.name!r}{by} running (not a daemon: a fresh process "
                    "would wait for it)"
                )

    def _raise(self, item: pytest.Item) -> None:
        __tracebackhide__ = True
        what = [*self.found.restored, *self.found.unfit]
        groups = [_group_words(pg) for pg in self.found.groups]
        raise LeftoverError(
            f"{item.nodeid} left {and_words([*what, *groups])} on rank {self.rank}; what can be "
            "restored was restored, and the next test starts as this one did.\n"
            "--distrank-leftovers=fail fails a test for what it leaves behind in its warm ranks; "
            "undo it in the test or a fixture's teardown (monkeypatch does), or see "
            "docs/reuse.md#leftovers."
        )


def _diff(before: Snapshot, after: Snapshot) -> Iterable[tuple[tuple[str, Any], Any]]:
    """((category, key), the value before) for every key whose value differs."""
    now = after.categories()
    for category, values in before.categories().items():
        other = now[category]
        if values == other:
            continue
        # In the order taken: torch's precision is restored before the flags it also sets.
        for key in [*values, *(k for k in other if k not in values)]:
            if not _same(values.get(key), other.get(key)):
                yield (category, key), values.get(key)


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # a value whose comparison raises: unchanged only if it is the same
        return False


def _restore(category: str, key: Any, value: Any) -> None:
    restorers: dict[str, Callable[[Any, Any], None]] = {
        "env": _restore_env,
        "cwd": lambda _, v: os.chdir(v),
        "torch": set_torch_flag,
    }
    restore = restorers.get(category)
    if restore is None:
        return
    try:
        restore(key, value)
    except Exception:  # e.g. the folder is gone; named either way
        return


def _env_key(name: str) -> Any:
    """``name`` as :func:`_compat.environ_data` keys it (encoded where the OS has bytes)."""
    return os.fsencode(name) if os.supports_bytes_environ else name


def _decoded(value: Any) -> str:
    """A name or value of :func:`_compat.environ_data` as ``os.environ`` shows it."""
    return os.fsdecode(value) if isinstance(value, bytes) else str(value)


def _restore_env(name: Any, value: Any) -> None:
    if value is None:
        os.environ.pop(_decoded(name), None)
    else:
        os.environ[_decoded(name)] = _decoded(value)


def _group_words(pg: Any) -> str:
    from .groupstate import group_words

    return f"process {group_words(pg)}"


def _ending(thread: threading.Thread, until: float) -> bool:
    """A thread that ends within a moment (a pipe's listener, joined late) is not a leftover."""
    thread.join(max(0.0, until - time.monotonic()))
    return not thread.is_alive()
