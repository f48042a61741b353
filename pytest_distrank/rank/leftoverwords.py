"""The words of what a test left behind in a warm rank, as the rank sends them.

Runs in pool-mode rank processes (:mod:`rank.leftovers` names what it found with these). Words
of what was only named end with :data:`checks.NOT_RESTORED` (or ``still running``): the
controller's summary line (``outcome.checks.leftover_lines``) keeps them apart from what was
restored. torch is imported only where a group is named.
"""

from __future__ import annotations

import time
from typing import Any

from ..outcome.checks import NOT_RESTORED
from ..outcome.merge import ranks_words
from . import processstate as ps

#: What the entries of each named category are, in the words that count those not shown.
NAMES = {
    "path": "sys.path changes",
    "modules": "sys.modules entries",
    "umask": "umask changes",
    "signals": "signal dispositions",
    "logging": "logger changes",
    "children": "child processes still running",
    "sockets": "listening sockets",
}


def env_words(name: str, before: str | None, after: str | None) -> str:
    """An environment variable's change in words; values are not shown (they may be secrets)."""
    if before is None:
        return f"{name} set"
    return f"{name} unset" if after is None else f"{name} changed"


#: At most this many environment variables are named one by one (``os.environ.clear()``).
NAMED_VARIABLES = 6


def few(words: list[str], what: str) -> list[str]:
    """``words``, or its first ones and how many more (a test that cleared the environment
    changed every variable; the line names a few)."""
    if len(words) <= NAMED_VARIABLES:
        return words
    rest = len(words) - NAMED_VARIABLES + 1
    return [*words[: NAMED_VARIABLES - 1], f"{rest} more {what}"]


def named_words(category: str, key: Any, before: Any, after: Any, until: float) -> str | None:
    """The words of a change that is named and not restored (None: not a leftover)."""
    if category == "path":
        return ps.path_words(before, after)
    if category == "modules":
        return ps.module_words(key, before, after)
    if category == "umask":
        return ps.umask_words(after)
    if category == "signals":
        return ps.signal_words(key, after)
    if category == "children":
        if before is None and after is not None and running(key, until):
            return ps.child_words(key, after)
    return None


def not_restored(words: str) -> str:
    """Named only: the summary line keeps these apart from what was restored."""
    return words if words.endswith(" still running") else words + NOT_RESTORED


def running(pid: str, until: float) -> bool:
    """A child still running at ``until`` (one exiting is not a leftover; the children a test
    left share one wait)."""
    while ps.children_state().get(pid) is not None:
        if time.monotonic() >= until:
            return True
        time.sleep(0.01)
    return False


def group_words(pg: Any) -> str:
    """``process group '1' (ranks 0-127)``."""
    import torch.distributed as dist

    if pg is dist.group.WORLD:
        return "the default process group"
    try:
        ranks = ranks_words(dist.get_process_group_ranks(pg))
    except Exception:
        ranks = "ranks ?"
    return f"process group {pg.group_name!r} ({ranks})"
