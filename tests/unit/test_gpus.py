"""Unit tests of GPU leasing (pool/gpus.py) in this process, on fake GPUs.

The ``fake_gpus`` fixture (``tests/conftest.py``) sets the DISTRANK_FAKE_GPU_COUNT seam to four
GPUs and gives each test a private lock folder. The end-to-end runs of leasing are in
``tests/e2e/test_gpu_leasing.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_distrank.pool.pools import gpus
from pytest_distrank.pool.pools.poolkey import PoolKey
from pytest_distrank.settings import Value


def test_leases_in_one_process_are_disjoint(fake_gpus: Path) -> None:
    first = gpus.lease(3, str(fake_gpus), wait=0)
    second = gpus.lease(1, str(fake_gpus), wait=0)
    assert first.ids == ("0", "1", "2")
    assert second.ids == ("3",)
    with pytest.raises(gpus.GpuUnavailable, match=r"could not lease 1 of the 4 visible GPUs"):
        gpus.lease(1, str(fake_gpus), wait=0)
    first.release()
    assert gpus.lease(2, str(fake_gpus), wait=0).ids == ("0", "1")


def test_busy_message_names_the_holder(fake_gpus: Path) -> None:
    held = gpus.lease(4, str(fake_gpus), wait=0)
    with pytest.raises(gpus.GpuUnavailable) as excinfo:
        gpus.lease(2, str(fake_gpus), wait=0.3)
    message = str(excinfo.value)
    assert "within 0.3 s: 4 are held by other pytest processes" in message
    assert f"GPU 0: pid {os.getpid()} on " in message
    held.release()


def test_outer_cuda_visible_devices_names_the_gpus(
    fake_gpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7,GPU-ab12")
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "3")
    assert gpus.visible_gpu_ids() == ["5", "7", "GPU-ab12"]
    lease = gpus.lease(3, str(fake_gpus), wait=0)
    assert lease.cuda_visible_devices == "5,7,GPU-ab12"
    assert gpus.lock_path(str(fake_gpus), "GPU-ab12").name == "gpu-GPU-ab12.lock"
    lease.release()


GIB = 1 << 30


def test_memory_leases_share_a_gpu_while_the_sum_fits(
    fake_gpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "1")
    monkeypatch.setenv("DISTRANK_FAKE_GPU_MEMORY", "80GiB")
    first = gpus.lease(1, str(fake_gpus), wait=0, memory=30 * GIB)
    second = gpus.lease(1, str(fake_gpus), wait=0, memory=30 * GIB)
    assert first.ids == second.ids == ("0",)
    with pytest.raises(gpus.GpuUnavailable) as excinfo:
        gpus.lease(1, str(fake_gpus), wait=0, memory=30 * GIB)
    assert f"GPU 0: 2 shares hold 60.0 GiB of 80.0 GiB (pid {os.getpid()})" in str(excinfo.value)
    with pytest.raises(gpus.GpuUnavailable):
        gpus.lease(1, str(fake_gpus), wait=0)  # whole: not while shares live
    first.release()
    third = gpus.lease(1, str(fake_gpus), wait=0, memory=50 * GIB)
    second.release()
    third.release()
    whole = gpus.lease(1, str(fake_gpus), wait=0)
    with pytest.raises(gpus.GpuUnavailable):
        gpus.lease(1, str(fake_gpus), wait=0, memory=GIB)  # a share: not while it is held whole
    whole.release()
    assert sorted(p.name for p in fake_gpus.glob("*.share.*")) == []


def test_a_gpu_of_unknown_memory_is_leased_whole(
    fake_gpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "1")
    monkeypatch.setattr(gpus, "total_memory", lambda gpu: None)  # the driver does not say
    held = gpus.lease(1, str(fake_gpus), wait=0, memory=GIB)
    with pytest.raises(gpus.GpuUnavailable):
        gpus.lease(1, str(fake_gpus), wait=0, memory=GIB)
    held.release()


# Security of the shared lock folder (issue #24, D1): every user of the machine may put anything
# in it. Each test records the machine's fs.protected_* settings (they change what the kernel
# stops by itself) and passes with them; uid 65534 (nobody) plays the other user where this
# process may act as one (root).

NOBODY = 65534
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="acting as a second user (uid 65534) needs root"
)
VICTIM = "SECRET\n"


@pytest.fixture
def fs_protection(record_property: Callable[[str, object], None]) -> str:
    """This machine's fs.protected_{symlinks,hardlinks,regular,fifos}, recorded with the result."""
    names = ("symlinks", "hardlinks", "regular", "fifos")
    files = [Path(f"/proc/sys/fs/protected_{name}") for name in names]
    seen = " ".join(f"{f.name}={f.read_text().strip() if f.exists() else '?'}" for f in files)
    record_property("fs_protection", seen)
    return seen


