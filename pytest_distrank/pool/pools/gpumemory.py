"""How much memory a GPU has, asked of the driver without initialising CUDA.

Runs in the controller, when a pool that declared its GPU memory (``requires_gpus(n,
memory="8GiB")``) leases GPUs (:mod:`gpus`). The answer comes from NVML, the driver's management
library (``libnvidia-ml.so.1``, installed with every NVIDIA driver), called through ``ctypes``:
four functions of a stable C API. ``nvidia-ml-py`` wraps the same library; it would be a
dependency for every user (CPU-only ones included) to save those four calls, so it is not one.
``torch.cuda.mem_get_info`` would initialise CUDA in the controller, which then could not fork
rank processes safely.

Test seam: ``DISTRANK_FAKE_GPU_MEMORY`` (``80GiB``) is the memory of every GPU, so memory leases
are tested on machines without GPUs.
"""

from __future__ import annotations

import ctypes
import functools
import os

from ...parsing import parse_bytes
from ...settings import FAKE_GPU_MEMORY_ENV


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


def total_memory(gpu: str) -> int | None:
    """Bytes of memory of the GPU named ``gpu`` (an index, or a ``GPU-...`` UUID, as
    ``CUDA_VISIBLE_DEVICES`` names it); None when the driver cannot say.

    An index is NVML's index: the same as CUDA's under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; on a
    machine of identical GPUs the order does not change the answer.
    """
    fake = os.environ.get(FAKE_GPU_MEMORY_ENV, "").strip()
    if fake:
        return parse_bytes(fake)
    lib = _nvml()
    if lib is None:
        return None
    handle = ctypes.c_void_p()
    if gpu.isdigit():
        status = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(int(gpu)), ctypes.byref(handle))
    else:
        status = lib.nvmlDeviceGetHandleByUUID(gpu.encode(), ctypes.byref(handle))
    if status != 0:
        return None
    memory = _Memory()
    if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != 0:
        return None
    return int(memory.total)
