"""The fork server forked from pytest as it starts (pool/pools/earlyfork.py): what it keeps.

One inner session, started with a file descriptor open that pytest inherits: the rank checks that
its parent is pytest's fork (no second interpreter imported torch) and that neither it nor its
parent holds that descriptor; a conftest.py's import-time variable still reaches the ranks.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import RUN_TIMEOUT

TESTS = """
import os

import pytest

MARKER = os.environ["DISTRANK_TEST_MARKER"]


def links(pid):
    found = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass
    return found


@pytest.mark.world_size(2)
def test_the_server_is_pytests_fork_and_holds_none_of_its_files(rank):
    server = os.getppid()
    with open(f"/proc/{server}/cmdline", "rb") as f:
        command = f.read().replace(b"\\0", b" ")
    assert b"pytest" in command and b"multiprocessing.forkserver" not in command, command
    for pid in (server, os.getpid()):
        assert MARKER not in links(pid).values(), (pid, links(pid))


@pytest.mark.world_size(2)
def test_a_conftests_import_time_variable_reaches_the_ranks(rank):
    assert os.environ["SET_BY_CONFTEST"] == "yes"
"""


def test_ranks_fork_from_pytests_own_fork(
    pytester: pytest.Pytester, run_pytest: object, tmp_path: Path
) -> None:
    pytester.makeconftest("import os\nos.environ['SET_BY_CONFTEST'] = 'yes'\n")
    pytester.makepyfile(test_it=TESTS)
    marker = tmp_path / "held-by-pytest"
    marker.write_text("")
    fd = os.open(marker, os.O_RDONLY)
    try:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "distrank", "-p", "no:randomly", "-rA"],
            cwd=pytester.path,
            env={
                **os.environ,
                "DISTRANK_TEST_MARKER": str(marker),
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(pytester.path), os.environ.get("PYTHONPATH")])
                ),
            },
            pass_fds=[fd],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
    finally:
        os.close(fd)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout, run.stdout
