"""Unit: a process's descendants (rank/reaper.py), read from the kernel's lists of each thread's
children, are those a walk over every process finds: children of any thread, grandchildren."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from pytest_distrank.rank import reaper

pytestmark = pytest.mark.skipif(not reaper.LISTS_CHILDREN, reason="no /proc/<pid>/task/*/children")


@pytest.fixture
def tree() -> Iterator[list[subprocess.Popen[bytes]]]:
    """A shell with two sleeping children of its own, started from the main thread, and a sleep
    started from another thread that stays alive meanwhile (the kernel lists the child as that
    thread's; when a thread ends, its children pass to another thread)."""
    started: list[subprocess.Popen[bytes]] = [subprocess.Popen(["sh", "-c", "sleep 30 & wait"])]
    ready, done = threading.Event(), threading.Event()

    def start_one() -> None:
        started.append(subprocess.Popen(["sleep", "30"]))
        ready.set()
        done.wait(30)

    other = threading.Thread(target=start_one)
    other.start()
    ready.wait(10)
    try:
        yield started
    finally:
        done.set()
        other.join()
        for child in started:
            child.kill()
            child.wait()


def test_descendants_are_read_from_each_threads_children(
    tree: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    me, shell = os.getpid(), tree[0].pid
    deadline = time.monotonic() + 10
    while not reaper.descendants([shell]):  # its sleep, once the shell started it
        assert time.monotonic() < deadline, "the shell did not start its child"
        time.sleep(0.01)
    listed = reaper.descendants([me])  # other tests' processes too, when they left some
    assert {c.pid for c in tree} | reaper.descendants([shell]) <= listed
    monkeypatch.setattr(reaper, "LISTS_CHILDREN", False)
    assert reaper.descendants([me]) == listed
