"""pytest-rerunfailures' verdict on each failure, made where the exception is: in the rank.

Runs in each rank process of a pool (registered by :mod:`main`). A distributed test is rerun by
the controller, on all its ranks as one unit (:mod:`reruns`), but part of the decision reads the
exception a test raised, which only the rank that raised it has: ``--only-rerun`` and
``--rerun-except`` (and the ``flaky`` marker's ``only_rerun=``/``rerun_except=``) match the
exception and its ``__cause__``/``__context__`` chain, and a ``flaky(condition=...)`` callable or
string may read it (``error``). So every failed phase report of a rank carries rerunfailures' own
verdict on that failure, computed here by its own functions (through :mod:`_compat`) as JSON data
(:data:`VERDICT_ATTR`), which pytest's report serialization keeps. The controller takes the
verdict of the root-cause rank.

The filters' values come from the controller: a rank sets pytest-rerunfailures' options back to
their defaults after parsing (``cmdline.RESET_GROUPS``), then sets the controller's
``--only-rerun``/``--rerun-except`` values among the options a rank owns
(``cmdline.rank_command_line``); ini values reach the rank through the ini file, as always.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from ... import _compat

#: Attribute of a rank's failed report: rerunfailures' verdict on that failure, a dict with
#: ``hard_fail`` (bool: the filters rule a rerun out), ``condition`` (bool, or None without a
#: ``flaky(condition=...)``) and, when the condition could not be evaluated, ``error`` (the
#: message rerunfailures fails the session with).
VERDICT_ATTR = "distrank_rerun_verdict"
#: pytest-rerunfailures' options (``dest``) that the rank's verdict reads from its config.
FILTER_OPTIONS = ("only_rerun", "rerun_except")


def verdict(
    plugin: Any, item: pytest.Item, report: pytest.TestReport, excinfo: Any
) -> dict[str, Any]:
    """rerunfailures' verdict on one failed phase report, as plain data (see VERDICT_ATTR)."""
    out: dict[str, Any] = {"hard_fail": _compat.rerun_hard_fail(plugin, item, report, excinfo)}
    try:
        out["condition"] = _compat.rerun_condition(plugin, item, excinfo)
    except pytest.fail.Exception as exc:
        out["condition"], out["error"] = False, str(exc.msg)
    return out


class RankVerdicts:
    """The rank's plugin: puts :func:`verdict` on every failed phase report."""

    def __init__(self) -> None:
        #: pytest-rerunfailures' module, or None: it is not loaded, nothing to judge.
        self.plugin: Any = None

    def pytest_configure(self, config: pytest.Config) -> None:
        self.plugin = _compat.rerunfailures_module(config)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """Outermost, so that it sees the report as every other plugin left it (xfail)."""
        report = yield
        if report.failed and self.plugin is not None:
            setattr(report, VERDICT_ATTR, verdict(self.plugin, item, report, call.excinfo))
        return report
