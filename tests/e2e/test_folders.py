"""Folders the plugin makes or uses: the GPU lock folder, its private folder, the fork server's
socket. Each one unusable becomes an error of the tests that need it, never of the run.

Runs in the outer pytest process. Each case has an ordinary test beside the distributed ones that
must still run. One inner session (``folders``) runs the cases that can share it, each in a file
of its own (a full disk, a GPU lock folder under a file, a deep TMPDIR, a basetemp emptied by
another run); the GPU lock folder shared with another user needs a lock folder of its own, and
a basetemp under a file starts no rank, so it runs in-process.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..helpers import RunPytest, SharedSession

#: A GPU test, a CPU distributed test and an ordinary test.
MIXED = """
import pytest

@pytest.mark.world_size(1)
@pytest.mark.requires_gpus(1)
def test_gpu(rank):
    pass

@pytest.mark.world_size(2)
def test_cpu(rank):
    pass

def test_plain():
    pass
"""

#: Leases every visible GPU as another user (uid 65534): imports first, while still root, since
#: the interpreter lives under /root, which that user cannot read.
OTHER_USER = """
import encodings.ascii, os, sys
from pytest_distrank.pool.pools import gpus
os.setgid(65534)
os.setuid(65534)
lease = gpus.lease(int(os.environ["DISTRANK_FAKE_GPU_COUNT"]), sys.argv[1], wait=0)
print("leased", lease.cuda_visible_devices, flush=True)
"""


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("DISTRANK_GPU_LOCK_DIR", raising=False)


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    """A folder in /tmp that every user may enter (pytest's own tmp_path is private)."""
    path = Path(tempfile.mkdtemp(prefix="distrank-test-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


#: Makes the plugin's folder fail once with a full disk, as tempfile.mkdtemp would.
FULL_DISK_ONCE = """
import errno, os, tempfile

_real = tempfile.mkdtemp
_failed = []

def _mkdtemp(suffix=None, prefix=None, dir=None):
    if prefix == "distrank-" and not _failed and "DISTRANK_RANK" not in os.environ:
        _failed.append(dir)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(str(dir), prefix))
    return _real(suffix, prefix, dir)

tempfile.mkdtemp = _mkdtemp
"""

#: The folders session, in the order its files run: the full disk hits the first distributed
#: test; the basetemp is emptied last, between two pool starts.
FOLDERS = {
    "conftest.py": FULL_DISK_ONCE,
    "test_a_disk.py": """
import pytest

def test_plain():
    pass

@pytest.mark.world_size(2)
def test_first(rank):
    pass

@pytest.mark.world_size(2)
def test_second(rank):
    pass
""",
    "test_c_deep.py": """
import tempfile, pytest

@pytest.mark.world_size(2)
def test_two(rank):
    pass

def test_plain():
    assert len(tempfile.gettempdir()) > 107
""",
    "test_d_locks.py": MIXED,
    # What a second pytest run with the same --basetemp does when it starts: empty the folder.
    "test_z_emptied.py": """
import shutil, pytest

@pytest.mark.world_size(1)
def test_first_pool(rank):
    pass

def test_second_run_starts(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    shutil.rmtree(base)
    base.mkdir()

@pytest.mark.world_size(3)
def test_second_pool(rank):
    pass
""",
}

#: TMPDIR of the folders session, under its folder: longer than an AF_UNIX socket path may be.
DEEP = Path("d" * 60) / ("e" * 60)


def _write(folder: Path) -> None:
    (folder / DEEP).mkdir(parents=True)
    assert len(str(folder / DEEP)) > 107  # beyond what an AF_UNIX socket path may hold on Linux
    (folder / "blocker").write_text("a file, not a folder")
    for name, source in FOLDERS.items():
        (folder / name).write_text(source)


@pytest.fixture
def folders(shared_session: SharedSession, fake_gpus: None) -> pytest.RunResult:
    return shared_session(
        "folders",
        _write,
        "-v",
        "-ra",
        "--distrank-gpu-lock-dir=blocker/locks",
        # A long basetemp puts the fork server's socket in a short folder of its own under
        # /tmp (forkserver.use_socket_folder); the socket inside an emptied basetemp is
        # test_an_emptied_basetemp_takes_the_fork_servers_socket_with_it.
        "--basetemp=" + "b" * 60,
        env={"TMPDIR": "{folder}/" + str(DEEP)},
    )


def test_folders_session_totals(folders: pytest.RunResult) -> None:
    folders.assert_outcomes(passed=9, errors=2)


# -- the GPU lock folder (--distrank-gpu-lock-dir) ---------------------------------------------


def test_gpu_lock_dir_under_a_file_errors_only_the_gpu_tests(folders: pytest.RunResult) -> None:
    folders.stdout.fnmatch_lines(
        ["test_d_locks.py::test_cpu PASSED*", "test_d_locks.py::test_plain PASSED*"]
    )
    folders.stdout.fnmatch_lines(
        [
            "*could not use the GPU lock folder blocker/locks: *Not a directory*",
            "(--distrank-gpu-lock-dir, from --distrank-gpu-lock-dir=blocker/locks (command line))*",
            "ERROR test_d_locks.py::test_gpu - could not use the GPU lock folder blocker/locks*",
        ]
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_gpu_lock_folder_is_shared_with_other_users(
    pytester: pytest.Pytester, run_pytest: RunPytest, fake_gpus: None, world_readable_dir: Path
) -> None:
    lock_dir = world_readable_dir / "locks"
    pytester.makepyfile(test_locks=MIXED)
    run_pytest(f"--distrank-gpu-lock-dir={lock_dir}").assert_outcomes(passed=3)
    assert stat.S_IMODE(lock_dir.stat().st_mode) == 0o1777  # like /tmp: sticky, world-writable
    assert {stat.S_IMODE(p.stat().st_mode) for p in lock_dir.glob("*.lock")} == {0o666}
    other = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(OTHER_USER), str(lock_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == "leased 0,1"


# -- the plugin's private folder (under pytest's basetemp) -------------------------------------


def test_basetemp_under_a_file_errors_the_distributed_tests(
    pytester: pytest.Pytester, run_inprocess: RunPytest
) -> None:
    """No rank starts (the folder comes first): in-process."""
    pytester.path.joinpath("blocker").write_text("a file, not a folder")
    pytester.makepyfile(
        test_base="""
        import pytest

        @pytest.mark.world_size(1)
        def test_one(rank):
            pass

        @pytest.mark.world_size(2)
        def test_two(rank):
            pass

        def test_plain():
            pass
        """
    )
    result = run_inprocess("-ra", "--basetemp=blocker/bt")
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*pytest-distrank could not make its folder under *blocker/bt: *Not a directory*",
            "*pytest's basetemp, from --basetemp=blocker/bt (command line)*",
            "ERROR test_base.py::test_one - pytest-distrank could not make its folder*",
            "ERROR test_base.py::test_two - pytest-distrank could not make its folder*",
        ]
    )
    assert "INTERNALERROR" not in result.stdout.str()


def test_full_disk_errors_one_test_and_the_next_one_tries_again(folders: pytest.RunResult) -> None:
    folders.stdout.fnmatch_lines(
        [
            "test_a_disk.py::test_plain PASSED*",
            "test_a_disk.py::test_first ERROR*",
            "test_a_disk.py::test_second PASSED*",
        ]
    )
    folders.stdout.fnmatch_lines(
        [
            "*pytest-distrank could not make its folder under *: *No space left on device*",
            "ERROR test_a_disk.py::test_first - pytest-distrank could not make its folder*",
        ]
    )


def test_basetemp_emptied_by_another_run_is_made_again(folders: pytest.RunResult) -> None:
    folders.stdout.fnmatch_lines(
        [
            "test_z_emptied.py::test_first_pool PASSED*",
            "test_z_emptied.py::test_second_run_starts PASSED*",
            "test_z_emptied.py::test_second_pool PASSED*",
        ]
    )


# -- the fork server's socket ------------------------------------------------------------------


def test_an_emptied_basetemp_takes_the_fork_servers_socket_with_it(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    """Under a short basetemp the fork server's socket lies in the session's folder; another run
    that empties the basetemp removes it, and the next pool start must start a new server (it
    was an INTERNALERROR: FileNotFoundError connecting to the old one's socket)."""
    pytester.makepyfile(test_z_emptied=FOLDERS["test_z_emptied.py"])
    short = Path(tempfile.mkdtemp(prefix="dr-bt-", dir="/tmp"))  # a socket path fits in it
    try:
        result = run_pytest("-v", f"--basetemp={short / 'bt'}")
    finally:
        shutil.rmtree(short, ignore_errors=True)
    result.assert_outcomes(passed=3)
    assert "INTERNALERROR" not in result.stdout.str()


def test_deep_tmpdir_still_starts_the_fork_server(folders: pytest.RunResult) -> None:
    folders.stdout.fnmatch_lines(
        ["test_c_deep.py::test_two PASSED*", "test_c_deep.py::test_plain PASSED*"]
    )
