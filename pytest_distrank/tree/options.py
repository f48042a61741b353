"""The process-tree options, marker and test seams.

Runs in every pytest process of both modes (the controller and each rank read them; plugin.py
declares them beside :data:`settings.OPTIONS`).
"""

from __future__ import annotations

import pytest

from ..parsing import one_of, parse_bool
from ..settings import Option, Value, resolve

PROCESS_TREE = Option(
    "distrank_process_tree",
    "--distrank-process-tree",
    "DISTRANK_PROCESS_TREE",
    "false",
    "Every test's process tree is part of its report (as @pytest.mark.process_tree): the "
    "stacks of the processes it started at a deadline or an interrupt, those that died during "
    "it, and all of them ended after it (docs/own-workers.md).",
    parse_bool,
    is_flag=True,
)
TREE_DEATHS = Option(
    "distrank_tree_deaths",
    "--distrank-tree-deaths",
    "DISTRANK_TREE_DEATHS",
    "report",
    "A process of a test's tree that died by a signal or a non-zero exit during the test: "
    "'report' (default: a section of the test's report, the test's outcome unchanged) or "
    "'fail' (the test fails for it).",
    one_of(("report", "fail")),
)
OPTIONS = (PROCESS_TREE, TREE_DEATHS)

MARKER = (
    "process_tree: this test's process tree is part of its report: at a deadline (the "
    "plugin's, or pytest-timeout's) or an interrupt the Python stacks of every process it "
    "started; those that died by a signal or a non-zero exit; every one ended after the test "
    "(docs/own-workers.md)."
)

#: Test seam, not for users: the py-spy executable to run ("none": as if it were not installed;
#: a script that fails the way a ptrace refusal does tests that path).
PYSPY_ENV = "DISTRANK_TREE_PYSPY"
#: Where the faulthandler fallback's dump files go (set by the controller, inherited by ranks).
DIR_ENV = "DISTRANK_TREE_DIR"


def opted_in(item: pytest.Item) -> bool:
    """Whether ``item``'s tree is watched: its marker, or the session's option."""
    if item.get_closest_marker("process_tree") is not None:
        return True
    return bool(resolve(item.config, PROCESS_TREE).value)


def deaths_policy(config: pytest.Config) -> Value[str]:
    return resolve(config, TREE_DEATHS)
