"""The hooks that make a test's process tree part of its report.

Runs in the controller (ordinary tests, which it runs itself; collection, for the pool's
deadline) and in each rank of both modes (the distributed test it runs). For an opted-in test
(:func:`options.opted_in`): a watch of the processes it starts, the faulthandler fallback armed
in their environment, this process made a child subreaper for the test's length (orphans of the
tree re-parent to it, not to init); at pytest-timeout's deadline (an ordinary test: its timer is
taken through ``pytest_timeout_set_timer``) or an interrupt, the tree's stacks; after the test,
its deaths named and every process it left ended, before the next test and before
``pytest_unconfigure`` (multiprocessing's atexit would wait for them forever).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Generator
from types import FrameType
from typing import IO, Any

import pytest

from ..envvars import RANK_ENV
from ..envvars import TREE_DIR_ENV as DIR_ENV
from . import pooldeadline
from .dump import dump_tree, fallback_env, register_here, unregister_here
from .held import held_text, listening_ports, mapped_segments, shm_segments
from .options import deaths_policy, opted_in
from .procs import Death, Proc, Watch, end_tree, subreaper
from .reaped import record_reaped, stop_recording
from .words import (
    DEATHS_TITLE,
    STACKS_TITLE,
    death_line,
    ended_text,
    fails_test,
    stacks_text,
)


@dataclasses.dataclass
class Active:
    """One opted-in test while it runs."""

    watch: Watch
    folder: str
    saved_env: dict[str, str | None]
    reaper: contextlib.ExitStack
    handler: IO[str] | None  # the file faulthandler writes this process's stacks to
    reported: int = 0  # deaths already put in a report
    ended: list[Proc] | None = None  # what was left running at its teardown, ended
    shm: set[str] = dataclasses.field(default_factory=shm_segments)  # /dev/shm at its start
    held: str = ""  # the segments and ports its tree left, in words
    stacks: str = ""  # the stacks taken at its deadline
    based: bool = False  # whether its tree starts at its function-scoped fixtures yet
    stacks_told: bool = False  # whether a report holds the stacks


class TreePlugin:
    def __init__(self, in_rank: bool) -> None:
        self.in_rank = in_rank
        self.active: dict[str, Active] = {}
        self.own_folder: str | None = None
        #: (pid, start time) of every process this plugin ended in this session: its parent
        #: may reap it later.
        self.ended: set[tuple[int, int]] = set()
        #: pytest-timeout's thread method's timers, by test.
        self.timers: dict[str, threading.Timer] = {}

    # -- the session ---------------------------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        if self.in_rank:
            return
        opted = [item for item in items if opted_in(item)]
        pooldeadline.OPTED.update(item.nodeid for item in opted)
        if opted and DIR_ENV not in os.environ:  # before any pool starts: its ranks inherit it
            self.own_folder = tempfile.mkdtemp(prefix="distrank-tree-")
            os.environ[DIR_ENV] = self.own_folder

    def pytest_unconfigure(self) -> None:
        if self.own_folder is not None:
            os.environ.pop(DIR_ENV, None)
            shutil.rmtree(self.own_folder, ignore_errors=True)

    # -- one test ------------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if item.nodeid in self.active or not opted_in(item):
            return
        folder = os.environ.get(DIR_ENV) or self._folder()
        env = fallback_env(folder)
        saved = {name: os.environ.get(name) for name in env}
        os.environ.update(env)
        handler = register_here(folder)
        reaper = contextlib.ExitStack()
        if not self.in_rank:  # a rank is a subreaper for its whole life already
            reaper.enter_context(subreaper())
        record_reaped(folder)
        watch = Watch(os.getpid(), folder, self.ended)
        self.active[item.nodeid] = Active(watch, folder, saved, reaper, handler)

    @pytest.hookimpl(tryfirst=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: pytest.FixtureRequest) -> None:
        if fixturedef.scope == "function":
            self._tree_starts(request.node.nodeid)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        self._tree_starts(item.nodeid)

    def _tree_starts(self, nodeid: str) -> None:
        """The test's tree is what its call and its function-scoped fixtures start: pytest sets
        up the wider fixtures first, and what they start (a server) outlives the test."""
        active = self.active.get(nodeid)
        if active is not None and not active.based:
            active.based = True
            active.watch.rebase()

    def _folder(self) -> str:
        if self.own_folder is None:
            self.own_folder = tempfile.mkdtemp(prefix="distrank-tree-")
        return self.own_folder

    @pytest.hookimpl(optionalhook=True)
    def pytest_timeout_set_timer(self, item: pytest.Item, settings: Any) -> bool | None:
        """An opted-in ordinary test's deadline is taken here: pytest-timeout's thread method
        would ``os._exit`` with no report and the tree orphaned, its signal method would leave
        the tree running. Same seconds; the tree's stacks, then the tree ended."""
        timeout = getattr(settings, "timeout", None)
        if self.in_rank or not timeout or not opted_in(item):
            return None
        if getattr(settings, "method", "signal") == "thread":
            self._thread_timer(item, settings, timeout)
            return True
        if threading.current_thread() is not threading.main_thread():
            return None

        def expired(signum: int, frame: FrameType | None) -> None:
            __tracebackhide__ = True  # the user's frames end the traceback, not the plugin's
            self._at_deadline(item, f"pytest-timeout's {timeout:g} s")
            pytest.fail(
                f"Timeout: {item.nodeid} ran past pytest-timeout's {timeout:g} s; the stacks "
                f"of its process tree are in the section '{STACKS_TITLE}', and every process "
                "of it was ended",
                pytrace=True,
            )

        signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, float(timeout))
        return True

    def _thread_timer(self, item: pytest.Item, settings: Any, timeout: float) -> None:
        """pytest-timeout's thread method, as it is (its stacks, then the session exits at
        once), with the tree's stacks first and the tree ended (it would be orphaned)."""
        from pytest_timeout import timeout_timer  # type: ignore[import-untyped]

        def expired() -> None:
            self._at_deadline(item, f"pytest-timeout's {timeout:g} s (method='thread')")
            active = self.active.get(item.nodeid)
            capman = item.config.pluginmanager.getplugin("capturemanager")
            with contextlib.suppress(Exception):
                if capman is not None:
                    capman.suspend_global_capture(item)
                terminal = item.config.get_terminal_writer()
                terminal.sep("+", title=f"{STACKS_TITLE} of {item.nodeid}")
                terminal.write(f"{active.stacks if active else ''}\n")
            timeout_timer(item, settings)  # os._exit(1)

        timer = threading.Timer(float(timeout), expired)
        timer.name, timer.daemon = "distrank-tree-timeout", True
        self.timers[item.nodeid] = timer
        timer.start()

    @pytest.hookimpl(optionalhook=True)
    def pytest_timeout_cancel_timer(self, item: pytest.Item) -> bool | None:
        if self.in_rank or not opted_in(item):
            return None
        timer = self.timers.pop(item.nodeid, None)
        if timer is not None:
            timer.cancel()
            return True
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        return True

    def _at_deadline(self, item: pytest.Item, why: str) -> None:
        active = self.active.get(item.nodeid)
        if active is None or active.stacks:
            return
        started = time.monotonic()
        living = active.watch.living()
        stacks, method = dump_tree(living, active.folder)
        text = stacks_text(stacks, method, time.monotonic() - started)
        active.stacks = f"at {why}: {text}"
        active.watch.forget(living)
        self.ended.update(p.key for p in end_tree(living, os.getpid()))

    def pytest_keyboard_interrupt(self) -> None:
        """An interrupt in an opted-in test: its tree's stacks on the terminal, then it ends
        (a second interrupt skips the stacks, never the end)."""
        try:
            for nodeid, active in list(self.active.items()):
                started = time.monotonic()
                living = active.watch.living()
                stacks, method = dump_tree(living, active.folder)
                text = stacks_text(stacks, method, time.monotonic() - started)
                with contextlib.suppress(Exception):
                    print(f"\n{STACKS_TITLE} of {nodeid} (interrupted):\n{text}", flush=True)
        except KeyboardInterrupt:
            print(
                "\npytest-distrank: interrupted again: the tree's stacks are skipped, "
                "its processes are ended",
                flush=True,
            )
        finally:
            with _signals_held():
                for nodeid, active in list(self.active.items()):
                    self.active.pop(nodeid, None)
                    self._finish(active)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, None, None]:
        """After the test's fixtures are torn down (inside the rank's leftover check, which
        then sees neither the watch's thread nor the fallback's variables): end the tree."""
        try:
            return (yield)
        finally:
            active = self.active.get(item.nodeid)
            if active is not None and active.ended is None:
                active.ended = self._finish(active)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        outcome = yield
        active = self.active.get(item.nodeid)
        if active is None:
            return
        report: pytest.TestReport = outcome.get_result()
        ended: list[Proc] = []
        if call.when == "teardown":
            self.active.pop(item.nodeid, None)
            ended = active.ended if active.ended is not None else self._finish(active)
        else:
            active.watch.poll()
        if active.stacks and not active.stacks_told:  # a deadline in setup or teardown too
            active.stacks_told = True
            report.sections.append((STACKS_TITLE, active.stacks))
        deaths = active.watch.deaths[active.reported :]
        active.reported += len(deaths)
        held = active.held if call.when == "teardown" else ""
        self._deaths(item, report, deaths, ended, held)

    def _deaths(
        self,
        item: pytest.Item,
        report: pytest.TestReport,
        deaths: list[Death],
        ended: list[Proc],
        held: str,
    ) -> None:
        lines = [death_line(d) for d in deaths]
        if ended:
            lines.append(ended_text(ended))
        if held:
            lines.append(held)
        if not lines:
            return
        title = DEATHS_TITLE if report.when != "teardown" else f"{DEATHS_TITLE} (teardown)"
        report.sections.append((title, "\n".join(lines)))
        policy = deaths_policy(item)
        if deaths and fails_test(deaths, policy.value, report.outcome):
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid}: a process of its tree died during the test "
                f"({policy.source} fails the test for it):\n" + "\n".join(lines)
            )

    def _finish(self, active: Active) -> list[Proc]:
        """End the tree, stop watching, restore the environment and the subreaper state."""
        active.watch.stop()
        living = active.watch.living()
        ports = listening_ports(
            living, os.getpid()
        )  # before the kill: a dead process holds no socket
        ended = end_tree(living, os.getpid()) if living else []
        left = shm_segments() - active.shm
        left -= mapped_segments(os.getpid(), left)
        active.held = held_text(sorted(left), ports)
        self.ended.update(p.key for p in ended)
        unregister_here(active.handler)
        stop_recording()
        for name, value in active.saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        active.reaper.close()
        return ended


@contextlib.contextmanager
def _signals_held() -> Generator[None, None, None]:
    """SIGINT and SIGTERM ignored while the block runs (in the main thread): the tree is
    ended whatever the user presses."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def register(config: pytest.Config) -> None:
    """Add the tree's hooks to this pytest process (the controller, a rank, a launched rank)."""
    if config.pluginmanager.has_plugin("distrank-tree"):
        return
    in_rank = RANK_ENV in os.environ
    config.pluginmanager.register(TreePlugin(in_rank), "distrank-tree")
