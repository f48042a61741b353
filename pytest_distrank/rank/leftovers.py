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
  used the new API; :mod:`torchstate` reads and restores them), process-wide switches
  (:mod:`switches`: the collector, numpy's errors, global module hooks, ...), process groups the
  test created and left (destroyed). The controller names them in the summary. torch.compile's
  compiled code and counters are reset (``torch._dynamo.reset``) unnamed: compiling is normal.
- What cannot be restored makes the pool unfit (the next test gets fresh ranks): a non-daemon
  thread still running (a fresh process would wait for it at exit), a process group that could not
  be destroyed, a torch function mode, ``inference_mode`` or profiler left entered. A daemon
  thread, and an idle worker of a ``ThreadPoolExecutor`` (an executor typically lives as long as
  the process), are named only.
- ``--distrank-leftovers=fail`` also fails the test: an error at its teardown naming what it left.
- What changed between two tests, outside both (:mod:`between`), is found at the next test's
  start, named on a line of its own and restored where it can be; it fails no test.

What the plugin sets itself (``PYTEST_CURRENT_TEST``, ``DISTRANK_*``) and what the ini lists
``distrank_leftovers_ignore_env`` and ``distrank_leftovers_ignore_threads`` name never count;
``MASTER_ADDR`` and ``MASTER_PORT`` are put back to the rank's own values, unnamed.
"""

from __future__ import annotations

import fnmatch
import sys
import threading
import time
from collections.abc import Generator, Iterable, Mapping
from typing import Any

import pytest

from .. import _compat
from ..outcome.checks import and_words
from . import processstate as ps
from .between import expected_start, kept
from .leftgroups import Found, destroy, listening
from .leftoverwords import NAMES, env_words, few, group_words, named_words, not_restored
from .snapshot import (
    Category,
    Snapshot,
    decoded,
    diff,
    env_key,
    live_groups,
    owned_groups,
    restore,
)
from .switches import PROFILER, restore_switch, switch_words
from .torchstate import (
    DYNAMO,
    FUNCTION_MODES,
    INFERENCE,
    dynamo_default,
    flag_words,
    reset_dynamo_config,
    restored_with,
)

#: How long the threads and children a test started get, all together, to end before they
#: count as left.
ENDING_WAIT = 0.1
#: Variables the plugin or pytest set in every test, and that torch sets on first use to the same
#: value every time (the compile caches' folders): never leftovers.
OWN_ENV = (
    "PYTEST_CURRENT_TEST",
    "DISTRANK_*",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
)
#: The rank's rendezvous variables (the plugin's): put back to the rank's own values, unnamed.
QUIET_ENV = ("MASTER_PORT", "MASTER_ADDR")
#: What PyTorch's harness sets in every test process: restored after each test, never named.
HARNESS_ENV = ("TORCH_SHOW_CPP_STACKTRACES", "LOCAL_RANK", "WORLD_SIZE")
#: What the harness's own ``setUp`` may set, restored or passed over unnamed.
HARNESS_CATEGORIES = (
    "env",
    "cwd",
    "torch",
    "switches",
    "path",
    "modules",
    "signals",
    "logging",
    "umask",
)
#: ``group_desc`` of the groups ``DeviceMesh`` creates (torch 2.13: ``mesh_<dim>``): a mesh the
#: test built is normal, its groups are destroyed after the test without being named.
MESH_DESC = "mesh_"


class LeftoverError(_compat.Failed):
    """A test left process-wide state changed (``--distrank-leftovers=fail``): reported as
    :func:`pytest.fail` with ``pytrace=False`` reports, by its message alone (the frames are
    the plugin's, no help to the test's author)."""

    #: Named without its module on the report's crash line, as pytest names its ``Failed``.
    __module__ = "builtins"

    def __init__(self, message: str) -> None:
        super().__init__(message, pytrace=False)


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


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
        #: At the test's start: the plugin's own groups alive, and the last failure pytest kept
        #: (``sys.last_value``: a failed test's frames, and the groups in them, stay alive).
        self.start_owned = 0
        self.start_failure: Any = None
        #: What :meth:`_settle` put back, by (category, key): the value it restored.
        self.restored: dict[tuple[str, Any], Any] = {}
        #: The last test's end: its node id, its snapshot after the teardown, what was restored.
        self.ended: tuple[str, dict[str, Category], dict[tuple[str, Any], Any]] | None = None
        #: Wider fixtures torn down since it: (category, key) -> (name, value before its setup).
        self.torn: dict[tuple[str, Any], tuple[str, Any]] = {}
        #: What changed between the last test and this one (:mod:`between`): the last test's node
        #: id and the words, sent with this test's reports (once :meth:`finish` destroyed the
        #: groups of :attr:`between_found`, found at this test's start).
        self.between: tuple[str, tuple[str, ...]] | None = None
        self.between_found: tuple[str, Found] | None = None

    # -- the test's life ------------------------------------------------------------------------

    def start(self, item: pytest.Item, harness: bool) -> None:
        """At the start of ``item``, before its setup (after what earlier tests left set up
        and ``item`` does not need was torn down)."""
        self.expected = Snapshot.take()
        self._between(self.expected)
        self.start_owned = owned_groups()
        self.start_failure = getattr(sys, "last_value", None)
        self.harness = harness
        names = (*QUIET_ENV, *HARNESS_ENV) if harness else QUIET_ENV
        self.quiet = {("env", env_key(name)) for name in names}

    def harness_setup_done(self) -> None:
        """PyTorch's harness ran the test's ``setUp`` in what stands for its parent process: what
        it set (variables, torch flags, handlers) is the harness's, restored or passed over after
        the test unnamed."""
        if self.expected is None:
            return
        for key, _ in diff(self.expected, Snapshot.take()):
            if key[0] in HARNESS_CATEGORIES:
                self.quiet.add(key)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, Any, Any]:
        """A fixture of a wider scope than the test owns what its setup changes, until its
        teardown (measured around its setup only: ~0.5 ms, once per such fixture)."""
        if fixturedef.scope == "function" or self.expected is None:
            return (yield)
        before = Snapshot.take()
        try:
            return (yield)
        finally:
            after = Snapshot.take()
            changed = dict(diff(before, after))
            if changed:
                self.owned[id(fixturedef)] = (fixturedef.argname, changed)
                for (category, key), _ in changed.items():
                    self.expected.put(category, key, getattr(after, category).get(key))

    @pytest.hookimpl
    def pytest_fixture_post_finalizer(self, fixturedef: pytest.FixtureDef[Any]) -> None:
        """A wider fixture was torn down: what it changed should be back as it was."""
        owned = self.owned.pop(id(fixturedef), None)
        if owned is None:
            return
        name, changed = owned
        if self.expected is None:  # torn down between tests: compared at the next one's start
            self.torn.update((key, (name, value)) for key, value in changed.items())
            return
        for (category, key), value in changed.items():
            self.expected.put(category, key, value)
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
                now = Snapshot.take()
                self.restored = {}
                self._settle(expected, now)
                self.ended = (item.nodeid, kept(now), self.restored)
                if self._sockets_readable():
                    self.found.sockets = frozenset(now.sockets) - frozenset(expected.sockets)
                found = self.found
                if self.fail and (found.words or found.unfit or found.groups):
                    self._raise(item)

    def _sockets_readable(self) -> bool:
        """Whether new sockets can be told to be the test's: not when the plugin made groups of
        its own during the test (a check's first twin, the mesh fixture's first mesh: each gloo
        group listens), nor when the test failed (pytest keeps its frames, and the groups in
        them, alive in ``sys.last_value``), nor when a harness class's group lives on after its
        test (a ``MultiProcContinuousTest`` class's, made by its first test: the class's)."""
        failed = getattr(sys, "last_value", None) is not self.start_failure
        if self.harness and live_groups():
            return False
        return not failed and owned_groups() == self.start_owned

    def finish(self) -> tuple[tuple[str, ...], str]:
        """After the test's reports and sequence numbers: destroy the groups it left; return
        (what it left, in words; why the rank is unfit, or "")."""
        found, self.found = self.found, Found()
        destroyed = destroy(found)  # its own frame: no reference to a group outlives it
        found.words += listening(found.sockets, destroyed)
        unfit = "; ".join(f"{why} on rank {self.rank}" for why in (*self._after(), *found.unfit))
        return tuple(found.words), unfit

    def _after(self) -> list[str]:
        """What changed between the last test and this one, once the groups a fixture torn down
        there left are destroyed (named on the between line, as after a test): sets
        :attr:`between`; why the pool must go (the test is not failed for it)."""
        if self.between_found is None:
            return []
        (previous, between), self.between_found = self.between_found, None
        destroy(between)
        if between.words:
            self.between = (previous, tuple(between.words))
        return [
            f"started with {why.removeprefix('left ')}, left between {previous} and it outside "
            "both tests"
            for why in between.unfit
        ]

    # -- comparing and restoring ----------------------------------------------------------------

    def _settle(
        self, expected: Snapshot, now: Snapshot, modules: Mapping[str, Any] | None = None
    ) -> None:
        """Restore ``now`` to ``expected`` where it differs and can be; name what differed.
        ``modules``: those before what is compared (``expected``'s, unless given)."""
        whose, self.whose = self.whose, {}
        threads_left: list[tuple[threading.Thread, str]] = []
        variables: list[str] = []
        named: dict[str, list[str]] = {}
        imported: set[str] = set()  # modules imported during the test, read on first need
        until = time.monotonic() + ENDING_WAIT  # the children a test started end by then
        for (category, key), value in diff(expected, now):
            by = f" by {whose[category, key]}" if (category, key) in whose else ""
            if (category, key) in self.quiet:
                self._restore(category, key, value)
                continue
            if category == "env":
                name = decoded(key)
                if _matches(name, self.ignore_env):
                    continue  # the plugin's own, or the ini's: neither named nor restored
                variables.append(env_words(name, value, now.env.get(key)) + by)
                self._restore(category, key, value)
            elif category == "cwd":
                words = "the working folder changed" + by
                restored = self._restore(category, key, value)
                self.found.words.append(words if restored else not_restored(words))
            elif category == "torch":
                self._torch(key, value, expected, now, by)
            elif category == "switches":
                self._switch(key, value, now, by)
            elif category == "threads":
                thread = now.threads.get(key)
                if value is None and thread is not None:  # a new one (an ended one is fine)
                    threads_left.append((thread, by))
            elif category == "groups":
                self._group(key, value, now)
            elif category == "compiled":  # compiling is normal: reset, never named
                if (now.compiled.get(key) or 0) > (value or 0):
                    _compat.reset_compile_state()
            elif category != "sockets":  # sockets: once the test's groups are destroyed
                after = getattr(now, category).get(key)
                if category == "logging":
                    before = expected.modules if modules is None else modules
                    imported = imported or (now.modules.keys() - before.keys())
                    said = ps.logging_words(key, value, after, imported)
                else:
                    said = named_words(category, key, value, after, until)
                if said:
                    named.setdefault(category, []).append(said + by)
        self.found.words[:0] = few(variables, "environment variables")
        for category, all_said in named.items():
            self.found.words += [not_restored(w) for w in few(all_said, NAMES[category])]
        self._threads(threads_left)

    def _restore(self, category: str, key: Any, value: Any) -> bool:
        if not restore(category, key, value):
            return False
        self.restored[category, key] = value
        return True

    def _between(self, start: Snapshot) -> None:
        """Name and restore what changed since the last test's end, outside both tests (a
        fixture torn down there, a hook, a ``__del__``); ``start`` is updated to what was put
        back. Sent with this test's reports, on a line of its own; never fails a test."""
        ended, self.ended = self.ended, None
        torn, self.torn = self.torn, {}
        self.between = self.between_found = None
        if ended is None:
            return
        previous, end, restored = ended
        owned = {key: value for key, (_, value) in torn.items()}
        expected = expected_start(end, restored, owned, start)
        found, self.found = self.found, Found()
        quiet, self.quiet = self.quiet, {("env", env_key(name)) for name in QUIET_ENV}
        harness, self.harness = self.harness, False  # the last test's: none of a harness here
        self.whose = {key: f"fixture {name!r}" for key, (name, _) in torn.items()}
        self.restored = {}
        try:
            self._settle(expected, start, end["modules"])
        finally:
            between, self.found, self.quiet = self.found, found, quiet
            self.harness = harness
        for (category, key), value in self.restored.items():
            start.put(category, key, value)
        self.between_found = (previous, between)

    def _torch(self, key: str, value: Any, expected: Snapshot, now: Snapshot, by: str) -> None:
        modes = now.torch.get(FUNCTION_MODES) or ()
        if key == FUNCTION_MODES:  # every later test would run under them: the pool goes
            left = [m for m in modes if m not in (value or ())] or list(modes)
            self.found.unfit.append(f"left torch function modes entered{by}: {', '.join(left)}")
            return
        if key == "default device" and modes != expected.torch.get(FUNCTION_MODES):
            return  # a torch.device(...) left entered: named with the function modes
        if key == INFERENCE:  # no setter, and later tests would make inference tensors
            if now.torch.get(INFERENCE):
                self.found.unfit.append(f"left torch.inference_mode entered{by}")
            return
        if key in ("grad mode", "autograd multithreading") and (
            now.torch.get(INFERENCE) != expected.torch.get(INFERENCE)
        ):
            return  # what the inference mode sets: named with it
        if key not in expected.torch:  # dynamo imported during the test: compared with defaults
            if not key.startswith(DYNAMO) or dynamo_default(key):
                return
            self.found.words.append(flag_words(key, now.torch.get(key)) + by)
            self.restored["torch", key] = reset_dynamo_config(key)  # its default
            return
        self.found.words.append(flag_words(key, now.torch.get(key)) + by)
        for name in restored_with(key, expected.torch):  # each precision setting, in order
            self._restore("torch", name, expected.torch[name])

    def _switch(self, key: str, value: Any, now: Snapshot, by: str) -> None:
        words = switch_words(key, now.switches.get(key)) + by
        if key == PROFILER:
            self.found.unfit.append(f"left {words}")
        elif restore_switch(key, value):
            self.restored["switches", key] = value
            self.found.words.append(words)
        else:
            self.found.words.append(not_restored(words))

    def _group(self, key: Any, value: Any, now: Snapshot) -> None:
        # The harness's classes own their groups (a continuous class keeps its own).
        if value is not None or key not in now.groups or self.harness:
            return
        pg = now.groups[key]
        if str(getattr(pg, "group_desc", "")).startswith(MESH_DESC):
            self.found.mesh_groups.append(pg)
        else:
            self.found.groups.append(pg)

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
                self.found.words.append(f"{kind} {thread.name!r}{by} still running")
            else:
                self.found.unfit.append(
                    f"left thread {thread.name!r}{by} running (not a daemon: a fresh process "
                    "would wait for it)"
                )

    def _raise(self, item: pytest.Item) -> None:
        __tracebackhide__ = True
        what = [*self.found.words, *self.found.unfit]
        groups = [group_words(pg) for pg in self.found.groups]
        raise LeftoverError(
            f"{item.nodeid} left {and_words([*what, *groups])} on rank {self.rank}; what can be "
            "restored was restored, and the next test starts as this one did.\n"
            "--distrank-leftovers=fail fails a test for what it leaves behind in its warm ranks; "
            "undo it in the test or a fixture's teardown (monkeypatch does), or see "
            "docs/reuse.md#leftovers."
        )


def _ending(thread: threading.Thread, until: float) -> bool:
    """A thread that ends within a moment (a pipe's listener, joined late) is not a leftover."""
    thread.join(max(0.0, until - time.monotonic()))
    return not thread.is_alive()
