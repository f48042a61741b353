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

Memory shares (``requires_gpus(n, memory=...)``, docs/gpus.md): instead of the GPU's lock, a
pool may hold a share of it, a file of its own named by its size (``gpu-0.share.<bytes>.<pid>-<n>``)
and flocked for the pool's life; shares of one GPU may coexist while their sizes fit its memory
(:mod:`gpumemory`), and exclude a whole lease. Each decision is taken under a flock of the folder
itself, so whole and shared leases see each other's files as they are; a share whose flock is gone
(its holder died) counts for nothing and is removed.

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
import fcntl
import itertools
import os
import re
import socket
import time
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock, Timeout

from ..requirements import visible_gpu_count
from ..settings import GPU_LOCK_DIR, GPU_WAIT, Value, size_words
from .gpumemory import total_memory

if TYPE_CHECKING:
    from .poolkey import PoolKey

#: How often a waiting pool looks for released GPUs.
POLL_SECONDS = 0.2
#: The longest wait for the lock folder's own flock (held for microseconds per decision).
DECIDE_LIMIT = 30.0


#: Modes of what the plugin makes in the lock folder: other users' sessions must open them too.
FOLDER_MODE = 0o1777
FILE_MODE = 0o666


class GpuUnavailable(Exception):
    """Not enough GPUs were released within the wait; the message says who holds them."""


@dataclasses.dataclass
class GpuLease:
    """GPUs one pool holds until :meth:`release` (or until this process dies)."""

    ids: tuple[str, ...]
    #: The GPUs' locks (a whole lease), or this lease's share files (``memory`` > 0).
    locks: list[FileLock]
    #: Seconds spent waiting for other processes to release GPUs.
    waited: float = 0.0
    #: Bytes of each GPU this lease holds; 0: the GPUs whole.
    memory: int = 0

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.ids)

    def release(self) -> None:
        """Give the GPUs back. Idempotent."""
        for lock in self.locks:
            with contextlib.suppress(OSError):
                lock.release(force=True)
            if ".share." in lock.lock_file:
                with contextlib.suppress(OSError):
                    os.unlink(lock.lock_file)
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


def _try_take(
    lock_dir: str, ids: list[str], count: int, busy: list[str], memory: int = 0
) -> GpuLease | None:
    """Take ``count`` GPUs at once (whole, or ``memory`` bytes of each), or none (then ``busy``
    lists the GPUs that could not be had)."""
    taken: list[tuple[str, FileLock]] = []
    busy.clear()
    try:
        for gpu in ids:
            with _deciding(lock_dir):
                lock = _take_share(lock_dir, gpu, memory) if memory else _take_whole(lock_dir, gpu)
            if lock is None:
                busy.append(gpu)
                continue
            taken.append((gpu, lock))
            if len(taken) == count:
                lease = GpuLease(tuple(g for g, _ in taken), [lk for _, lk in taken], memory=memory)
                _write_owner(lock_dir, lease)
                return lease
    except BaseException:
        GpuLease((), [lk for _, lk in taken]).release()
        raise
    GpuLease((), [lk for _, lk in taken]).release()
    return None


@contextlib.contextmanager
def _deciding(lock_dir: str) -> Iterator[None]:
    """The lock folder itself, flocked for the moment a lease is decided, so whole and shared
    leases see each other's files as they are. A folder, not a file: a file made by one user in
    the sticky folder cannot be opened for writing by another (Linux's protected_regular).

    A decision takes microseconds; a holder stopped in the middle of one (Ctrl-Z) would block
    every session, so the wait is bounded (:data:`DECIDE_LIMIT`), then :class:`GpuUnavailable`.
    """
    fd = os.open(lock_dir, os.O_RDONLY)
    try:
        deadline = time.monotonic() + DECIDE_LIMIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise GpuUnavailable(
                        f"another process has held the GPU lock folder {lock_dir} for "
                        f"{DECIDE_LIMIT:g} s while deciding a lease (is a pytest process there "
                        "stopped?)"
                    ) from None
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # drops the flock


