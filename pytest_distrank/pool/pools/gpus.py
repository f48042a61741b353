"""GPU leasing: every pool that needs GPUs gets a set no other pytest process holds.

Runs in the controller. One lock file per GPU in a shared folder (``--distrank-gpu-lock-dir``),
held with ``flock``, so xdist workers and concurrent sessions on one machine never put two pools
on one GPU. The kernel drops a ``flock`` when its holder dies, so a lease held by a crashed or
``kill -9``-ed pytest frees itself; there is no stale lock to clean.

The folder is shared by every user of the machine (the default is in the system temp folder), so
a process that makes it makes it like ``/tmp``: sticky and world-writable. Everything in it is
reached through :mod:`lockfolder`, which trusts nothing another user put there (links, FIFOs,
names the plugin never writes) and refuses a folder others control. An ``OSError`` on the folder
reaches the caller, which makes it an error of the tests that needed the GPUs.

Memory shares (``requires_gpus(n, memory=...)``, docs/gpus.md): instead of the GPU's lock, a
pool may hold a share of it, a file of its own named by its size (``gpu-0.share.<bytes>.<pid>-<n>``)
and flocked for the pool's life; shares of one GPU may coexist while their sizes fit its memory
(:mod:`gpumemory`), and exclude a whole lease. Each decision is taken under a flock of the folder
itself, so whole and shared leases see each other's files as they are; a share whose flock is gone
(its holder died) counts for nothing and is removed. A name that does not parse counts for nothing.

The GPUs to choose from are the ones this process may use: the entries of an outer
``CUDA_VISIBLE_DEVICES`` when it is set (indices or UUIDs, used as lock names as written), else
``0 .. n-1``. Ranks get ``CUDA_VISIBLE_DEVICES`` set to their pool's lease, so ``cuda:0`` in a
rank is the lease's first GPU.

Test seam: ``DISTRANK_FAKE_GPU_COUNT=N`` (see planning/capabilities.py) makes N GPUs visible, so
leasing is tested on machines without GPUs.
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

from ...options import GPU_LOCK_DIR, GPU_WAIT
from ...parsing import size_words
from ...planning.capabilities import visible_gpu_count
from ...settings import Value
from . import lockfolder
from .gpumemory import total_memory
from .lockfolder import UnsafeFolder

if TYPE_CHECKING:
    from .memoryback import MemoryWatch
    from .poolkey import PoolKey

#: How often a waiting pool looks for released GPUs.
POLL_SECONDS = 0.2
#: The longest wait for the lock folder's own flock (held for microseconds per decision).
DECIDE_LIMIT = 30.0


class GpuUnavailable(Exception):
    """Not enough GPUs were released within the wait; the message says who holds them."""


@dataclasses.dataclass
class GpuLease:
    """GPUs one pool holds until :meth:`release` (or until this process dies)."""

    ids: tuple[str, ...]
    #: The flocked files that hold the lease, by name: the GPUs' lock files (a whole lease), or
    #: this lease's share files (``memory`` > 0).
    held: list[tuple[str, int]]
    #: The lock folder (its own descriptor), where the lease's share files are removed.
    folder: int = -1
    #: Seconds spent waiting for other processes to release GPUs.
    waited: float = 0.0
    #: Bytes of each GPU this lease holds; 0: the GPUs whole.
    memory: int = 0

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.ids)

    def release(self) -> None:
        """Give the GPUs back. Idempotent."""
        _drop(self.folder, self.held)
        self.held = []
        if self.folder >= 0:
            os.close(self.folder)
            self.folder = -1


def _drop(folder: int, held: list[tuple[str, int]]) -> None:
    """Close the files of a lease (dropping their flocks), removing its shares first."""
    for name, fd in held:
        if ".share." in name:
            with contextlib.suppress(OSError):
                lockfolder.remove(folder, name, fd)
        os.close(fd)


def visible_gpu_ids() -> list[str]:
    """The GPUs this process may lease, by the names ``CUDA_VISIBLE_DEVICES`` gives them."""
    count = visible_gpu_count()
    outer = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if outer:
        return [part.strip() for part in outer.split(",") if part.strip()][:count]
    return [str(i) for i in range(count)]


def _stem(gpu: str) -> str:
    """The start of the names of one GPU's files (the GPU's name made safe for a file name)."""
    return f"gpu-{re.sub(r'[^A-Za-z0-9_.-]', '_', gpu)}"


def lock_path(lock_dir: str, gpu: str) -> Path:
    """The lock file of one GPU."""
    return Path(lock_dir) / f"{_stem(gpu)}.lock"


def _try_take(
    folder: int, lock_dir: str, ids: list[str], count: int, busy: list[str], memory: int = 0
) -> GpuLease | None:
    """Take ``count`` GPUs at once (whole, or ``memory`` bytes of each), or none (then ``busy``
    lists the GPUs that could not be had)."""
    taken: list[tuple[str, tuple[str, int]]] = []
    busy.clear()
    try:
        for gpu in ids:
            with _deciding(folder, lock_dir):
                held = _take_share(folder, gpu, memory) if memory else _take_whole(folder, gpu)
            if held is None:
                busy.append(gpu)
                continue
            taken.append((gpu, held))
            if len(taken) == count:
                ids_taken = tuple(g for g, _ in taken)
                lease = GpuLease(ids_taken, [h for _, h in taken], os.dup(folder), memory=memory)
                _write_owner(lease)
                return lease
    except BaseException:
        _drop(folder, [h for _, h in taken])
        raise
    _drop(folder, [h for _, h in taken])
    return None


@contextlib.contextmanager
def _deciding(folder: int, lock_dir: str) -> Iterator[None]:
    """The lock folder itself, flocked for the moment a lease is decided, so whole and shared
    leases see each other's files as they are. A folder, not a file: a file made by one user in
    the sticky folder cannot be opened for writing by another (Linux's protected_regular).

    A decision takes microseconds; a holder stopped in the middle of one (Ctrl-Z) would block
    every session, so the wait is bounded (:data:`DECIDE_LIMIT`), then :class:`GpuUnavailable`.
    """
    deadline = time.monotonic() + DECIDE_LIMIT
    while not lockfolder.flocked(folder, exclusive=True):
        if time.monotonic() >= deadline:
            raise GpuUnavailable(
                f"another process has held the GPU lock folder {lock_dir} for "
                f"{DECIDE_LIMIT:g} s while deciding a lease (is a pytest process there "
                "stopped?)"
            )
        time.sleep(0.01)
    try:
        yield
    finally:
        fcntl.flock(folder, fcntl.LOCK_UN)


#: A share's name after the GPU's stem: its bytes, its holder's pid, its number there.
_SHARE_NAME = r"\.share\.([0-9]{1,20})\.([0-9]{1,10})-[0-9]{1,20}"


def _shares(folder: int, gpu: str) -> list[tuple[str, int, str]]:
    """The share files of this GPU: name, bytes, pid (``<stem>.share.<bytes>.<pid>-<n>``).
    Names that do not parse are not shares, whoever made them."""
    pattern = re.compile(re.escape(_stem(gpu)) + _SHARE_NAME)
    found = [(name, pattern.fullmatch(name)) for name in sorted(os.listdir(folder))]
    return [(name, int(m[1]), m[2]) for name, m in found if m]


def _live_shares(folder: int, gpu: str) -> int:
    """Bytes the live shares of this GPU hold; a share whose holder died (its flock is gone) is
    removed. What is not a regular file counts for nothing and stays."""
    used = 0
    for name, size, _ in _shares(folder, gpu):
        live = lockfolder.held(folder, name)
        if live:
            used += size
        elif live is False:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=folder)  # another user's stale share may stay
    return used


def _take_whole(folder: int, gpu: str) -> tuple[str, int] | None:
    """The GPU's lock, when no one holds it nor a share of it (nor put something else in the
    lock file's place)."""
    if _live_shares(folder, gpu):
        return None
    name = f"{_stem(gpu)}.lock"
    fd = lockfolder.open_file(folder, name, create_mode=lockfolder.LOCK_MODE)
    if fd is None:
        return None
    if not lockfolder.flocked(fd, exclusive=True):
        os.close(fd)
        return None
    return name, fd


def _take_share(folder: int, gpu: str, memory: int) -> tuple[str, int] | None:
    """A share of ``memory`` bytes of the GPU, when no one holds it whole and the live shares
    leave room; a GPU whose memory the driver does not tell is only leased whole."""
    capacity = total_memory(gpu)
    if capacity is None:
        return _take_whole(folder, gpu)
    used = _live_shares(folder, gpu)
    if not used and lockfolder.held(folder, f"{_stem(gpu)}.lock"):  # leased whole
        return None
    if used + memory > capacity:
        return None
    name = f"{_stem(gpu)}.share.{memory}.{os.getpid()}-{next(_SHARE_SEQ)}"
    try:
        fd = lockfolder.create(folder, name, lockfolder.NOTE_MODE)
    except FileExistsError:
        return None  # someone put a file under this name: the next try takes another
    if not lockfolder.flocked(fd, exclusive=True):  # opened and flocked by another already
        _drop(folder, [(name, fd)])
        return None
    return name, fd


#: Numbers the shares this process takes (a unique file name for each).
_SHARE_SEQ = itertools.count(1)


def _write_owner(lease: GpuLease) -> None:
    """Note who holds each GPU, for the message of a pool that waits in vain."""
    note = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}"
    for gpu in lease.ids:
        with contextlib.suppress(OSError):
            lockfolder.write_note(lease.folder, f"{_stem(gpu)}.owner", note)


