"""Every process a rank starts dies with its pool: find a rank's descendants and end them.

Runs in the controller (when a pool is killed or stopped) and in each rank (at its own stop).
Linux only, through /proc, like the rest of the process handling. Three nets, because tests
start processes in every way there is:

- each rank leads its own process group: ``killpg`` ends children that stayed in it, even after
  the rank itself died;
- each rank is a child subreaper (``PR_SET_CHILD_SUBREAPER``): a grandchild whose parent exited
  (a double fork, a daemon that called ``setsid``) is re-parented to the rank, not to init, so
  it is still found among the rank's descendants while the rank lives;
- each rank carries its pool's tag in its environment (:data:`envvars.POOL_TAG_ENV`), which every
  descendant inherits unless it clears its environment: processes of a rank that already died
  (their subreaper gone) are found by the tag.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Callable

from ..envvars import POOL_TAG_ENV

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Adopt this process's orphaned descendants (called in each rank at start)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def proc_stat(pid: int | str) -> tuple[str, int] | None:
    """A process's state letter (``R``, ``S``, ``T``, ``Z`` ...) and parent pid, from /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process (a /proc walk: a few ms)."""
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = proc_stat(entry)
            if stat is not None:
                out[int(entry)] = stat[1]
    return out


def living_children(pid: int) -> list[int]:
    """The direct children of ``pid`` that have not exited (zombies left out)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = proc_stat(entry)
            if stat is not None and stat[1] == pid and stat[0] != "Z":
                out.append(int(entry))
    return out


def _children_of(pid: int) -> list[int]:
    """``pid``'s children, from ``/proc/<pid>/task/<tid>/children`` of each of its threads (an
    orphan a subreaper adopts may be any thread's child); [] when it is gone."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(child) for child in f.read().split())
    return out


#: Whether the kernel lists each task's children (``CONFIG_PROC_CHILDREN``): then a rank's
#: descendants are read from its own tree, not from a walk over every process of the machine
#: (a rank's stop, fresh ranks' above all: ~1.5 ms of CPU with a hundred processes).
LISTS_CHILDREN = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _every_processs_children() -> Callable[[int], list[int]]:
    """Children by parent, from a walk over every process (a kernel that lists no children)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    return lambda pid: children.get(pid, [])


def descendants(roots: list[int]) -> set[int]:
    """Every living descendant of ``roots`` (not the roots themselves)."""
    children_of = _children_of if LISTS_CHILDREN else _every_processs_children()
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children_of(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found - set(roots)


def tagged(tag: str) -> set[int]:
    """Processes whose environment carries ``DISTRANK_POOL_TAG=tag`` (this one excluded)."""
    needle = f"{POOL_TAG_ENV}={tag}".encode()
    me = os.getpid()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.add(int(entry))
        except OSError:
            continue
    return found


def kill_all(pids: set[int] | list[int]) -> None:
    """SIGKILL each process and its process group; gone ones are skipped."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def reap_children() -> None:
    """Collect exited children (adopted orphans included) so that none stays a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
