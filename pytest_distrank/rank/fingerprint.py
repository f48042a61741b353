"""Cheap marks of a rank's process state: a leftover check's read that would find nothing is
skipped.

Runs in pool-mode rank processes (:mod:`rank.processstate` reads through these at every
:class:`snapshot.Snapshot`: after each test, and at its start where that is read in full). Each
mark changes whenever the walk it stands for could read something else
(tests/unit/test_leftovers_fingerprint.py checks it against the walk, for every kind of change
the leftover property test makes):

- **child processes**: the pid namespace's last allocated pid (``/proc/sys/kernel/ns_last_pid``,
  one read). A walk that found no child at all is reused while it stays the same: a child is
  made only by creating a process, which moves it, and a rank with no child has no descendant to
  adopt. When the last walk found children (a compile worker, a resource tracker), when the mark
  cannot be read, or when any process of the namespace was created since, the children are
  walked (``/proc/self/task/*/children``). Only a counter that wraps around to the very same pid
  between two reads could hide a child.

No cheap mark sees the rest, so it is read on every snapshot: torch's flags and the process-wide
switches (direct reads, a few us each), ``sys.modules`` (an entry replaced keeps its length: it
is copied, ~15 us), signal dispositions (``signal.signal`` keeps no count), loggers
(``propagate`` and ``disabled`` are plain attributes), and the sockets held open (a descriptor
closed and reopened as a socket keeps its number: each is read with ``readlink``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

#: The pid namespace's last allocated pid (Linux 3.3+; readable by every user).
LAST_PID = "/proc/sys/kernel/ns_last_pid"


def last_pid() -> bytes | None:
    """The mark of process creation in this pid namespace, or None where it cannot be read."""
    try:
        fd = os.open(LAST_PID, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 32)
    except OSError:
        return None
    finally:
        os.close(fd)


class Children:
    """The walk of a rank's children, skipped while none exist and no process was created."""

    def __init__(self) -> None:
        #: The mark read before the last walk, kept only when that walk found no child at all.
        self.quiet: bytes | None = None

    def read(self, walk: Callable[[], tuple[dict[str, Any], bool]]) -> dict[str, Any]:
        """``walk()``'s children, or {} when its last call found none and the mark is unchanged.
        ``walk`` returns (the children named, whether any child at all was listed)."""
        mark = last_pid()  # before the walk: a child made during it moves the mark after it
        if mark is not None and mark == self.quiet:
            return {}
        found, any_child = walk()
        self.quiet = None if any_child else mark
        return found


CHILDREN = Children()
