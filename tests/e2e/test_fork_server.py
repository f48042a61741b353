"""The fork server forked from pytest as it starts (pool/pools/earlyfork.py): what it keeps.

One inner session, started with a file descriptor open that pytest inherits, stdout a pipe and
Python's output buffered, and a project plugin (``-p``) that prints and opens a log file when it
is imported. The ranks check that their parent is pytest's fork (no second interpreter imported
torch), that neither holds that descriptor, and that Ctrl-C reaches them as in a fresh
interpreter; a conftest.py's import-time variable still reaches them; the plugin's log gets every
rank's line and its print shows once; a pytest.main inside a test of the session ends; a torch
module that only a later test file imports was imported by the fork server, not by each rank.
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
import signal
import sys

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
def test_a_later_files_torch_modules_come_from_the_fork_server(rank):
    assert sys.modules["test_later"].PRELOADED


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


@pytest.mark.world_size(2)
def test_ctrl_c_is_a_fresh_interpreters(rank):
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_pytest_main_inside_a_test_ends(tmp_path):
    (tmp_path / "test_inner.py").write_text(
        "import pytest\\n@pytest.mark.world_size(2)\\ndef test_in(rank):\\n    pass\\n"
    )
    assert pytest.main(["-p", "distrank", "-q", "-p", "no:cacheprovider", str(tmp_path)]) == 0
"""

#: A file collected after the fork server started (``test_it.py`` started it): the module of
#: torch's distributed stack that it imports is the server's too (pool/pools/forkserver.py), as
#: the first test of ``test_it.py`` checks in the ranks (of the early server: a later test runs
#: after the nested session, on a server started again).
LATER = """
import sys

PRELOADED = "torch.distributed.algorithms.model_averaging.averagers" in sys.modules

import pytest
import torch.distributed.algorithms.model_averaging.averagers  # noqa: F401


@pytest.mark.world_size(2)
def test_in_the_same_pool(rank):
    pass
"""

#: A project plugin that pytest imports before the fork: each rank imports it again (its file
#: is its own), and its print is not printed again by every rank.
PLUGIN = """
import os

print("PRINTED-ONCE-AT-IMPORT")
LOG = open(os.environ["DISTRANK_TEST_PLUGIN_LOG"], "a", buffering=1)


def pytest_runtest_setup(item):
    if "DISTRANK_RANK" in os.environ:
        LOG.write(f"setup {item.name} in rank {os.environ['DISTRANK_RANK']}\\n")
"""


def test_ranks_fork_from_pytests_own_fork(
    pytester: pytest.Pytester, run_pytest: object, tmp_path: Path
) -> None:
    pytester.makeconftest("import os\nos.environ['SET_BY_CONFTEST'] = 'yes'\n")
    pytester.makepyfile(test_it=TESTS, test_later=LATER, projectplugin=PLUGIN)
    marker, log = tmp_path / "held-by-pytest", tmp_path / "plugin.log"
    marker.write_text("")
    fd = os.open(marker, os.O_RDONLY)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # output buffered
    env.update(
        DISTRANK_TEST_MARKER=str(marker),
        DISTRANK_TEST_PLUGIN_LOG=str(log),
        PYTHONPATH=os.pathsep.join(filter(None, [str(pytester.path), env.get("PYTHONPATH")])),
    )
    command = [sys.executable, "-m", "pytest", "-p", "distrank", "-p", "no:randomly", "-rA",
               "-p", "projectplugin", "test_it.py", "test_later.py"]  # fmt: skip
    try:
        run = subprocess.run(
            command,
            cwd=pytester.path,
            env=env,
            pass_fds=[fd],
            stdin=subprocess.DEVNULL,
            capture_output=True,  # stdout a pipe: block-buffered without PYTHONUNBUFFERED
            text=True,
            timeout=RUN_TIMEOUT,
        )
    finally:
        os.close(fd)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "6 passed" in run.stdout, run.stdout
    assert run.stdout.count("PRINTED-ONCE-AT-IMPORT") == 1, run.stdout
    lines = [line for line in log.read_text().splitlines() if "import_time" in line]
    assert sorted(lines) == [
        "setup test_a_conftests_import_time_variable_reaches_the_ranks in rank 0",
        "setup test_a_conftests_import_time_variable_reaches_the_ranks in rank 1",
    ], log.read_text()
