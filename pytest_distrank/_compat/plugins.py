"""Other plugins' internals: pytest-rerunfailures' decision functions, pytest-cov's
controller, pytest-json-report's data on reports.

Runs in pool mode's controller (reruns, coverage settings for the ranks, merged reports) and in
its ranks (rerunfailures' verdict on a failure), and in rank 0 of a launched world (merged
reports); through :mod:`pytest_distrank._compat`.
"""

from __future__ import annotations

import inspect
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import pytest

# -- pytest-rerunfailures (its decision functions, read from the installed module) ---------------
#
# Read in 14.0, 15.0, 15.1, 16.0, 16.1 and 16.7: the filters match the report's crash line
# (<= 15.0) or the exception and its chain (>= 15.1); a condition gets no error (14.0, 15.x,
# 16.1), a report holding ``excinfo`` (16.0) or the exception info (16.7); the exclude paths, the
# delay's backoff factor and the suite-wide cap exist only in recent versions. Each function asks
# the installed module for what it has; the parameter names say which form a function takes.

#: The module of pytest-rerunfailures (also its plugin object, registered as ``rerunfailures``).
RERUNFAILURES_MODULE = "pytest_rerunfailures"


def rerunfailures_module(config: pytest.Config) -> Any | None:
    """pytest-rerunfailures' module where this process loaded it, else None.

    Ranks unregister the plugin (``worker.CONTROLLER_ONLY_PLUGINS``) but keep the module and its
    options, which is what its decision functions read; under ``-p no:rerunfailures`` neither
    exists.
    """
    if not hasattr(config.option, "only_rerun"):
        return None
    return sys.modules.get(RERUNFAILURES_MODULE)


def _takes(function: Callable[..., Any], name: str) -> bool:
    return name in inspect.signature(function).parameters


def rerun_count(plugin: Any, item: pytest.Item) -> int | None:
    """``get_reruns_count``: the reruns allowed, or None where neither an option nor a ``flaky``
    marker asks for any (rerunfailures then leaves the test alone)."""
    count = plugin.get_reruns_count(item)
    return None if count is None else int(count)


def rerun_delay(plugin: Any, item: pytest.Item) -> tuple[float, float]:
    """The delay before a rerun and its backoff factor: ``get_reruns_delay`` and
    ``get_reruns_delay_backoff_factor`` (1.0, a constant delay, where the version has none)."""
    factor = getattr(plugin, "get_reruns_delay_backoff_factor", None)
    return float(plugin.get_reruns_delay(item) or 0), float(factor(item)) if factor else 1.0


def rerun_path_excluded(plugin: Any, item: pytest.Item) -> bool:
    """``_is_rerun_path_excluded`` (``--rerun-exclude-path``); False where the version has no
    such option."""
    excluded = getattr(plugin, "_is_rerun_path_excluded", None)
    return bool(excluded(item)) if excluded is not None else False


def rerun_failures_db(config: pytest.Config) -> Any | None:
    """The per-test failure counts rerunfailures keeps (``config.failures_db``; a client of the
    xdist controller's under pytest-xdist); None where it set none."""
    return getattr(config, "failures_db", None)


def take_suite_rerun(config: pytest.Config) -> bool:
    """Take one rerun of ``--max-suite-reruns``, the cap shared by every test of the run; True
    when there is no cap (or the version has none), False when it is used up."""
    cap = getattr(config.option, "max_suite_reruns", None)
    db = rerun_failures_db(config)
    take = getattr(db, "try_increment_suite_reruns", None)
    return True if cap is None or take is None else bool(take(cap))


def rerun_hard_fail(
    plugin: Any, item: pytest.Item, report: pytest.TestReport, excinfo: Any
) -> bool:
    """``_should_hard_fail_on_error``: whether ``--only-rerun``/``--rerun-except`` (or the
    marker's ``only_rerun=``/``rerun_except=``) rule out a rerun for this failure. ``excinfo``
    (None: no exception, such as a crash) where the version reads the exception, else the
    report's crash line."""
    judge = plugin._should_hard_fail_on_error
    if _takes(judge, "excinfo"):
        return bool(judge(item, report, excinfo))
    return bool(judge(item, report))


def rerun_condition(plugin: Any, item: pytest.Item, excinfo: Any) -> bool | None:
    """A ``flaky(condition=...)`` for one failure, through ``evaluate_condition``; None where the
    marker gives no condition. Raises what rerunfailures raises for a condition it cannot
    evaluate (``pytest.fail``, in most versions)."""
    marker = item.get_closest_marker("flaky")
    if marker is None or "condition" not in marker.kwargs:
        return None
    evaluate, condition = plugin.evaluate_condition, marker.kwargs["condition"]
    if _takes(evaluate, "excinfo"):
        return bool(evaluate(item, marker, condition, excinfo))
    if _takes(evaluate, "report"):  # 16.0: a report holding the exception info
        return bool(evaluate(item, marker, condition, types.SimpleNamespace(excinfo=excinfo)))
    return bool(evaluate(item, marker, condition))


#: rerunfailures' plugin name: the controller reruns distributed tests through it, and ranks
#: unregister it (they never rerun on their own).
RERUNFAILURES_PLUGIN = "rerunfailures"


def keep_rerun_counts_out_of_ranks() -> None:
    """In a rank, before plugins configure: pytest-rerunfailures' status client
    (``ClientStatusDB``, with which xdist workers keep rerun counts in the controller's server)
    becomes its no-op ``StatusDB``. The controller decides a distributed test's reruns and keeps
    the suite's counts itself; a client per rank process left the server a socket per rank, and
    in 14.x a thread spinning on each closed connection. Without those names, nothing changes."""
    module = sys.modules.get(RERUNFAILURES_MODULE)
    if module is None:
        return  # not loaded (or blocked): nothing would connect
    no_op = getattr(module, "StatusDB", None)
    if not isinstance(no_op, type) or not hasattr(module, "ClientStatusDB"):
        return

    class RankStatusDB(no_op):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__()

    setattr(module, "ClientStatusDB", RankStatusDB)  # noqa: B010


