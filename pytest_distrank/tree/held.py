"""What a test's process tree holds that outlives it: shared memory segments, listening ports,
GPU device files.

Runs in the process that ends an opted-in test (``/dev/shm`` before and after it; the ports of
the tree's processes, read before they are killed) and in the controller when a GPU lease waits
(:func:`gpu_holders`, for its message). Linux only, through /proc and /dev.
"""

from __future__ import annotations

import contextlib
import os
import re

from ..envvars import FAKE_NVIDIA_DIR_ENV
from .procs import Proc, read_proc

SHM = "/dev/shm"
_LISTEN = "0A"


def shm_segments() -> set[str]:
    with contextlib.suppress(OSError):
        return set(os.listdir(SHM))
    return set()


def mapped_segments(pid: int, names: set[str]) -> set[str]:
    """Those of the /dev/shm segments ``names`` that ``pid`` itself maps (a multiprocessing
    queue the test still holds, in its traceback: the test's own, not its tree's). Told by
    inode: glibc maps a semaphore under a temporary name, deleted when it gets its own."""
    inodes = set()
    with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(f"{SHM}/") and fields[4].isdigit():
                inodes.add(int(fields[4]))
    found = set()
    for name in names:
        with contextlib.suppress(OSError):
            if os.stat(os.path.join(SHM, name)).st_ino in inodes:
                found.add(name)
    return found


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    out.add(target[8:-1])
    return out


def listening_ports(procs: list[Proc], root: int) -> list[tuple[int, Proc]]:
    """(port, process) of every TCP socket in LISTEN state that a process of ``procs`` holds
    and ``root`` (the process that runs the test) does not: a fork inherits its parent's."""
    owner: dict[str, Proc] = {}
    own = _socket_inodes(root)
    for proc in procs:
        for inode in _socket_inodes(proc.pid) - own:
            owner.setdefault(inode, proc)
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[3] == _LISTEN and fields[9] in owner:
                    port = int(fields[1].rsplit(":", 1)[1], 16)
                    found.append((port, owner[fields[9]]))
    return sorted(set(found), key=lambda pair: pair[0])


def held_text(shm: list[str], ports: list[tuple[int, Proc]]) -> str:
    """The section's lines: segments and ports the tree left, or ""."""
    lines = [f"/dev/shm segment left: {name}" for name in shm]
    lines += [f"port {port} was listening (pid {p.pid}, {p.cmdline[:60]})" for port, p in ports]
    return "\n".join(lines)


_NVIDIA = re.compile(r"nvidia(\d+)$")


def gpu_holders(gpus: list[str]) -> dict[str, list[Proc]]:
    """GPU index -> the processes with that GPU's device file (``/dev/nvidia<N>``) open.

    In a container with its own pid namespace, NVML's process list may give host pids or none;
    /proc's fd links name the processes this namespace sees. An index is the device's minor
    number, which NVML and CUDA under ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` share."""
    folder = os.environ.get(FAKE_NVIDIA_DIR_ENV) or "/dev"
    wanted = {g for g in gpus if g.isdigit()}
    out: dict[str, list[Proc]] = {}
    if not wanted:
        return out
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{entry}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{entry}/fd/{fd}")
                    match = _NVIDIA.search(target)
                    if match and os.path.dirname(target) == folder and match[1] in wanted:
                        procs = out.setdefault(match[1], [])
                        if all(p.pid != int(entry) for p in procs):
                            procs.append(read_proc(int(entry), -1))
    return out


def holders_text(gpus: list[str]) -> str:
    """``GPU 0 is held by pid 4711 (python -m vllm.worker)``, one line per GPU, or ""."""
    lines = []
    for gpu, procs in sorted(gpu_holders(gpus).items()):
        names = ", ".join(f"pid {p.pid} ({p.cmdline[:60]})" for p in procs[:6])
        lines.append(f"GPU {gpu} is held open by {names}")
    return "\n".join(lines)
