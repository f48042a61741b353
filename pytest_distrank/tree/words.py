"""The process tree in a test's report: stacks, deaths, what was ended, and the verdict on deaths.

Runs where the report is made (the controller for ordinary tests and stuck ranks' trees, a rank
for its distributed test). Pure text over :mod:`procs` and :mod:`dump` values.
"""

from __future__ import annotations

from .dump import Stacks
from .procs import Death, Proc, signal_name

#: Section titles in a report (``Captured`` first words would send them to junit's system-out).
STACKS_TITLE = "process tree: stacks"
DEATHS_TITLE = "process tree"
SHOWN_CMDLINE = 120


def short_cmdline(proc: Proc) -> str:
    text = proc.cmdline or "?"
    return text if len(text) <= SHOWN_CMDLINE else text[: SHOWN_CMDLINE - 3] + "..."


def blocked_in_dist(frames: list[str]) -> str:
    """The innermost ``torch.distributed`` frame of a thread's stack, "" when none."""
    for frame in frames:
        if "/torch/distributed/" in frame:
            return frame
    return ""


#: Frames of these run the test, not the worker: a fork of the test's process carries them.
_MACHINERY = ("/_pytest/", "/pluggy/", "/pytest_distrank/")


def below_pytest(frames: list[str]) -> list[str]:
    """A thread's frames (innermost first) down to the first of pytest's machinery."""
    cut = next((i for i, f in enumerate(frames) if any(m in f for m in _MACHINERY)), len(frames))
    return frames[:cut]


def stacks_text(stacks: list[Stacks], method: str, seconds: float) -> str:
    lines = [f"{len(stacks)} process(es) of the test's tree, stacks by {method} in {seconds:.2f} s"]
    for one in stacks:
        proc = one.proc
        lines.append("")
        lines.append(f"pid {proc.pid} (parent {proc.ppid}): {short_cmdline(proc)}")
        if one.missing:
            lines.append(f"  ({one.missing})")
            continue
        for title, frames in one.threads:
            where = blocked_in_dist(frames)
            mark = f"  <- blocked in torch.distributed: {where}" if where else ""
            lines.append(f"  {title}{mark}")
            shown = below_pytest(frames)
            lines += [f"    {frame}" for frame in shown] or ["    (no Python frame)"]
            if len(shown) < len(frames):
                lines.append(f"    ({len(frames) - len(shown)} frames of pytest's below)")
    return "\n".join(lines)


def death_line(death: Death, name: str = "process") -> str:
    """``process (pid 4711, python -m w) died of SIGSEGV at 3.1 s``."""
    proc = death.proc
    how = (
        f"died of {signal_name(death.signal)}"
        if death.signal
        else f"exited with code {death.exit_code}"
    )
    return f"{name} (pid {proc.pid}, {short_cmdline(proc)}) {how} at {death.at:.1f} s"


def deaths_text(deaths: list[Death]) -> str:
    return "\n".join(death_line(d) for d in deaths)


def fails_test(deaths: list[Death], policy: str, outcome: str) -> bool:
    """Whether deaths in the tree turn a test's ``outcome`` into a failure: only under the
    'fail' policy, only for a test that passed (a failure or a skip stays what it was)."""
    return policy == "fail" and outcome == "passed" and any(d.status != 0 for d in deaths)


def ended_text(procs: list[Proc]) -> str:
    names = ", ".join(f"{p.pid} ({short_cmdline(p)[:40]})" for p in procs[:8])
    more = f" and {len(procs) - 8} more" if len(procs) > 8 else ""
    return f"ended {len(procs)} process(es) the test left running: {names}{more}"
