"""What ranks read as ``config.workerinput``: pytest-xdist's channel for plugins' values.

Runs in both processes of pool mode and imports neither side: the controller builds each rank's
dict at every pool start (:class:`RankInputs`), the rank installs it before any plugin's
``pytest_configure`` runs (:class:`WorkerInput`), where an xdist worker has it. There, too, the
rank sets what it owns of its command line (``cmdline.py`` says what and why), as an xdist
worker sets ``config.option`` values right after parsing the controller's arguments.

A plugin that settles a value at configure time (pytest-randomly's seed) would settle it again,
differently, in every rank. Under pytest-xdist the controller hands such values to its workers:
each plugin's ``pytest_configure_node(node)`` writes them into ``node.workerinput``, and the
worker reads them back as ``config.workerinput``. Ranks get the same channel:

- xdist's own keys: ``workerid`` (``<controller's id>-pool<P>-rank<R>``; the controller's id is
  xdist's ``gw<N>`` under ``-n``, else ``distrank``), ``workercount``, ``testrunuid`` and
  ``mainargv``: the controller's own under xdist, else 1, a new id for the session and its
  ``sys.argv``. ``PYTEST_XDIST_WORKER``, ``PYTEST_XDIST_TESTRUNUID`` and
  ``PYTEST_XDIST_WORKER_COUNT`` follow them, as in an xdist worker;
- what each plugin's ``pytest_configure_node`` adds, called in the controller with a node that
  has ``config``, ``workerinput``, ``gateway.id`` and ``nodemanager.roots`` (only where xdist
  declares the hook; under xdist the controller's own ``workerinput`` already holds it);
- pytest-randomly's seed, which it hands over only under xdist (its node hook is registered only
  then) but reads whenever ``workerinput`` exists.

What is dropped, each said once in the ``distrank`` summary: values that are not JSON data (xdist
sends plain data too), and what a node hook that raised would have added. pytest-cov's node hook
is not called: ranks measure themselves (``cmdline.coverage_settings``). ``config.workeroutput``
is an empty dict in ranks; nothing written there travels back, and ``pytest_testnodedown`` is not
called.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import uuid
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import pytest

from .. import _compat
from .._compat import PYTEST_COV_PLUGIN
from .protocol import RankCommandLine

#: Plugins (by registered name) whose ``pytest_configure_node`` is not called for ranks.
SKIPPED_NODE_HOOKS = frozenset({PYTEST_COV_PLUGIN})  # pytest-cov: cmdline.coverage_settings
#: The ``workerid`` prefix of ranks when the controller is not an xdist worker.
CONTROLLER_ID = "distrank"


@dataclasses.dataclass
class Gateway:
    """The part of an execnet gateway that node hooks read."""

    id: str


@dataclasses.dataclass
class NodeManager:
    """The part of xdist's NodeManager that node hooks read: no rsync roots (local ranks)."""

    roots: list[Path] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class RankNode:
    """What ``pytest_configure_node`` gets for one rank: what plugins read of xdist's
    WorkerController."""

    config: pytest.Config
    workerinput: dict[str, Any]
    gateway: Gateway
    nodemanager: NodeManager = dataclasses.field(default_factory=NodeManager)


def rank_worker_id(controller_id: str, pool_id: int, rank: int) -> str:
    """A rank's ``workerid``: unique among the processes of the whole run (two pools of a
    session are alive at once, and each xdist worker has its own pool 1), never ``master``."""
    return f"{controller_id}-pool{pool_id}-rank{rank}"


def xdist_environ(workerinput: dict[str, Any]) -> dict[str, str]:
    """The variables an xdist worker sets from its ``workerinput`` (none if a key is missing)."""
    try:
        return {
            "PYTEST_XDIST_WORKER": str(workerinput["workerid"]),
            "PYTEST_XDIST_TESTRUNUID": str(workerinput["testrunuid"]),
            "PYTEST_XDIST_WORKER_COUNT": str(workerinput["workercount"]),
        }
    except KeyError:
        return {}


def is_json_data(value: object) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