def _held(path: Path) -> bool:
    """Whether a live process holds the flock of ``path``. Probed read-only and shared, so a
    share file another user made can be probed too."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _share_paths(lock_dir: str, gpu: str) -> list[Path]:
    return sorted(Path(lock_dir).glob(lock_path(lock_dir, gpu).stem + ".share.*"))


def _live_shares(lock_dir: str, gpu: str) -> int:
    """Bytes the live shares of this GPU hold (the size is in each share file's name); a share
    whose holder died (its flock is gone) is removed."""
    used = 0
    for path in _share_paths(lock_dir, gpu):
        if _held(path):
            used += int(path.name.rsplit(".", 2)[1])  # <stem>.share.<bytes>.<pid>-<n>
            continue
        with contextlib.suppress(OSError):
            path.unlink()  # another user's stale share may stay; it counts for nothing
    return used


def _take_whole(lock_dir: str, gpu: str) -> FileLock | None:
    """The GPU's lock, when no one holds it nor a share of it."""
    if _live_shares(lock_dir, gpu):
        return None
    lock = FileLock(str(lock_path(lock_dir, gpu)), mode=FILE_MODE)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return None
    return lock


def _take_share(lock_dir: str, gpu: str, memory: int) -> FileLock | None:
    """A share of ``memory`` bytes of the GPU, when no one holds it whole and the live shares
    leave room; a GPU whose memory the driver does not tell is only leased whole."""
    capacity = total_memory(gpu)
    if capacity is None:
        return _take_whole(lock_dir, gpu)
    used = _live_shares(lock_dir, gpu)
    if not used and _held(lock_path(lock_dir, gpu)):  # leased whole
        return None
    if used + memory > capacity:
        return None
    name = f"{lock_path(lock_dir, gpu).stem}.share.{memory}.{os.getpid()}-{next(_SHARE_SEQ)}"
    share = FileLock(str(Path(lock_dir) / name), mode=FILE_MODE)
    share.acquire(timeout=0)
    return share


#: Numbers the shares this process takes (a unique file name for each).
_SHARE_SEQ = itertools.count(1)


def _write_owner(lock_dir: str, lease: GpuLease) -> None:
    """Note who holds each GPU, for the message of a pool that waits in vain."""
    note = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}"
    for gpu in lease.ids:
        with contextlib.suppress(OSError):
            _write_shared(_owner_path(lock_dir, gpu), note.encode())


def _holders(lock_dir: str, ids: list[str]) -> str:
    lines = []
    for gpu in ids:
        shares = [p.name.rsplit(".", 2) for p in _share_paths(lock_dir, gpu)]
        if shares:
            held = sum(int(parts[1]) for parts in shares)
            pids = sorted({parts[2].split("-")[0] for parts in shares})
            capacity = total_memory(gpu)
            of = f" of {size_words(capacity)}" if capacity else ""
            count = "1 share holds" if len(shares) == 1 else f"{len(shares)} shares hold"
            note = f"{count} {size_words(held)}{of} (pid{'s' if len(pids) > 1 else ''} "
            note += f"{', '.join(pids)})"
        else:
            try:
                note = _owner_path(lock_dir, gpu).read_text().strip()
            except OSError:
                note = "holder unknown"
        lines.append(f"  GPU {gpu}: {note}")
    return "\n".join(lines)


def lease(count: int, lock_dir: str, wait: float, memory: int = 0) -> GpuLease:
    """Lease ``count`` GPUs (whole, or ``memory`` bytes of each), waiting up to ``wait`` seconds;
    raise :class:`GpuUnavailable`, or ``OSError`` when the folder or a lock file in it is
    unusable."""
    ids = visible_gpu_ids()
    if count > len(ids):
        raise GpuUnavailable(f"needs {count} GPUs, only {len(ids)} visible ({', '.join(ids)})")
    prepare_folder(lock_dir, ids)
    started = time.monotonic()
    busy: list[str] = []
    while True:
        taken = _try_take(lock_dir, ids, count, busy, memory)
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


class GpuFolderError(Exception):
    """The lock folder cannot be used; the message names it, the option and the repair."""


class SessionLeases:
    """One session's GPU leases: its lock folder and wait, and the pools that waited in vain.

    A pool (by key) that waited in vain once does not wait again: its later tests take what is
    free at that moment or are skipped at once.
    """

    def __init__(self, lock_dir: Value[str], wait: Value[float]) -> None:
        self.lock_dir = lock_dir
        self.wait = wait
        self.starved: set[Hashable] = set()

    def take(self, key: PoolKey, kind: Hashable) -> GpuLease | None:
        """The GPUs pool ``key`` needs (None for none); ``kind`` names the pools that share a
        starved state. Raise :class:`GpuUnavailable` or :class:`GpuFolderError`."""
        if key.gpus == 0:
            return None
        wait, folder = self.wait, self.lock_dir
        seconds = 0.0 if kind in self.starved else wait.value
        try:
            return lease(key.gpus, folder.value, seconds, key.gpu_memory)
        except OSError as exc:
            raise GpuFolderError(
                f"could not use the GPU lock folder {folder.value}: {exc}\n"
                f"({GPU_LOCK_DIR.flag}, from {folder.source}). Point it at a folder that "
                "every user of these GPUs can write, or at a new one (the plugin makes it sticky "
                f"and world-writable, like /tmp), or repair this one: chmod 1777 {folder.value}; "
                f"chmod 666 {folder.value}/*.lock"
            ) from None
        except GpuUnavailable as exc:
            self.starved.add(kind)
            again = "; this pool waited in vain before, not again" if wait.value > seconds else ""
            raise GpuUnavailable(
                f"{exc}\n({GPU_WAIT.flag}: {wait.value:g} s, from {wait.source}{again}). "
                f"Free GPUs or raise {GPU_WAIT.flag}; a lease ends with its pytest process."
            ) from None
