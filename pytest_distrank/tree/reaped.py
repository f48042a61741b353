"""The exit statuses of the children a process of a test's tree reaps, written where the watch
reads them.

Runs in the process that runs an opted-in test (for the test's length) and in each Python
process the test starts by exec (the fallback's sitecustomize, :mod:`dump`); forks inherit it.
A parent that reaps its child at once (``Process.join``, ``Popen.wait``) leaves /proc no zombie
to read: ``os.waitpid`` is wrapped so that each reaped status is appended to
``<folder>/<pid>.reaped`` as ``pid status seconds-since-epoch`` lines.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

#: Children the plugin itself starts (py-spy): their statuses are not the tree's.
OWN_CHILDREN: set[int] = set()
#: The ``os.waitpid`` found when recording started (the built-in, or another's wrapper, as
#: gevent's), put back when it stops; None while not recording.
_FOUND: list[Callable[..., tuple[int, int]]] = []


def is_death(status: int) -> bool:
    """Whether a waitpid status is an end by a signal or a non-zero exit (not a stop or a
    continue, which ``WUNTRACED`` and ``WCONTINUED`` report)."""
    if os.WIFSTOPPED(status) or os.WIFCONTINUED(status):
        return False
    return status != 0


def record_reaped(folder: str) -> None:
    """Wrap ``os.waitpid`` in this process (idempotent), over whatever ``os.waitpid`` is now."""
    if _FOUND:
        return
    found = os.waitpid
    _FOUND.append(found)

    def waitpid(pid: int, options: int) -> tuple[int, int]:
        __tracebackhide__ = True  # a test's traceback shows os.waitpid's caller, not this
        got, status = found(pid, options)
        if got > 0 and is_death(status) and got not in OWN_CHILDREN:
            try:
                path = os.path.join(folder, f"{os.getpid()}.reaped")
                with open(path, "a") as f:
                    f.write(f"{got} {status} {time.time():.3f}\n")
            except OSError:
                pass
        return got, status

    os.waitpid = waitpid


def stop_recording() -> None:
    """``os.waitpid`` as recording found it."""
    if _FOUND:
        os.waitpid = _FOUND.pop()


def read_reaped(folder: str) -> dict[int, tuple[int, int, float]]:
    """pid -> (its reaper's pid, status, wall time) of each non-zero status in ``folder``."""
    out: dict[int, tuple[int, int, float]] = {}
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".reaped")]
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(folder, name)) as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) == 3:
                try:
                    reaper = int(name.split(".")[0])
                    out[int(parts[0])] = (reaper, int(parts[1]), float(parts[2]))
                except ValueError:
                    continue
    return out