class RankInputs:
    """Builds every rank's ``workerinput`` in the controller; one per session.

    ``notes`` receives a line for each value dropped (once per key and plugin).
    """

    def __init__(self, config: pytest.Config, notes: list[str]) -> None:
        self.config = config
        self.notes = notes
        own: dict[str, Any] | None = getattr(config, "workerinput", None)
        #: The controller is an xdist worker: its own workerinput already went through the
        #: xdist controller's node hooks.
        self.under_xdist = own is not None
        self.base: dict[str, Any] = (
            dict(own)
            if own is not None
            else {
                "workerid": CONTROLLER_ID,
                "workercount": 1,
                "testrunuid": uuid.uuid4().hex,
                "mainargv": list(sys.argv),
            }
        )
        self._said: set[str] = set()

    def for_rank(self, pool_id: int, rank: int) -> dict[str, Any]:
        """The ``config.workerinput`` of rank ``rank`` of pool ``pool_id``."""
        workerinput = dict(self.base)
        workerinput["workerid"] = rank_worker_id(str(self.base["workerid"]), pool_id, rank)
        added: dict[str, str] = {}
        if not self.under_xdist:
            added = self._configure_node(workerinput)
        self._randomly_seed(workerinput)
        for key, value in list(workerinput.items()):
            if not is_json_data(value):
                del workerinput[key]
                origin = added.get(key, "")
                self._say(
                    f"config.workerinput[{key!r}]{origin} is not JSON data "
                    f"({type(value).__name__}): ranks do not get it"
                )
        return workerinput

    def _configure_node(self, workerinput: dict[str, Any]) -> dict[str, str]:
        """Call each plugin's ``pytest_configure_node`` as xdist would for a new worker; return
        which plugin added each key (as words for a note)."""
        caller = getattr(self.config.hook, "pytest_configure_node", None)
        if caller is None or not caller.has_spec():  # no pytest-xdist: no node hook
            return {}
        node = RankNode(self.config, workerinput, Gateway(str(workerinput["workerid"])))
        added: dict[str, str] = {}
        for impl in reversed(caller.get_hookimpls()):  # pluggy's order: last registered first
            name = impl.plugin_name
            if name in SKIPPED_NODE_HOOKS or impl.hookwrapper or impl.wrapper:
                continue
            before = set(workerinput)
            try:
                impl.function(*[node for _ in impl.argnames])
            except Exception as exc:
                self._say(
                    f"pytest_configure_node of plugin {name!r} failed in the controller "
                    f"({exc!r}): what it adds to config.workerinput does not reach ranks"
                )
            added.update((key, f" (from plugin {name!r})") for key in set(workerinput) - before)
        return added

    def _randomly_seed(self, workerinput: dict[str, Any]) -> None:
        """pytest-randomly reads ``workerinput["randomly_seed"]`` whenever ``workerinput``
        exists, but adds it only under xdist: hand over the controller's settled seed."""
        if "randomly_seed" in workerinput:
            return
        if self.config.pluginmanager.get_plugin("randomly") is None:
            return
        seed = getattr(self.config.option, "randomly_seed", None)
        if isinstance(seed, int):
            workerinput["randomly_seed"] = seed

    def _say(self, note: str) -> None:
        if note not in self._said:
            self._said.add(note)
            self.notes.append(note)


class WorkerInput:
    """Rank side: what a pytest-xdist worker does between parsing its command line and running
    its session (xdist's ``remote.py``: ``setup_config``, then ``config.workerinput``), before
    any plugin's ``pytest_configure``: the options the rank owns (``cmdline``, a
    :class:`~protocol.RankCommandLine`), ``config.args`` (the pool's ``files``),
    ``config.workerinput`` and an empty ``config.workeroutput``."""

    def __init__(
        self,
        workerinput: dict[str, Any],
        cmdline: RankCommandLine | None = None,
        files: Sequence[str] = (),
    ) -> None:
        self.workerinput = workerinput
        self.cmdline = cmdline
        self.files = list(files)
        self.parser: pytest.Parser | None = None

    @pytest.hookimpl(wrapper=True)
    def pytest_load_initial_conftests(
        self, early_config: pytest.Config, parser: pytest.Parser
    ) -> Generator[None, None, None]:
        """Before any plugin's own (pytest-cov starts measuring in its tryfirst one)."""
        self.parser = parser
        self._reset_groups(early_config.known_args_namespace)
        return (yield)

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_cmdline_parse(self) -> Generator[None, pytest.Config, pytest.Config]:
        """Innermost: before other wrappers act on the parsed options (helpconfig's
        ``--debug`` opens its file in its own)."""
        config = yield
        _compat.keep_rerun_counts_out_of_ranks()  # the controller counts reruns
        if self.cmdline is not None:
            self._reset_groups(config.option)
            for dest, value in self.cmdline.options.items():
                setattr(config.option, dest, value)
            # The cache fixture still works in ranks, unless the user turned the cache off.
            cache = config.pluginmanager.has_plugin("cacheprovider")
            for name in self.cmdline.blocked_plugins:
                config.pluginmanager.set_blocked(name)
            if cache and "cacheprovider" in self.cmdline.blocked_plugins:
                _compat.rank_cache(config)
        if self.files:
            config.args = list(self.files)
            config.args_source = pytest.Config.ArgsSource.ARGS
        if self.workerinput:
            config.workerinput = dict(self.workerinput)  # type: ignore[attr-defined]
            config.workeroutput = {}  # type: ignore[attr-defined]
        return config

    def _reset_groups(self, namespace: Any) -> None:
        """Every option of the groups the rank must not act on, back to its default (as pytest
        sets it before parsing: the last option of a ``dest`` gives its default)."""
        if self.cmdline is None or self.parser is None:
            return
        for name in self.cmdline.reset_groups:
            # getgroup adds an empty group where no plugin made one: it parses nothing.
            for option in self.parser.getgroup(name).options:
                setattr(namespace, option.dest, getattr(option, "default", None))
