"""GPU leasing: every pool that needs GPUs gets a set no other pytest process holds.

Runs in the controller. One lock file per GPU in a shared folder (``--distrank-gpu-lock-dir``),
taken with ``filelock`` (``flock`` on Linux), so xdist workers and concurrent sessions on one
machine never put two pools on one GPU. The kernel drops a ``flock`` when its holder dies, so a
lease held by a crashed or ``kill -9``-ed pytest frees itself; there is no stale lock to clean.

The folder is shared by every user of the machine (the default is in the system temp folder), so
a process that makes it makes it like ``/tmp``: sticky and world-writable, with a world-writable
lock file for each GPU it sees, owned by the folder's owner (filelock refuses, in a sticky folder,
a lock file owned by anyone else). An ``OSError`` on the folder reaches the caller, which makes
it an error of the tests that needed the GPUs.

The GPUs to choose from are the ones this process may use: the entries of an outer
``CUDA_VISIBLE_DEVICES`` when it is set (indices or UUIDs, used as lock names as written), else
``0 .. n-1``. Ranks get ``CUDA_VISIBLE_DEVICES`` set to their pool's lease, so ``cuda:0`` in a
rank is the lease's first GPU.

Test seam: ``DISTRANK_FAKE_GPU_COUNT=N`` (see requirements.py) makes N GPUs visible, so leasing
is tested on machines without GPUs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import socket
import time
from pathlib import Path

from filelock import FileLock, Timeout

from ..requirements import visible_gpu_count

#: How often a waiting pool looks for released GPUs.
POLL_SECONDS = 0.2


#: Modes of what the plugin makes in the lock folder: other users' sessions must open them too.
FOLDER_MODE = 0o1777
FILE_MODE = 0o666


class GpuUnavailable(Exception):
    """Not enough GPUs were released within the wait; the message says who holds them."""


@dataclasses.dataclass
class GpuLease:
    """GPUs one pool holds until :meth:`release` (or until this process dies)."""

    ids: tuple[str, ...]
    locks: list[FileLock]
    #: Seconds spent waiting for other processes to release GPUs.
    waited: float = 0.0

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.ids)

    def release(self) -> None:
        """Give the GPUs back. Idempotent."""
        for lock in self.locks:
            with contextlib.suppress(OSError):
                lock.release(force=True)
        self.locks = []


def visible_gpu_ids() -> list[str]:
    """The GPUs this process may lease, by the names ``CUDA_VISIBLE_DEVICES`` gives them."""
    count = visible_gpu_count()
    outer = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if outer:
        return [part.strip() for part in outer.split(",") if part.strip()][:count]
    return [str(i) for i in range(count)]


def lock_path(lock_dir: str, gpu: str) -> Path:
    """The lock file of one GPU (its name made safe for a file name)."""
    return Path(lock_dir) / f"gpu-{re.sub(r'[^A-Za-z0-9_.-]', '_', gpu)}.lock"


def _owner_path(lock_dir: str, gpu: str) -> Path:
    return lock_path(lock_dir, gpu).with_suffix(".owner")


def _write_shared(path: Path, data: bytes, exclusive: bool = False) -> None:
    """Write a file every user may open too (its mode past the umask; only its owner can)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    try:
        with contextlib.suppress(OSError):
            os.fchmod(fd, FILE_MODE)
        os.write(fd, data)
    finally:
        os.close(fd)


def prepare_folder(lock_dir: str, ids: list[str]) -> None:
    """Make the lock folder if it is missing: sticky and world-writable, with the lock files of
    ``ids`` in it, world-writable and owned by the folder's owner (raise OSError)."""
    folder = Path(lock_dir)
    if folder.is_dir():
        return
    try:
        folder.mkdir(parents=True)
    except FileExistsError:
        return  # another process made it just now (or a file is there: the next open says so)
    folder.chmod(FOLDER_MODE)
    for gpu in ids:
        with contextlib.suppress(FileExistsError):
            _write_shared(lock_path(lock_dir, gpu), b"", exclusive=True)


def _try_take(lock_dir: str, ids: list[str], count: int, busy: list[str]) -> GpuLease | None:
    """Take ``count`` free GPUs at once, or none (then ``busy`` lists the held ones)."""
    taken: list[tuple[str, FileLock]] = []
    busy.clear()
    try:
        for gpu in ids:
            lock = FileLock(str(lock_path(lock_dir, gpu)), mode=FILE_MODE)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                busy.append(gpu)
                continue
            taken.append((gpu, lock))
            if len(taken) == count:
                lease = GpuLease(tuple(g for g, _ in taken), [lk for _, lk in taken])
                _write_owner(lock_dir, lease)
                return lease
    except BaseException:
        for _, lock in taken:
            lock.release(force=True)
        raise
    for _, lock in taken:
        lock.release(force=True)
    return None


def _write_owner(lock_dir: str, lease: GpuLease) -> None:
    """Note who holds each GPU, for the message of a pool that waits in vain."""
    note = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}"
    for gpu in lease.ids:
        with contextlib.suppress(OSError):
            _write_shared(_owner_path(lock_dir, gpu), note.encode())


def _holders(lock_dir: str, ids: list[str]) -> str:
    lines = []
    for gpu in ids:
        try:
            note = _owner_path(lock_dir, gpu).read_text().strip()
        except OSError:
            note = "holder unknown"
        lines.append(f"  GPU {gpu}: {note}")
    return "\n".join(lines)


def lease(count: int, lock_dir: str, wait: float) -> GpuLease:
    """Lease ``count`` GPUs, waiting up to ``wait`` seconds; raise :class:`GpuUnavailable`, or
    ``OSError`` when the folder or a lock file in it is unusable."""
    ids = visible_gpu_ids()
    if count > len(ids):
        raise GpuUnavailable(f"needs {count} GPUs, only {len(ids)} visible ({', '.join(ids)})")
    prepare_folder(lock_dir, ids)
    started = time.monotonic()
    busy: list[str] = []
    while True:
        taken = _try_take(lock_dir, ids, count, busy)
        if taken is not None:
            taken.waited = time.monotonic() - started
            return taken
        if time.monotonic() - started >= wait:
            raise GpuUnavailable(
                f"could not lease {count} of the {len(ids)} visible GPUs within {wait:g} s: "
                f"{len(busy)} are held by other pytest processes (locks in {lock_dir}):\n"
                f"{_holders(lock_dir, busy)}"
            )
        time.sleep(POLL_SECONDS)