def _holders(folder: int, ids: list[str]) -> str:
    lines = []
    for gpu in ids:
        shares = [share for share in _shares(folder, gpu) if lockfolder.held(folder, share[0])]
        planted = lockfolder.planted(folder, f"{_stem(gpu)}.lock")
        if shares:
            held = sum(size for _, size, _ in shares)
            pids = sorted({pid for _, _, pid in shares})
            capacity = total_memory(gpu)
            of = f" of {size_words(capacity)}" if capacity else ""
            count = "1 share holds" if len(shares) == 1 else f"{len(shares)} shares hold"
            note = f"{count} {size_words(held)}{of} (pid{'s' if len(pids) > 1 else ''} "
            note += f"{', '.join(pids)})"
        elif planted:
            note = (
                f"its lock file {_stem(gpu)}.lock is {planted}, which the plugin never makes "
                "(someone put it there; remove it)"
            )
        else:
            note = lockfolder.read_note(folder, f"{_stem(gpu)}.owner") or "holder unknown"
        lines.append(f"  GPU {gpu}: {note}")
    return "\n".join(lines)


def lease(count: int, lock_dir: str, wait: float, memory: int = 0) -> GpuLease:
    """Lease ``count`` GPUs (whole, or ``memory`` bytes of each), waiting up to ``wait`` seconds;
    raise :class:`GpuUnavailable`, :class:`~lockfolder.UnsafeFolder` for a folder others control,
    or ``OSError`` when the folder or a lock file in it is unusable."""
    ids = visible_gpu_ids()
    if count > len(ids):
        raise GpuUnavailable(f"needs {count} GPUs, only {len(ids)} visible ({', '.join(ids)})")
    folder = lockfolder.open_folder(lock_dir, [f"{_stem(gpu)}.lock" for gpu in ids])
    try:
        started = time.monotonic()
        busy: list[str] = []
        while True:
            taken = _try_take(folder, lock_dir, ids, count, busy, memory)
            if taken is not None:
                taken.waited = time.monotonic() - started
                return taken
            if time.monotonic() - started >= wait:
                raise GpuUnavailable(
                    f"could not lease {count} of the {len(ids)} visible GPUs within {wait:g} s: "
                    f"{len(busy)} are held by other pytest processes (locks in {lock_dir}):\n"
                    f"{_holders(folder, busy)}{_open_by(busy)}"
                )
            time.sleep(POLL_SECONDS)
    finally:
        os.close(folder)


