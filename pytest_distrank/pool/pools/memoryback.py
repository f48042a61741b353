"""GPU memory back before the next test: each GPU's baseline, the bounded wait, the note.

Runs in the controller, when a pool leases GPUs whole (:class:`gpus.SessionLeases`). The first
whole lease of a GPU in the session records what the GPU uses then (its baseline); a later one
waits, up to ``--distrank-gpu-memory-wait`` seconds, until the GPU uses no more than that plus
:data:`TOLERANCE` again: the pools before it released the GPU, but a process their tree left (a
worker of an engine, a daemon) may still hold memory. When it is not back in time the pool
starts anyway and a note for the session summary names the GPU, the memory still held and the
processes holding it. Shares (``requires_gpus(n, memory=...)``) do not wait: other sessions'
pools may use the same GPU at the same time, so its use says nothing about the pool before.
Without NVML (:func:`gpumemory.used_memory` says None) nothing waits and nothing is said.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence

from ...options import GPU_MEMORY_WAIT
from ...parsing import size_words
from ...settings import Value
from .gpumemory import gpu_processes, used_memory

#: How far above its baseline a GPU's use still counts as back. Absolute, not a share of the
#: GPU: the smallest leftover worth naming is a CUDA context (about 300-600 MiB on current
#: GPUs), which 2 % of an 80 GiB GPU (1.6 GiB) would hide; an idle GPU's use moves by a few MiB.
TOLERANCE = 64 * 2**20
#: How often a waiting lease reads the GPUs' use.
POLL_SECONDS = 0.1


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether a GPU's memory is back, and how much of it is still held above the baseline."""

    back: bool
    #: Bytes above the baseline at the last sample (0 when at or below it).
    held: int
    #: The use went down by more than the tolerance while it was sampled: the holder may still
    #: be freeing it (a longer wait may do), rather than holding it.
    falling: bool


def judge(baseline: int, samples: Sequence[int], tolerance: int = TOLERANCE) -> Verdict:
    """The verdict on a GPU from its use over the wait (oldest first): back when the latest
    sample is within ``tolerance`` of ``baseline``; no samples: back (nothing is known)."""
    if not samples:
        return Verdict(True, 0, False)
    last = samples[-1]
    held = max(0, last - baseline)
    return Verdict(held <= tolerance, held, max(samples) - last > tolerance)


class MemoryWatch:
    """One session's GPU baselines, and the wait of a whole lease for its GPUs' memory."""

    def __init__(
        self,
        wait: Value[float],
        notes: list[str],
        read: Callable[[str], int | None] = used_memory,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.wait = wait
        self.notes = notes
        self.baselines: dict[str, int] = {}
        self._read, self._clock, self._sleep = read, clock, sleep

    def settle(self, gpus: Sequence[str], pool: str) -> float:
        """Record the baselines of GPUs leased for the first time; wait for the others' memory
        to be back; add a note for each GPU whose memory is not back in time. The seconds
        waited."""
        if self.wait.value <= 0:
            return 0.0
        samples: dict[str, list[int]] = {}
        for gpu in gpus:
            used = self._read(gpu)
            if used is None:
                continue
            if gpu in self.baselines:
                samples[gpu] = [used]
            else:
                self.baselines[gpu] = used
        started = self._clock()
        waiting = [g for g in samples if not judge(self.baselines[g], samples[g]).back]
        while waiting and self._clock() - started < self.wait.value:
            self._sleep(POLL_SECONDS)
            for gpu in waiting:
                used = self._read(gpu)
                if used is not None:
                    samples[gpu].append(used)
            waiting = [g for g in waiting if not judge(self.baselines[g], samples[g]).back]
        waited = self._clock() - started
        for gpu in waiting:
            self.notes.append(self._note(gpu, samples[gpu], waited, pool))
        return waited

    def _note(self, gpu: str, samples: list[int], waited: float, pool: str) -> str:
        baseline = self.baselines[gpu]
        verdict = judge(baseline, samples)
        lines = [
            f"GPU {gpu}: {size_words(verdict.held)} of its memory still held {waited:.1f} s "
            f"after the pools before released it (it uses {size_words(samples[-1])}, "
            f"{size_words(baseline)} when this session first leased it; tolerance "
            f"{size_words(TOLERANCE)}); the pool {pool} started on it anyway"
        ]
        lines += [f"  {line}" for line in _holders(gpu).splitlines()]
        more = (
            f"raise {GPU_MEMORY_WAIT.flag} ({self.wait.value:g} s, from {self.wait.source}): "
            "its use was still going down"
            if verdict.falling
            else "end the process that holds it (a worker the test started, left running)"
        )
        lines.append(f"  What to do: {more}; a test that starts workers should end them.")
        return "\n".join(lines)


def _holders(gpu: str) -> str:
    """Who holds the GPU: NVML's process list (host pids: in a container with its own pid
    namespace they may be none or unknown here), then the processes with its device file open."""
    from ...tree.held import holders_text

    lines = [
        f"NVML: pid {pid} uses {size_words(used)}"
        + ("" if os.path.exists(f"/proc/{pid}") else " (a pid this pid namespace does not see)")
        for pid, used in gpu_processes(gpu)[:6]
    ]
    opened = holders_text([gpu])
    if opened:
        lines.append(opened)
    if not lines:
        lines.append(
            "no process seen holding it (in a container, NVML's pids and /dev/nvidia* may "
            "be hidden: look with nvidia-smi on the host)"
        )
    return "\n".join(lines)
