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

_ORIGINAL: Callable[..., tuple[int, int]] = os.waitpid
#: Children the plugin itself starts (py-spy): their statuses are not the tree's.
OWN_CHILDREN: set[int] = set()


def record_reaped(folder: str) -> None:
    """Wrap ``os.waitpid`` in this process (idempotent)."""

    def waitpid(pid: int, options: int) -> tuple[int, int]:
        __tracebackhide__ = True  # a test's traceback shows os.waitpid's caller, not this
        got, status = _ORIGINAL(pid, options)
        if got > 0 and status != 0 and got not in OWN_CHILDREN:
            try:
                path = os.path.join(folder, f"{os.getpid()}.reaped")
                with open(path, "a") as f:
                    f.write(f"{got} {status} {time.time():.3f}\n")
            except OSError:
                pass
        return got, status

    if os.waitpid is _ORIGINAL:
        os.waitpid = waitpid


def stop_recording() -> None:
    os.waitpid = _ORIGINAL


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