def _open_by(gpus: list[str]) -> str:
    """Which processes have those GPUs' device files open (any user's: a leftover worker of
    an earlier test holds memory without holding a lock), as more lines, or ""."""
    from ...tree.held import holders_text

    text = holders_text(gpus)
    return f"\n{text}" if text else ""


class GpuFolderError(Exception):
    """The lock folder cannot be used; the message names it, the option and the repair."""


class SessionLeases:
    """One session's GPU leases: its lock folder and wait, and the pools that waited in vain.

    A pool (by key) that waited in vain once does not wait again: its later tests take what is
    free at that moment or are skipped at once. A whole lease then waits for its GPUs' memory to
    be back (:class:`memoryback.MemoryWatch`, when ``memory`` is given).
    """

    def __init__(
        self, lock_dir: Value[str], wait: Value[float], memory: MemoryWatch | None = None
    ) -> None:
        self.lock_dir = lock_dir
        self.wait = wait
        self.starved: set[Hashable] = set()
        self.memory = memory

    def take(self, key: PoolKey, kind: Hashable) -> GpuLease | None:
        """The GPUs pool ``key`` needs (None for none); ``kind`` names the pools that share a
        starved state. Raise :class:`GpuUnavailable` or :class:`GpuFolderError`."""
        if key.gpus == 0:
            return None
        wait, folder = self.wait, self.lock_dir
        seconds = 0.0 if kind in self.starved else wait.value
        try:
            taken = lease(key.gpus, folder.value, seconds, key.gpu_memory)
        except UnsafeFolder as exc:
            raise GpuFolderError(f"{exc}\n({GPU_LOCK_DIR.flag}, from {folder.source})") from None
        except OSError as exc:
            raise GpuFolderError(
                f"could not use the GPU lock folder {folder.value}: {exc}\n"
                f"({GPU_LOCK_DIR.flag}, from {folder.source}). Point it at a folder that "
                "every user of these GPUs can write (root's, or your own), or at a new one (the "
                "plugin makes it sticky and world-writable, like /tmp), or repair this one: "
                f"chmod 1777 {folder.value}"
            ) from None
        except GpuUnavailable as exc:
            self.starved.add(kind)
            again = "; this pool waited in vain before, not again" if wait.value > seconds else ""
            raise GpuUnavailable(
                f"{exc}\n({GPU_WAIT.flag}: {wait.value:g} s, from {wait.source}{again}). "
                f"Free GPUs or raise {GPU_WAIT.flag}; a lease ends with its pytest process."
            ) from None
        if self.memory is not None and not taken.memory:
            taken.waited += self.memory.settle(taken.ids, key.describe())
        return taken
