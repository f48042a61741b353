"""Helpers for the plugin's end-to-end tests (run in the outer pytest process).

Every end-to-end test runs pytest in a subprocess (``runpytest_subprocess``) so that rank
processes never belong to this process, with a hard timeout, and afterwards checks that no
process the inner session started is still alive: each inner session is tagged through an
environment variable that its fork server and ranks inherit.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
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


RunPytest = Callable[..., pytest.RunResult]


@pytest.fixture
def run_pytest(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunPytest]:
    """Run ``pytest -p distrank ARGS`` in a subprocess; fail the test if a process outlives it."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv(TAG_ENV, tag)
    monkeypatch.setenv("COLUMNS", "200")  # short summary lines are not trimmed

    def run(*args: str, timeout: float = RUN_TIMEOUT) -> pytest.RunResult:
        return pytester.runpytest_subprocess("-p", "distrank", *args, timeout=timeout)

    yield run
    leftover = wait_gone(tag, 15)
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"processes outlived their pytest session: {leftover}"