def rerunfailures_plugin(config: pytest.Config) -> Any | None:
    """The rerunfailures plugin this session registered, or None."""
    return config.pluginmanager.get_plugin(RERUNFAILURES_PLUGIN)


def rerun_attempts_before(config: pytest.Config, nodeid: str, reruns: int) -> int:
    """The attempts of ``nodeid`` made before this one (under pytest-xdist, those that crashed
    a worker: ``failures_db.get_test_failures``), after telling the db its rerun count
    (``set_test_reruns``), as rerunfailures' own protocol does; 0 without a db."""
    db = rerun_failures_db(config)
    if db is None:
        return 0
    done = int(db.get_test_failures(nodeid))
    db.set_test_reruns(nodeid, reruns)
    return done


def count_execution(item: pytest.Item, attempts: int) -> None:
    """Set ``item.execution_count``, which rerunfailures' ``--fail-on-flaky`` reads at session
    end (its ``pytest_sessionfinish``)."""
    setattr(item, "execution_count", attempts)  # noqa: B010


def mark_rerun(report: pytest.TestReport, attempt: int) -> None:
    """Number a report as rerunfailures numbers an attempt's reports (``report.rerun``)."""
    report.rerun = attempt  # type: ignore[attr-defined]


# -- pytest-cov (the controller's measurement, repeated in each rank) ------------------------------

#: pytest-cov's plugin name (its ``CovPlugin``).
PYTEST_COV_PLUGIN = "_cov"


def pytest_cov_settings(config: pytest.Config) -> dict[str, Any] | None:
    """What pytest-cov measures in this process (``cov_controller``: ``cov_source``,
    ``cov_branch``, ``cov_config``, ``topdir`` and its ``Coverage``'s data file), or None where
    it measures nothing. If renamed, ranks are not measured (None)."""
    plugin = config.pluginmanager.get_plugin(PYTEST_COV_PLUGIN)
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


# -- pytest-randomly (who reseeds ``random`` and numpy) -------------------------------------------

#: pytest-randomly's plugin name (its entry point; ``-p no:randomly`` blocks it).
RANDOMLY_PLUGIN = "randomly"


def randomly_reseeds(config: pytest.Config) -> bool:
    """Whether pytest-randomly is active here and reseeds ``random`` and numpy in every phase of
    every test (its ``randomly_reset_seed`` option, off with ``--randomly-dont-reset-seed``).
    If its option is renamed: False, and ``--distrank-seed`` seeds them after it."""
    if config.pluginmanager.get_plugin(RANDOMLY_PLUGIN) is None:
        return False
    return bool(getattr(config.option, "randomly_reset_seed", False))


# -- pytest-json-report (its data on each report) ------------------------------------------------

#: pytest-json-report's data on a report, read in 1.5.0: each phase's output and log records
#: (``report._json_report_extra[when]``) and the test's ``metadata`` (``json_metadata`` fixture,
#: ``pytest_json_runtest_metadata`` hook). Its worker part attaches it in each rank (it finds
#: ``config.workerinput`` there), and it travels in the serialized report as under pytest-xdist;
#: its ``pytest_runtest_logreport`` in the process that writes the file keeps the metadata of
#: the last report that has some. If renamed: merged reports lose the ranks' metadata.
JSON_REPORT_ATTR = "_json_report_extra"


def json_report_data(
    merged: pytest.TestReport, phase: Sequence[tuple[int, Any]], template: Any
) -> None:
    """pytest-json-report's data on a merged report (``phase``: each ``(rank, report)``): the
    phase's output and logs of ``template``, the rank report it was built from (else of the
    lowest rank that has some), and the ``metadata`` of every rank, key by key, the lowest
    rank's value where ranks set different ones."""
    extras = [
        (rank, extra)
        for rank, report in phase
        if isinstance(extra := getattr(report, JSON_REPORT_ATTR, None), dict)
    ]
    if not extras:
        return
    own = getattr(template, JSON_REPORT_ATTR, None)
    data = dict(own if isinstance(own, dict) else min(extras, key=lambda pair: pair[0])[1])
    metadata: dict[Any, Any] = {}
    for _, extra in sorted(extras, key=lambda pair: pair[0], reverse=True):
        if isinstance(extra.get("metadata"), dict):
            metadata.update(extra["metadata"])
    if metadata:
        data["metadata"] = metadata
    setattr(merged, JSON_REPORT_ATTR, data)


#: The options by which report plugins that write a file are asked to: pytest-reportlog's
#: ``--report-log``, pytest-html's ``--html``, pytest-json-report's ``--json-report``,
#: pytest-split's ``--store-durations`` (their ``dest`` names and the value that turns each off).
_REPORT_FILE_OPTIONS = {
    "report_log": None,
    "htmlpath": None,
    "json_report": False,
    "store_durations": False,
}


def drop_report_files(config: pytest.Config) -> list[str]:
    """Turn off the report files of the user's in this process (a launched rank other than 0:
    rank 0 writes them, with every rank's merged reports). Called before those plugins'
    ``pytest_configure``, where they open their files; returns the options it turned off. If
    a plugin renames its option, this rank writes that file again over rank 0's, as before."""
    dropped = []
    for dest, off in _REPORT_FILE_OPTIONS.items():
        if getattr(config.option, dest, off) not in (off, None, False, ""):
            setattr(config.option, dest, off)
            dropped.append(dest)
    return dropped
