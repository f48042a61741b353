"""The entry point of a rank process of a pool: from the fork server's fork to ``os._exit``.

Runs in each rank process (started by the fork server, or spawned), before and around the rank's
pytest session: detaches from the fork server (so it dies with the controller), sends its output
to a per-rank log, sets its environment and working folder, starts coverage when pytest-cov
measures the controller, runs ``pytest.main`` with :class:`main.WorkerPlugin` (which serves the
controller's tests), and tells the controller when the session ended before or while serving.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

import pytest

from ... import _compat
from ...envvars import PROFILE_ENV
from ..protocol import Fatal, RankConfig
from ..workerinput import WorkerInput, xdist_environ
from . import harnessenv, ranklogs
from .main import WorkerPlugin
from .rankfr import start_responder
from .rankproc import detach_from_controller_tree, rank_env
from .template import TemplatePlugin


def rank_main(cfg: RankConfig, conn: Connection, phases: Any, parent_pid: int) -> None:
    """Entry point of a rank process. Never returns: ends with ``os._exit``."""
    code = 0
    try:
        detach_from_controller_tree(parent_pid)
        log_fd = os.open(cfg.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.clear()
        os.environ.update(rank_env(cfg))
        os.environ.update(xdist_environ(cfg.workerinput))  # as in an xdist worker (workerinput.py)
        harnessenv.remember(cfg.env)  # what a harness class's test sees instead (harnessenv.py)
        # A process started by a multiprocessing context takes its start method as its default
        # (the fork server's: a DataLoader's workers would start a fork server of their own and
        # need picklable datasets); a rank starts with a fresh process's default, as a torchrun
        # rank does. A conftest that sets one sets it again here.
        multiprocessing.set_start_method(None, force=True)
        os.chdir(cfg.cmdline.invocation_dir)  # relative paths in the arguments mean the same
        ranklogs.install()  # pytest's log capture without its per-phase handler churn
        if cfg.rewritten:  # read the test modules the controller rewrote (no bytecode written)
            _compat.share_rewritten_modules(cfg.rewritten)
        start_responder(cfg.log_path)  # flight-recorder dumps on request, even inside C++
        plugin = WorkerPlugin(cfg, conn, phases, log_fd)
        plugin.coverage = _start_coverage(cfg.coverage)
        plugins = [plugin, WorkerInput(cfg.workerinput, cfg.cmdline, cfg.files)]
        if cfg.template:  # configures pytest, loads no conftest, forks fresh ranks (template.py)
            plugins.append(TemplatePlugin(plugin))
        profile_dir = os.environ.get(PROFILE_ENV)
        if profile_dir:  # a developer's tool: where does a rank's time go?
            import cProfile

            profiler = cProfile.Profile()
            exit_code = profiler.runcall(pytest.main, list(cfg.cmdline.args), plugins=plugins)
            profiler.dump_stats(os.path.join(profile_dir, f"pool{cfg.pool_id}-rank{cfg.rank}.prof"))
        else:
            exit_code = pytest.main(list(cfg.cmdline.args), plugins=plugins)
        cfg, conn = plugin.cfg, plugin.conn  # a rank forked from a template: its own (template.py)
        if not plugin.served:
            conn.send(Fatal(cfg.rank, _early_exit_message(cfg, exit_code)))
            code = 3
        elif not plugin.stopped and os.getpid() == plugin.pid:
            # The session ended while serving: pytest.exit() or KeyboardInterrupt in a test.
            why = plugin.interrupted or f"its pytest session ended (exit code {exit_code})"
            conn.send(Fatal(cfg.rank, why))
            code = 4
    except BaseException:
        with contextlib.suppress(BaseException):
            conn.send(Fatal(cfg.rank, traceback.format_exc()))
        code = 2
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
            conn.close()
        os._exit(code)


def _early_exit_message(cfg: RankConfig, exit_code: object) -> str:
    return (
        f"its pytest session ended before serving tests (exit code {exit_code}); "
        "typically a conftest.py or plugin that fails only inside ranks."
    )


def _start_coverage(settings: dict[str, Any] | None) -> Any:
    """Measure this rank like the controller's pytest-cov does (see cmdline.coverage_settings).

    Started before the rank's pytest session, so conftest files and test modules imported in
    the rank count. Modules the fork server preloaded were imported before: their import-time
    lines are not measured here (the controller imports them too).
    """
    if not settings:
        return None
    import coverage

    options = dict(settings)
    topdir = options.pop("topdir")
    cwd = os.getcwd()
    os.chdir(topdir)  # relative source and config paths mean what they mean to pytest-cov
    try:
        cov = coverage.Coverage(data_suffix=True, **options)
    finally:
        os.chdir(cwd)
    cov.set_option(
        "run:disable_warnings",
        ["no-data-collected", "module-not-measured", "module-not-imported"],
    )
    cov.start()
    return cov
