"""The pytest11 entry point ``distrank``: options, ini keys, markers, hooks, and the gate that
decides which side of the plugin this process is.

Runs in the controller and in every rank process (each rank runs its own pytest session with
``-p distrank``). In a rank, the worker plugin was handed to ``pytest.main`` and this module only
adds the markers, fixtures and hooks; in the controller it also registers the controller.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from . import __version__, _compat, fixtures, hookspecs
from .envvars import RANK_ENV
from .markers import MARKERS
from .options import (
    LEFTOVERS_IGNORE_ENV,
    LEFTOVERS_IGNORE_THREADS,
    OPTIONS,
    START_METHOD,
    SUITES,
    WORLD_SIZE,
)
from .planning import crossize
from .planning.spec import ISOLATE_INI, parametrize_world_sizes
from .planning.tierselect import pytest_collection_modifyitems as pytest_collection_modifyitems
from .settings import Settings, resolve
from .tree.options import MARKER as TREE_MARKER

if TYPE_CHECKING:
    from .launch.harness import Suites

CONTROLLER_NAME = "distrank-controller"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distrank", "pytest-distrank: multi-rank torch.distributed tests")
    for option in OPTIONS:
        help_text = f"{option.help} [env: {option.env}; ini: {option.ini}]"
        if option.is_flag:
            group.addoption(
                option.flag, action="store_true", default=None, dest=option.dest, help=help_text
            )
        else:
            group.addoption(option.flag, default=None, dest=option.dest, help=help_text)
        parser.addini(option.ini, option.help, default="")
    parser.addini(
        ISOLATE_INI,
        "Distributed tests that run on fresh rank processes of their own (node-id patterns, "
        "fnmatch style, one per line), like the distrank_isolate marker, without editing them.",
        type="linelist",
        default=[],
    )
    parser.addini(
        LEFTOVERS_IGNORE_ENV,
        "Environment variables (fnmatch patterns, one per line) that a distributed test may leave "
        "changed in its warm ranks without being named (--distrank-leftovers).",
        type="linelist",
        default=[],
    )
    parser.addini(
        LEFTOVERS_IGNORE_THREADS,
        "Thread names (fnmatch patterns, one per line) that a distributed test may leave running "
        "in its warm ranks without being named (--distrank-leftovers).",
        type="linelist",
        default=[],
    )


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def _in_rank(config: pytest.Config) -> bool:
    """Whether this session is a pool rank's own: its environment names its rank
    (:data:`~envvars.RANK_ENV`) and the rank handed it the worker plugin. The variable alone
    does not make a rank: a pytest that a test in a rank starts inherits it and is a controller
    of its own (as in :func:`launch.env.detect`). Only then is the rank side imported."""
    if RANK_ENV not in os.environ:
        return False
    from .pool.worker.main import WorkerPlugin

    return any(isinstance(p, WorkerPlugin) for p in config.pluginmanager.get_plugins())


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> object:
    """Pool mode: fork the fork server from this process now, before conftest.py files,
    pytest's capture and every plugin's configure (pool/pools/earlyfork.py)."""
    from .launch.env import launch_of
    from .pool.pools import earlyfork
    from .pool.pools.preloads import SHARED_WITH_PYTEST

    try:
        method = resolve(early_config, START_METHOD, early=True).value
        launched = launch_of(early_config, early=True) is not None
    except pytest.UsageError:
        method, launched = "", False  # configure says what is wrong
    if earlyfork.wanted(early_config, method, launched):
        earlyfork.fork_early(SHARED_WITH_PYTEST)
    return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Launcher mode, ranks other than 0: none of the user's report files (pytest-reportlog,
    pytest-html, pytest-json-report), turned off before those plugins open them at configure
    time; rank 0 writes them with every rank's merged reports. Pool ranks have
    ``config.workerinput``, which keeps those plugins quiet as in xdist workers; launched ranks
    cannot have it (pytest-cov and pytest-rerunfailures would take them for xdist workers of a
    controller that does not exist)."""
    if _in_rank(config):
        return
    from .launch.env import launch_of

    launch = launch_of(config)
    if launch is not None and launch.rank != 0:
        _compat.drop_report_files(config)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    for line in (*MARKERS, TREE_MARKER):
        config.addinivalue_line("markers", line)
    from .tree import plugin as tree  # imported where used (16 ms at every pytest start)

    tree.register(config)
    if not config.pluginmanager.is_registered(fixtures):
        config.pluginmanager.register(fixtures, "distrank-fixtures")
    if not config.pluginmanager.is_registered(crossize):  # fixture_path
        config.pluginmanager.register(crossize, "distrank-crossize-fixtures")
    if _in_rank(config):
        _take_existing_suites(config)
        config.pluginmanager.register(crossize.ProducerItems(), "distrank-producer-items")
        return
    from .launch.env import launch_of
    from .planning.tierselect import register_gpu_tier

    launch = launch_of(config)
    register_gpu_tier(config, launch.title if launch is not None else None)  # --distrank-gpus
    if launch is not None:  # launcher mode: this process is one rank of a launched world
        from .launch.plugin import start_launched

        start_launched(config, launch, _launched_suites(config))
        return
    _take_existing_suites(config)
    from .pool.controller import Controller

    controller = Controller(config, Settings.from_config(config))
    config.pluginmanager.register(controller, CONTROLLER_NAME)
    controller.install_sigterm()


def _take_existing_suites(config: pytest.Config) -> bool:
    """Pool mode, controller and ranks alike: PyTorch's harness classes run on warm pools
    (:mod:`pool.suites`), unless ``--distrank-suites=own``."""
    if resolve(config, SUITES).value == "warm":
        from .pool.suites import SuitesPlugin

        config.pluginmanager.register(SuitesPlugin(), "distrank-suites")
        return True
    return False


def _launched_suites(config: pytest.Config) -> Suites | None:
    """Launcher mode: the harness classes are taken over as in pool mode, and pool mode's runner
    runs them in this rank (:mod:`launch.harness`; the modes import nothing of each other)."""
    if not _take_existing_suites(config):
        return None
    from .launch.harness import Suites
    from .pool.worker import harnessenv
    from .pool.worker.dsrank import DeepSpeedRunner
    from .pool.worker.suiterank import SuiteRunner

    return Suites(SuiteRunner(), harnessenv.remember, DeepSpeedRunner())


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # The default size matters for a bare world_size() beside a simulate marker (ids ws<N>).
    parametrize_world_sizes(metafunc, default_size=resolve(metafunc.config, WORLD_SIZE).value)


def pytest_report_header(config: pytest.Config) -> str | None:
    controller = config.pluginmanager.get_plugin(CONTROLLER_NAME)
    if controller is None:
        return None
    from .pool.terminal import header_line

    return header_line(
        controller.settings,
        controller.gpu_policy,
        controller.seed.value,
        controller.order_seed,
        __version__,
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    controller = terminalreporter.config.pluginmanager.get_plugin(CONTROLLER_NAME)
    if controller is None:
        return
    from .pool.terminal import summary_lines

    lines = summary_lines(controller.stats, controller.pools.notes)
    if lines:
        terminalreporter.write_sep("-", "distrank")
        for line in lines:
            terminalreporter.write_line(line)