def _public(folder: Path) -> Path:
    """``folder`` made as the plugin makes it: sticky and world-writable."""
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    victim.chmod(0o600)
    return victim


def _as_other_user(path: Path) -> None:
    """Give ``path`` (a link itself, not its target) to uid 65534, where this process may."""
    if os.geteuid() == 0:
        os.lchown(path, NOBODY, NOBODY)


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_linked_owner_note_leaves_its_target_alone(
    fake_gpus: Path, tmp_path: Path, link: str, fs_protection: str
) -> None:
    folder = _public(fake_gpus)
    victim = _victim(tmp_path)
    note = folder / "gpu-0.owner"
    if link == "symlink":
        note.symlink_to(victim)
        _as_other_user(note)
    else:
        os.link(victim, note)
    gpus.lease(1, str(folder), wait=0).release()
    seen = (victim.read_text(), stat.S_IMODE(victim.stat().st_mode), victim.stat().st_nlink)
    assert seen == (VICTIM, 0o600, 1), fs_protection
    assert not note.is_symlink() and note.stat().st_nlink == 1, fs_protection
    assert note.read_text().startswith(f"pid {os.getpid()} on "), fs_protection


@pytest.mark.parametrize("plant", ["symlink", "fifo"])
def test_a_planted_lock_file_makes_its_gpu_unavailable_saying_why(
    fake_gpus: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    plant: str,
    fs_protection: str,
) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "2")
    folder = _public(fake_gpus)
    victim = _victim(tmp_path)
    if plant == "symlink":
        (folder / "gpu-0.lock").symlink_to(victim)
    else:
        os.mkfifo(folder / "gpu-0.lock")
    held = gpus.lease(1, str(folder), wait=0)
    assert held.ids == ("1",), fs_protection
    with pytest.raises(gpus.GpuUnavailable) as excinfo:
        gpus.lease(1, str(folder), wait=0)
    kind = "a symbolic link" if plant == "symlink" else "a FIFO"
    assert f"GPU 0: its lock file gpu-0.lock is {kind}" in str(excinfo.value), fs_protection
    held.release()
    assert (victim.read_text(), stat.S_IMODE(victim.stat().st_mode)) == (VICTIM, 0o600)


@pytest.mark.timeout(20)
def test_a_fifo_named_like_a_share_is_never_waited_for(
    fake_gpus: Path, monkeypatch: pytest.MonkeyPatch, fs_protection: str
) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "1")
    monkeypatch.setenv("DISTRANK_FAKE_GPU_MEMORY", "80GiB")
    folder = _public(fake_gpus)
    os.mkfifo(folder / "gpu-0.share.1.1-1")  # an open for reading would wait for a writer
    gpus.lease(1, str(folder), wait=0, memory=GIB).release()
    gpus.lease(1, str(folder), wait=0).release()
    assert stat.S_ISFIFO((folder / "gpu-0.share.1.1-1").lstat().st_mode), fs_protection


