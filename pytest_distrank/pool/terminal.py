"""Header and summary lines of the controller's terminal report.

Runs in the controller. Kept apart from the dispatch logic so that what users read is in one place.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ..planning.gpuplan import GpuPolicy, describe_policy, nccl_version
from ..planning.order import describe_order, describe_seed
from ..settings import Settings
from .pools.stats import Stats


def header_line(
    s: Settings, gpu_policy: GpuPolicy, seed: int | None, order_seed: int | None, version: str
) -> str:
    """The session header's line: the options that shape every test, with their sources."""
    timeout = f"{s.timeout.value:g} s" if s.timeout.value else "none"
    isolate = ", isolate" if s.isolate.value else ""
    if s.preload.value:
        isolate += f", preload {','.join(s.preload.value)}"
    gpus = ""
    if gpu_policy.oversubscribe:  # only then is NCCL's version asked (imports torch)
        gpus = ", " + describe_policy(gpu_policy, nccl_version())
    order = describe_order(s.order, order_seed)
    return (
        f"distrank: {version}, backend {s.backend.value}, start method {s.start_method.value}, "
        f"{describe_seed(seed)}{', ' + order if order else ''}, "
        f"timeout {timeout} ({s.timeout.source}), "
        f"default world size {s.world_size.value}{isolate}{gpus}"
    )


def summary_lines(stats: Stats, notes: Sequence[str]) -> list[str]:
    """The session summary's lines: pools started, medians, pools killed, ``notes``."""
    if not stats.tests:
        # Only ordinary tests, but something still ran in ranks (a fixture at another world
        # size that an ordinary test requested) or went wrong there: say so.
        return list(notes)
    sizes = ", ".join(
        f"{count} at world size {size}" + (f" simulated ({mode})" if mode else "")
        for (size, mode), count in sorted(stats.pools_started.items(), key=lambda kv: kv[0][::-1])
    )
    tests = "1 distributed test" if stats.tests == 1 else f"{stats.tests} distributed tests"
    lines = [f"{tests}; pools started: {sizes or 'none'}"]
    starts = [pool.start_seconds for pool in stats.pools]
    if starts:
        lines.append(f"pool start: median {statistics.median(starts):.2f} s")
    if stats.test_seconds:
        median_ms = statistics.median(stats.test_seconds) * 1000
        lines.append(f"per-test wall time in the controller: median {median_ms:.1f} ms")
    for reason in stats.replaced:
        lines.append(f"pool killed after a fault: {reason}")
    lines.extend(notes)  # e.g. a world size far beyond the machine's cores
    return lines
