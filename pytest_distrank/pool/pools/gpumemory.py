"""How much memory a GPU has and uses, asked of the driver without initialising CUDA.

Runs in the controller, when a pool that declared its GPU memory (``requires_gpus(n,
memory="8GiB")``) leases GPUs (:mod:`gpus`), and when a whole lease waits for the memory of the
pool before to come back (:mod:`memoryback`). The answers come from NVML, the driver's management
library (``libnvidia-ml.so.1``, installed with every NVIDIA driver), called through ``ctypes``:
a few functions of a stable C API. ``nvidia-ml-py`` wraps the same library; it would be a
dependency for every user (CPU-only ones included) to save those four calls, so it is not one.
``torch.cuda.mem_get_info`` would initialise CUDA in the controller, which then could not fork
rank processes safely.

Test seams: ``DISTRANK_FAKE_GPU_MEMORY`` (``80GiB``) is the memory of every GPU, so memory leases
are tested on machines without GPUs; ``DISTRANK_FAKE_GPU_USED_DIR`` is a folder of one file per
GPU (named as ``CUDA_VISIBLE_DEVICES`` names it) holding the bytes it uses, which a test may
rewrite while a session runs (no file: as if the driver could not say).
"""

from __future__ import annotations

import ctypes
import functools
import os

from ...envvars import FAKE_GPU_MEMORY_ENV, FAKE_GPU_USED_DIR_ENV
from ...parsing import parse_bytes


class _Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


@functools.cache
def _nvml() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    return lib if lib.nvmlInit_v2() == 0 else None


class _Process(ctypes.Structure):
    """NVML's ``nvmlProcessInfo_t`` (the ``_v2``/``_v3`` calls' entries)."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("used", ctypes.c_ulonglong),
        ("gpu_instance", ctypes.c_uint),
        ("compute_instance", ctypes.c_uint),
    ]


def _handle(gpu: str) -> tuple[ctypes.CDLL, ctypes.c_void_p] | None:
    """NVML and its handle of the GPU named ``gpu`` (an index or a ``GPU-...`` UUID)."""
    lib = _nvml()
    if lib is None:
        return None
    handle = ctypes.c_void_p()
    if gpu.isdigit():
        status = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(int(gpu)), ctypes.byref(handle))
    else:
        status = lib.nvmlDeviceGetHandleByUUID(gpu.encode(), ctypes.byref(handle))
    return (lib, handle) if status == 0 else None


def _memory(gpu: str) -> _Memory | None:
    found = _handle(gpu)
    if found is None:
        return None
    lib, handle = found
    memory = _Memory()
    return memory if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) == 0 else None


def total_memory(gpu: str) -> int | None:
    """Bytes of memory of the GPU named ``gpu`` (an index, or a ``GPU-...`` UUID, as
    ``CUDA_VISIBLE_DEVICES`` names it); None when the driver cannot say.

    An index is NVML's index: the same as CUDA's under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; on a
    machine of identical GPUs the order does not change the answer.
    """
    fake = os.environ.get(FAKE_GPU_MEMORY_ENV, "").strip()
    if fake:
        return parse_bytes(fake)
    memory = _memory(gpu)
    return None if memory is None else int(memory.total)


def used_memory(gpu: str) -> int | None:
    """Bytes of the GPU's memory in use, by every process (NVML's ``used``); None when the
    driver cannot say."""
    folder = os.environ.get(FAKE_GPU_USED_DIR_ENV, "")
    if folder:
        try:
            with open(os.path.join(folder, gpu)) as f:
                return parse_bytes(f.read())
        except (OSError, ValueError):
            return None
    memory = _memory(gpu)
    return None if memory is None else int(memory.used)


def gpu_processes(gpu: str) -> list[tuple[int, int]]:
    """(pid, bytes) of the compute processes NVML says use the GPU; [] when it cannot say.

    The pids are the host's: in a container with its own pid namespace they may name no process
    this one sees, or NVML lists none (:func:`tree.held.gpu_holders` is the fallback).
    """
    found = None if os.environ.get(FAKE_GPU_USED_DIR_ENV) else _handle(gpu)
    if found is None:
        return []
    lib, handle = found
    call = getattr(lib, "nvmlDeviceGetComputeRunningProcesses_v3", None) or getattr(
        lib, "nvmlDeviceGetComputeRunningProcesses_v2", None
    )
    if call is None:
        return []
    count = ctypes.c_uint(64)
    infos = (_Process * 64)()
    if call(handle, ctypes.byref(count), infos) != 0:
        return []
    return [(int(p.pid), int(p.used)) for p in infos[: min(count.value, 64)]]