def test_share_names_that_do_not_parse_are_skipped(
    fake_gpus: Path, monkeypatch: pytest.MonkeyPatch, fs_protection: str
) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "1")
    folder = _public(fake_gpus)
    planted = []
    for name in ("gpu-0.share.lots.1-1", "gpu-0.share.1.x", "gpu-0.share.", "gpu-0.share.9.9-9.9"):
        fd = os.open(folder / name, os.O_RDONLY | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held, as by a live process of another user
        planted.append(fd)
    try:
        held = gpus.lease(1, str(folder), wait=0)
        with pytest.raises(gpus.GpuUnavailable) as excinfo:
            gpus.lease(1, str(folder), wait=0)
        assert f"GPU 0: pid {os.getpid()} on " in str(excinfo.value), fs_protection
        held.release()
    finally:
        for fd in planted:
            os.close(fd)


def _take(folder: Path) -> gpus.GpuLease | None:
    """A pool's lease of one GPU, as the session takes it (the option from the environment)."""
    leases = gpus.SessionLeases(
        Value(str(folder), f"DISTRANK_GPU_LOCK_DIR={folder} (environment)"), Value(0.0, "default")
    )
    return leases.take(PoolKey(1, "gloo", True, gpus=1), "gloo")


@pytest.mark.parametrize(
    ("setup", "why"),
    [
        pytest.param("other-owner", "it belongs to uid 65534", marks=needs_root, id="other-owner"),
        pytest.param("0777", "every user may write it and it is not sticky", id="world-writable"),
        pytest.param("0775", "its group may write it and it is not sticky", id="group-writable"),
        pytest.param("link", "is a symbolic link", id="symlink"),
    ],
)
def test_a_folder_others_control_is_refused_saying_what_to_do(
    fake_gpus: Path, tmp_path: Path, setup: str, why: str, fs_protection: str
) -> None:
    folder = fake_gpus
    if setup == "link":
        _public(tmp_path / "elsewhere")
        folder.symlink_to(tmp_path / "elsewhere")
        _as_other_user(folder)
    else:
        _public(folder)
        if setup == "other-owner":
            os.chown(folder, NOBODY, NOBODY)
        else:
            folder.chmod(int(setup, 8))
    with pytest.raises(gpus.GpuFolderError) as excinfo:
        _take(folder)
    message = str(excinfo.value)
    assert f"the GPU lock folder {folder} " in message, fs_protection
    assert why in message, message
    assert "--distrank-gpu-lock-dir (env DISTRANK_GPU_LOCK_DIR)" in message, message
    assert f"from DISTRANK_GPU_LOCK_DIR={folder} (environment)" in message, message


def test_the_owner_note_is_read_as_untrusted_text(fake_gpus: Path, fs_protection: str) -> None:
    folder = _public(fake_gpus)
    held = gpus.lease(4, str(folder), wait=0)
    note = folder / "gpu-0.owner"
    note.unlink()
    note.write_text("pid 1\x1b[2J\x1b]0;pwned\x07\r\nFAKE LINE\x00\u202e" + "x" * 5000)
    _as_other_user(note)
    with pytest.raises(gpus.GpuUnavailable) as excinfo:
        gpus.lease(1, str(folder), wait=0)
    held.release()
    line = next(x for x in str(excinfo.value).splitlines() if x.startswith("  GPU 0: "))
    assert line.isprintable(), repr(line)
    assert line.startswith("  GPU 0: pid 1 [2J ]0;pwned FAKE LINE"), (repr(line), fs_protection)
    assert len(line) <= 220 and line.endswith("..."), len(line)


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A lock folder root made (1777) where uid 65534 can reach it: pytest's own temp
    folders are private."""
    if os.geteuid() != 0:
        pytest.skip("acting as a second user (uid 65534) needs root")
    top = Path(tempfile.mkdtemp(prefix="distrank-two-users-"))
    try:
        top.chmod(0o755)
        yield _public(top / "locks")
    finally:
        shutil.rmtree(top)


#: As uid 65534, lease GPU 0 (whole, or argv[2] bytes of it) in folder argv[1], say whether it
#: could, and hold it. Imports first, while still root: the interpreter may live under /root.
OTHER_USER = """
import encodings.ascii, os, sys, time
from pytest_distrank.pool.pools import gpus
import pytest_distrank.tree.held  # imported lazily by a lease that fails: read before the uid drops
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
try:
    lease = gpus.lease(1, sys.argv[1], wait=0, memory=int(sys.argv[2]))
except gpus.GpuUnavailable:
    print("busy", flush=True)
else:
    print("holding", flush=True)
    time.sleep(60)
"""


@contextlib.contextmanager
def _other_user(folder: Path, memory: int) -> Iterator[str]:
    """Uid 65534 leasing GPU 0 of ``folder``: what it said (holding or busy), while it holds."""
    with subprocess.Popen(
        [sys.executable, "-c", OTHER_USER, str(folder), str(memory)],
        stdout=subprocess.PIPE,
        text=True,
    ) as other:
        try:
            assert other.stdout is not None
            yield other.stdout.readline().strip()
        finally:
            other.kill()


@pytest.mark.timeout(60)
def test_two_users_share_a_gpu_in_a_folder_root_made(
    fake_gpus: Path, shared_folder: Path, monkeypatch: pytest.MonkeyPatch, fs_protection: str
) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "1")
    monkeypatch.setenv("DISTRANK_FAKE_GPU_MEMORY", "80GiB")
    with _other_user(shared_folder, 30 * GIB) as said:
        assert said == "holding", fs_protection
        mine = gpus.lease(1, str(shared_folder), wait=0, memory=30 * GIB)  # 60 of 80 GiB
        with pytest.raises(gpus.GpuUnavailable, match=r"2 shares hold 60\.0 GiB of 80\.0 GiB"):
            gpus.lease(1, str(shared_folder), wait=0)
        with _other_user(shared_folder, 10 * GIB) as again:
            assert again == "holding", fs_protection  # 70 of 80 GiB
        with _other_user(shared_folder, 0) as whole:
            assert whole == "busy", fs_protection
        mine.release()
    with _other_user(shared_folder, 0) as whole:
        assert whole == "holding", fs_protection
        with pytest.raises(gpus.GpuUnavailable):
            gpus.lease(1, str(shared_folder), wait=0, memory=GIB)
