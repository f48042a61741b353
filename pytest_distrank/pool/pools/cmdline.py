"""The command line of a rank's own pytest session, built by the controller.

Runs in the controller. A rank's pytest parses the controller's own command line again, as a
pytest-xdist worker does (xdist sends ``config.invocation_params.args`` and, once the worker's
pytest has parsed them, sets what the worker owns in ``config.option``): pytest itself reads every
option, from the controller's invocation folder, with the controller's ini file (and its
``addopts``, read again there) and ``PYTEST_ADDOPTS`` (passed ahead of the invocation arguments,
where pytest puts it: the ranks' environment leaves the variable out). So ``--runxfail``, ``-s``,
``-p`` plugins, ``-W`` filters, ``@file`` arguments and the options a conftest.py adds mean in
every rank what they mean in the controller.

What a rank owns is set where pytest reads it (:class:`~protocol.RankCommandLine`):

- before parsing, as arguments after the controller's (before its ``--``, if any): the plugin,
  under the name the controller loaded it by (``-p distrank`` when the entry point loaded it, as
  pytest refuses a second name for a registered plugin; ``-p pytest_distrank.plugin`` when a
  checkout on PYTHONPATH did), after any ``-p no:distrank`` of the ini's ``addopts``; the
  controller's rootdir and ini file, so that node ids match; ``-o log_file=`` (an ini
  ``log_file`` would be truncated by every rank); ``--capture=no`` for the rank whose output is
  shown live; and last, so that it wins over the user's ``-W error``, the filter for the one
  warning the fork server causes;
- right after parsing, before any plugin's ``pytest_configure`` (``workerinput.WorkerInput``,
  where the rank gets ``config.workerinput``): ``config.args`` becomes the pool's files (the
  controller's positional arguments chose its initial conftests, as in the controller, and
  nothing else); :data:`NEUTRAL_OPTIONS` (selection, and what the controller owns); a basetemp per
  rank; the controller's verbosity as an int (a conftest may set ``config.option.verbose =
  True``); ``--continue-on-collection-errors``; the cache provider and stepwise blocked (a ``-p
  no:cacheprovider`` before parsing would make ``--lf`` an unknown option);
- every option of :data:`RESET_GROUPS` back to its default, both before the initial conftests load
  (pytest-cov starts measuring there) and after parsing.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import pytest

from ... import _compat
from ..protocol import RankCommandLine
from ..worker.rankreruns import FILTER_OPTIONS

#: The plugin's module, found among the registered plugins (importing it here would close an
#: import cycle: the plugin imports the controller, which imports this module).
PLUGIN_MODULE = "pytest_distrank.plugin"

#: The fork server imported the plugin before the rank's pytest session could mark it for
#: assertion rewriting; that warning must not become an error under filterwarnings=error or -W
#: error. It goes last: of Python's warning filters, the one given last wins.
REWRITE_WARNING_FILTER = (
    "ignore:Module already imported so cannot be rewritten:pytest.PytestAssertRewriteWarning"
)

#: pytest's own options (by ``dest``) that must not act in a rank, with the value that makes each
#: inert (pytest's default).
NEUTRAL_OPTIONS: dict[str, Any] = {
    # Selection: the controller selected; a rank collects its pool's files and serves the node
    # ids the controller planned.
    "keyword": "", "markexpr": "", "deselect": None, "ignore": None, "ignore_glob": None,
    "pyargs": False, "lf": False, "failedfirst": False, "newfirst": False,
    "last_failed_no_failures": "all",
    "stepwise": False, "stepwise_skip": False, "stepwise_reset": False,
    # What the controller owns (it decides, reports and debugs) or a rank must not do.
    "maxfail": 0, "xmlpath": None, "junitprefix": None,
    "usepdb": False, "usepdb_cls": None, "trace": False,
    "cacheshow": None, "cacheclear": False, "debug": None, "log_file": None, "pastebin": None,
    "session_timeout": None,
    # pytest-split: the controller selects its group and stores the durations, from the merged
    # reports; ranks that did either would deselect tests of their own collection, and write
    # the durations file (with their own numbers) while another pool's ranks read it.
    "splits": None, "group": None, "store_durations": False,
    # Modes that run no test: the controller runs none in them either.
    "collectonly": False, "help": False, "version": 0, "markers": False,
    "showfixtures": False, "show_fixtures_per_test": False,
}  # fmt: skip
#: Option groups (``parser.getgroup`` names) of plugins whose work the controller does for its
#: ranks: pytest-xdist, pytest-cov (worker/entry.py measures ranks itself), pytest-rerunfailures
#: (the controller reruns) and this plugin's own ``--distrank-*``.
RESET_GROUPS = ("xdist", "cov", "rerunfailures", "distrank")
#: No cache provider in ranks (no ``.pytest_cache`` reads or writes); stepwise needs it, as
#: pytest's own ``-p no:cacheprovider`` knows.
BLOCKED_PLUGINS = ("cacheprovider", "stepwise")


def rank_command_line(
    config: pytest.Config, basetemp: Path, *, live: bool = False
) -> RankCommandLine:
    """One rank's command line; ``live``: its output is shown as it comes (``--capture=no``)."""
    own = ["-p", _plugin_name(config), f"--rootdir={config.rootpath}"]
    if config.inipath is not None:
        own.append(f"-c={config.inipath}")
    own += ["-o", "log_file="]
    if live:
        own.append("--capture=no")
    own += ["-W", REWRITE_WARNING_FILTER]
    given = shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))
    given += [os.fspath(a) for a in config.invocation_params.args]
    end = given.index("--") if "--" in given else len(given)  # what follows is positional
    options = dict(NEUTRAL_OPTIONS)
    options.update(
        basetemp=str(basetemp),
        # The rank renders its failures: it must do so as verbosely as the controller does.
        verbose=_as_int(getattr(config.option, "verbose", 0)),
        continue_on_collection_errors=True,
        # The distrank group is reset in ranks: the deadline a test's in_child counts from.
        distrank_timeout=getattr(config.option, "distrank_timeout", None),
    )
    for name in FILTER_OPTIONS:  # rerunfailures' filters, judged in the rank that raised
        value = getattr(config.option, name, None)
        if value is not None:
            options[name] = list(value)
    return RankCommandLine(
        args=(*given[:end], *own, *given[end:]),
        invocation_dir=str(config.invocation_params.dir),
        options=options,
        reset_groups=RESET_GROUPS,
        blocked_plugins=BLOCKED_PLUGINS,
    )


def _plugin_name(config: pytest.Config) -> str:
    """The name the controller registered the plugin under: the rank loads it the same way.

    ``distrank`` when the entry point loaded it (autoload or ``-p distrank``); the module path
    (``pytest_distrank.plugin``) when ``-p``, ``PYTEST_PLUGINS`` or a conftest's
    ``pytest_plugins`` imported it from a checkout that is not installed.
    """
    for name, registered in config.pluginmanager.list_name_plugin():
        if getattr(registered, "__name__", None) == PLUGIN_MODULE:
            return name
    return "distrank"


def _as_int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def coverage_settings(config: pytest.Config) -> dict[str, Any] | None:
    """What a rank needs to measure coverage like the controller's pytest-cov, or None.

    pytest-cov measures only the process it runs in. Each rank starts its own
    ``coverage.Coverage`` with the controller's source, branch and config file, and saves a
    parallel data file (``.coverage.<host>.<pid>.<random>``) beside the controller's, where
    pytest-cov combines it into the report. Works the same under xdist (the controller is then a
    worker whose data the xdist controller combines).
    """
    return _compat.pytest_cov_settings(config)
