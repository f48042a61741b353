"""Shared helpers of the plugin's tests; they run in the outer pytest process.

Every end-to-end test runs pytest in a subprocess (``runpytest_subprocess``) so that rank
processes never belong to this process, with a hard timeout, and afterwards checks that no
process the inner session started is still alive: each inner session is tagged through an
environment variable that its fork server and ranks inherit.

This module holds what those checks share: the tag's variable (``TAG_ENV``), the bound on one
inner run (``RUN_TIMEOUT``), the search for tagged processes (``tagged_pids``, ``wait_gone``) and
the type of the ``run_pytest`` fixture (``RunPytest``). The fixtures themselves are in
``conftest.py``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

TAG_ENV = "DISTRANK_TEST_TAG"
#: Bound on one inner pytest run; a deadlocked case fails instead of hanging CI.
RUN_TIMEOUT = 180


def tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries ``DISTRANK_TEST_TAG=tag``."""
    needle = f"{TAG_ENV}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def wait_gone(tag: str, seconds: float) -> list[int]:
    """Wait until no tagged process is left; return the ones still alive after ``seconds``."""
    end = time.monotonic() + seconds
    while True:
        alive = tagged_pids(tag)
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.1)


#: The ``run_pytest`` fixture: ``run_pytest(*args, timeout=RUN_TIMEOUT)``.
RunPytest = Callable[..., pytest.RunResult]
