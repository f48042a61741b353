"""Cheap marks of a rank's process state: a leftover check's read is skipped, or its last result
reused, where the mark shows it cannot read otherwise.

Runs in pool-mode rank processes (:mod:`rank.processstate` reads through these at every
:class:`snapshot.Snapshot`: after each test, and at its start where that is read in full). Each
mark changes whenever the walk it stands for could read something else
(tests/unit/test_leftovers_fingerprint.py checks it against the walk, for every kind of change
the leftover property test makes):

- **child processes**: whether the rank has any child at all (``waitid(P_ALL, WNOHANG |
  WNOWAIT | __WALL)``: one call, ECHILD when none, reaping nothing). The children are walked
  (``/proc/self/task/*/children``) only when it has one (a compile worker, a resource tracker,
  a test's): a child, or an orphan of one adopted by the rank (a subreaper), is a child of one
  of its threads, which ``waitid`` waits for. Other processes of the machine do not count
  (the pid namespace's last pid, the mark before, moved with every process on a busy machine).
- **``sys.modules`` and the list of loggers**: the version of the dict they are read from
  (PEP 509: CPython 3.11-3.13 gives every dict a version, globally unique, that changes on every
  change of its content; read with ``ctypes``, checked at first use on a dict of its own, unused
  where that check fails). While ``(id, version)`` is the one read before the last copy, the
  copy stands (:class:`Marked`): the snapshot shares it, and the compare sees the same object.
  (The environment and ``threading``'s tables were tried too: their marks cost more than their
  copies, in a test's flow.)
- **loggers**: the list of loggers is kept while ``loggerDict``'s version stays; each logger's
  level, handlers, propagation and disabled flag are read raw (two C-level maps, ~10 us for 120
  loggers), and the category is built from them only when they differ from the last read's.

No cheap mark sees the rest, or none that pays, so it is read on every snapshot: the
environment and the threads (plain copies), process groups (a last read kept would keep a
destroyed group, and its listening socket, alive), torch's flags (torch's C getters, looked up
once: ~13 us) and the process-wide switches, signal dispositions (``signal.signal`` keeps no
count), and the sockets held open (a descriptor closed and reopened as a socket keeps its
number: each is read with ``readlink``, ~1 us a descriptor).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: ``waitid``'s options: any child (exited or not, of any thread, cloned or forked:
#: ``__WALL``), without waiting and without reaping it.
_ANY_CHILD = (
    getattr(os, "WEXITED", 0) | getattr(os, "WNOHANG", 0) | getattr(os, "WNOWAIT", 0) | 0x40000000
)


def has_children() -> bool | None:
    """Whether this process has a child (running, or exited and not waited for) of any of its
    threads; None where the kernel cannot be asked (no ``waitid``, or it refused the options)."""
    waitid = getattr(os, "waitid", None)
    if waitid is None:
        return None
    try:
        waitid(os.P_ALL, 0, _ANY_CHILD)
    except ChildProcessError:  # ECHILD: no child at all
        return False
    except OSError:
        return None
    return True


class Marked:
    """A walk's last result, given again while the mark read before it is unchanged (a mark of
    None: walked every time). The result is shared: its readers never change it in place."""

    def __init__(self) -> None:
        self.mark: Any = None
        self.value: Any = None

    def read(self, mark: Any, walk: Callable[[], T]) -> T:
        if mark is not None and mark == self.mark:
            return self.value  # type: ignore[no-any-return]
        value = walk()
        self.mark, self.value = mark, value
        return value


def dict_mark(d: dict[Any, Any]) -> tuple[int, int] | None:
    """``d``'s identity and version (changed by every change of its content), or None where
    this Python keeps no version (:func:`_version_reader`)."""
    version = _version_reader()
    return None if version is None else (id(d), version(d))


@functools.cache
def _version_reader() -> Callable[[dict[Any, Any]], int] | None:
    """A reader of a dict's ``ma_version_tag`` (CPython 3.11-3.13, PEP 509: after the object's
    header and ``ma_used``), or None where the layout or behaviour is not that: checked once on
    a dict of its own (its length where ``ma_used`` is, a new version after every change)."""
    if sys.implementation.name != "cpython" or not (3, 11) <= sys.version_info[:2] <= (3, 13):
        return None
    try:
        import ctypes
    except ImportError:  # a Python built without it
        return None
    head = object.__basicsize__
    used, tag = ctypes.c_ssize_t.from_address, ctypes.c_uint64.from_address

    def version(d: dict[Any, Any]) -> int:
        return int(tag(id(d) + head + 8).value)

    probe: dict[str, int] = {}
    seen = [version(probe)]
    for change in (
        lambda: probe.__setitem__("a", 1),
        lambda: probe.__setitem__("a", 2),
        lambda: probe.update(b=3),
        lambda: probe.pop("a"),
        probe.clear,
    ):
        change()
        if used(id(probe) + head).value != len(probe) or version(probe) in seen:
            return None
        seen.append(version(probe))
    return version


#: The last copy of ``sys.modules``; the list of loggers, and the logging category built from
#: their raw state.
MODULES = Marked()
LOGGERS = Marked()
LOGGING = Marked()
