"""The command line of a rank's own pytest session (PITFALLS 4).

Runs in the controller. A rank runs pytest over the files of its pool only, with the controller's
rootdir and ini file (so node ids match), ``-o addopts=`` (so an ini ``--junitxml``, ``-n`` or
``-x`` does not run in every rank), its own basetemp, no cache provider, and the controller's
options that change how a test runs or how its failure reads (capture, import mode, ``-p``, ``-W``,
``--tb``, verbosity, ``--log-level``, ``-o`` ...).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

#: The fork server imported the plugin before the rank's pytest session could mark it for
#: assertion rewriting; that warning must not become an error under filterwarnings=error.
REWRITE_WARNING_FILTER = (
    "ignore:Module already imported so cannot be rewritten:pytest.PytestAssertRewriteWarning"
)


def rank_pytest_args(config: pytest.Config, files: list[str], basetemp: Path) -> list[str]:
    """Arguments for ``pytest.main`` in a rank that serves tests from ``files``."""
    option = config.option
    args = [
        *files,
        "-p",
        "distrank",
        "-p",
        "no:cacheprovider",
        f"--rootdir={config.rootpath}",
        f"--basetemp={basetemp}",
        f"--capture={getattr(option, 'capture', 'fd')}",
        f"--import-mode={getattr(option, 'importmode', 'prepend')}",
        "--continue-on-collection-errors",
        # The rank renders its failures: it must do so as the user asked the controller to.
        f"--tb={getattr(option, 'tbstyle', 'auto')}",
        f"--verbosity={getattr(option, 'verbose', 0)}",
        f"--assert={getattr(option, 'assertmode', 'rewrite')}",
    ]
    if getattr(option, "showlocals", False):
        args.append("--showlocals")
    if config.inipath is not None:
        args.append(f"-c={config.inipath}")
    for name in getattr(option, "plugins", None) or []:
        if name not in ("distrank", "pytest_distrank.plugin"):
            args += ["-p", name]
    args += ["-W", REWRITE_WARNING_FILTER]
    for spec in getattr(config.known_args_namespace, "pythonwarnings", None) or []:
        args += ["-W", spec]
    if getattr(option, "log_level", None):
        args.append(f"--log-level={option.log_level}")
    if getattr(option, "confcutdir", None):
        args.append(f"--confcutdir={option.confcutdir}")
    if getattr(option, "noconftest", False):
        args.append("--noconftest")
    if getattr(option, "strict_markers", False):
        args.append("--strict-markers")
    for override in getattr(option, "override_ini", None) or []:
        if not override.startswith("addopts"):
            args += ["-o", override]
    args += ["-o", "addopts="]
    return args


def coverage_settings(config: pytest.Config) -> dict[str, Any] | None:
    """What a rank needs to measure coverage like the controller's pytest-cov, or None.

    pytest-cov measures only the process it runs in. Each rank starts its own
    ``coverage.Coverage`` with the controller's source, branch and config file, and saves a
    parallel data file (``.coverage.<host>.<pid>.<random>``) beside the controller's, where
    pytest-cov combines it into the report. Works the same under xdist (the controller is then a
    worker whose data the xdist controller combines).
    """
    plugin = config.pluginmanager.get_plugin("_cov")
    controller = getattr(plugin, "cov_controller", None)
    cov = getattr(controller, "cov", None)
    if controller is None or cov is None:
        return None
    topdir = str(getattr(controller, "topdir", os.getcwd()))
    return {
        "source": controller.cov_source,
        "branch": controller.cov_branch,
        # Relative, as pytest-cov passes it (coverage treats ".coveragerc" as optional); the
        # rank builds its Coverage in topdir.
        "config_file": controller.cov_config,
        "data_file": os.path.join(topdir, cov.config.data_file),
        "topdir": topdir,
    }
