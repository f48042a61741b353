"""Whether a test's ranks stand still: when to read their flight records, never a verdict.

Runs wherever a deadlock may be ended early: in the controller (pool mode, :mod:`pool.deadlock`,
watching every pending rank of a test) and in each rank of a launched world (launcher mode,
:mod:`launch.deadwatch`, each rank's watchdog watching its own process). Pure bookkeeping over
marks the caller passes (the ranks' phases, the count of their reports) and the CPU time of
processes (``/proc/<pid>/stat``): healthy tests cost one small file read per process every
:data:`WATCH_EVERY` seconds, and nothing else.

Silence only decides *when* to look: on a loaded machine a rank can be descheduled for seconds.
What is proven is decided from the records (:func:`collectives.explain`).
"""

from __future__ import annotations

import dataclasses
import linecache
from collections.abc import Hashable, Iterable

from ..envvars import seam_wait
from .stacks import main_thread_frames

#: How often the ranks are looked at while nothing else happens (seconds).
WATCH_EVERY = 0.5
#: How long the ranks must stand still before their records are read (seconds). Measured: a
#: rank blocked in a gloo collective spends no CPU time at all; 2 s is many of the watch's looks
#: and short beside any deadline (``DISTRANK_TEST_WAITS`` sets it for the plugin's own tests).
QUIET = seam_wait(2.0)
#: CPU clock ticks (10 ms) a standing-still rank may spend within the quiet time: the threads of
#: a blocked rank (torch's, the plugin's) wake now and then.
CPU_SLACK = 2


def cpu_ticks(pid: int) -> int | None:
    """User plus system CPU time of a process (all its threads), in clock ticks; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


@dataclasses.dataclass
class Stillness:
    """Since when some processes made no progress: no new mark, no CPU time beyond the slack."""

    #: When they last made progress (monotonic seconds).
    since: float
    #: How long they must stand still before :meth:`still` says so.
    quiet: float = QUIET
    marks: Hashable = None
    ticks: dict[int, int] = dataclasses.field(default_factory=dict)

    def progress(self, now: float) -> None:
        """Progress seen another way (a message arrived): the quiet time starts again."""
        self.since, self.quiet = now, QUIET

    def observe(self, now: float, marks: Hashable, pids: Iterable[int]) -> bool:
        """Look at ``pids`` and their ``marks`` now; True when they made progress since the
        last look (the quiet time then starts again)."""
        moved = marks != self.marks
        for pid in pids:
            ticks = cpu_ticks(pid)
            if ticks is None:
                continue
            if ticks > self.ticks.get(pid, ticks) + CPU_SLACK:
                moved = True
                self.ticks[pid] = ticks
            self.ticks.setdefault(pid, ticks)
        if moved:
            self.marks = marks
            self.progress(now)
        return moved

    def still(self, now: float) -> bool:
        """They stood still for the quiet time."""
        return now - self.since >= self.quiet

    def rebase(self, pids: Iterable[int]) -> None:
        """The CPU time spent so far is no progress (the watcher's own reading of records and
        stacks, which runs in the watched processes)."""
        for pid in pids:
            ticks = cpu_ticks(pid)
            if ticks is not None:
                self.ticks[pid] = ticks

    def unproven(self, now: float) -> None:
        """A look that proved nothing: wait twice as long before the next."""
        self.since, self.quiet = now, self.quiet * 2


def waits_on_work(dump: str, test_file: str) -> str:
    """Where a standing-still main thread waits on collectives outside any ``torch.distributed``
    call, in words, or "": in ``Work.wait()`` (a C++ method, so the innermost Python frame is
    its caller, whose line calls ``.wait(``) or in the autograd engine (DDP's backward waits
    there for its buckets' ``all_reduce``). No record says which pending collective it waits
    on: the proof accepts it only where every collective it left pending is hopeless
    (:attr:`collectives.Verdict.stuck`).

    Only ``.wait()`` with no argument: a ``Work.wait(timeout=...)`` ends on its own timeout
    (an error the test may catch), which the records never show, so such a rank proves nothing
    and the test's deadline decides; so does a call whose line does not show its closing ``)``."""
    frames = main_thread_frames(dump)
    if not frames:
        return ""
    file, line, func = frames[0]
    if "/torch/autograd/" in file:
        return f"the autograd engine ({func})"
    if ".wait()" not in linecache.getline(file, line):
        return ""
    own = f" in {func}" if file == test_file else ""
    return f"Work.wait(){own} at {file.rsplit('/', 1)[-1]}:{line}"
