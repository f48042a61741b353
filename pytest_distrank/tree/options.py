"""Which tests opted in to the process tree, and how deaths in it count: the marker.

Runs in every pytest process of both modes (the controller and each rank read them). The options
and variables themselves are declared with the others, in options.py and envvars.py.
"""

from __future__ import annotations

import pytest

from ..options import PROCESS_TREE, TREE_DEATHS
from ..settings import Value, resolve

MARKER = (
    "process_tree(deaths='report'): this test's process tree is part of its report: at a "
    "deadline (the plugin's, or pytest-timeout's) or an interrupt the Python stacks of every "
    "process it started; those that died by a signal or a non-zero exit; every one ended "
    "after the test (docs/own-workers.md). deaths='fail' fails the test for a death "
    "(--distrank-tree-deaths)."
)


def opted_in(item: pytest.Item) -> bool:
    """Whether ``item``'s tree is watched: its marker, or the session's option."""
    if item.get_closest_marker("process_tree") is not None:
        return True
    return bool(resolve(item.config, PROCESS_TREE).value)


def deaths_policy(item: pytest.Item) -> Value[str]:
    """'report' or 'fail': the marker's ``deaths=`` beats the session's option."""
    marker = item.get_closest_marker("process_tree")
    raw = marker.kwargs.get("deaths") if marker is not None else None
    if raw is None:
        return resolve(item.config, TREE_DEATHS)
    where = f"@pytest.mark.process_tree(deaths={raw!r})"
    try:
        return Value(TREE_DEATHS.parse(str(raw)), where)
    except ValueError as exc:
        raise pytest.UsageError(f"pytest-distrank: {item.nodeid}: {where}: {exc}") from None
