"""The Python stacks of a test's processes, read from outside them at a deadline.

Runs in the process that ends a test: the controller (an ordinary test at its deadline, a stuck
rank's tree) or a rank (an interrupt). py-spy (the ``stacks`` extra) reads another process's
Python stacks through ptrace, which nothing in the standard library can; it is run on at most
:data:`MAX_PROCS` processes at once, within :data:`BOUND_S` in all. Where py-spy is missing, or
refused (Yama ``ptrace_scope``, a container without ``CAP_SYS_PTRACE``), the faulthandler fallback
signals each Python process with :data:`TREE_SIGNAL`, which the tree's processes registered
(``fallback_env``'s sitecustomize in those started by exec, the parent's handler in forks), and
reads what it wrote to :data:`envvars.TREE_DIR_ENV`'s folder.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import faulthandler
import json
import os
import shutil
import subprocess
import sys
import time
from subprocess import PIPE
from typing import IO

from ..envvars import TREE_DIR_ENV as DIR_ENV
from ..envvars import TREE_PYSPY_ENV as PYSPY_ENV
from . import reaped
from .procs import FALLBACK_SIGNAL as TREE_SIGNAL
from .procs import Proc
from .reaped import OWN_CHILDREN

MAX_PROCS = 16
BOUND_S = 4.0
#: What a refusal by ptrace rules looks like in py-spy's error output.
_REFUSED = ("Permission denied", "Operation not permitted", "ptrace")

SITECUSTOMIZE = '''"""pytest-distrank's process-tree fallback (docs/own-workers.md): this
process's stacks go to a file of its own on a signal, the statuses of the children it reaps to
another; then the sitecustomize this one hides runs."""
import faulthandler, importlib, os, sys
_dir = os.environ.get("{env}")
if _dir:
    try:
        _path = os.path.join(_dir, "%d.stacks" % os.getpid())
        # A descriptor, not a file object: no ResourceWarning at exit (python -X dev).
        _fd = os.open(_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        faulthandler.register({signal}, file=_fd, all_threads=True)
        from _distrank_reaped import record_reaped  # a copy of tree/reaped.py: no torch import
        record_reaped(_dir)
    except (OSError, ImportError):
        pass
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_ours = sys.modules.pop("sitecustomize")
try:
    importlib.import_module("sitecustomize")
except ImportError:
    pass
finally:
    sys.modules["sitecustomize"] = _ours  # the import that runs this one pops it back
'''


@dataclasses.dataclass(frozen=True)
class Stacks:
    """One process's stacks in words, or why there are none."""

    proc: Proc
    threads: list[tuple[str, list[str]]]  # (thread title, frames innermost first)
    missing: str = ""


def pyspy() -> str | None:
    """The py-spy executable: the seam's, the one beside this Python, or on PATH."""
    seam = os.environ.get(PYSPY_ENV, "")
    if seam:
        return None if seam == "none" else seam
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


def fallback_env(folder: str) -> dict[str, str]:
    """The variables that make the tree's Python processes answer :data:`TREE_SIGNAL`."""
    site = os.path.join(folder, "site")
    os.makedirs(site, exist_ok=True)
    path = os.path.join(site, "sitecustomize.py")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(SITECUSTOMIZE.format(env=DIR_ENV, signal=int(TREE_SIGNAL)))
    shutil.copyfile(reaped.__file__, os.path.join(site, "_distrank_reaped.py"))
    old = os.environ.get("PYTHONPATH", "")
    return {DIR_ENV: folder, "PYTHONPATH": site + (os.pathsep + old if old else "")}


def register_here(folder: str) -> IO[str] | None:
    """This process's own handler for forks of it (they inherit it, not the sitecustomize); its
    file, for :func:`unregister_here` to close (faulthandler keeps only the descriptor)."""
    try:
        file = open(os.path.join(folder, f"{os.getpid()}.stacks"), "a")
    except OSError:
        return None
    try:
        faulthandler.register(TREE_SIGNAL, file=file, all_threads=True, chain=False)
    except (ValueError, RuntimeError):
        file.close()
        return None
    return file


def unregister_here(file: IO[str] | None) -> None:
    with contextlib.suppress(ValueError, RuntimeError):
        faulthandler.unregister(TREE_SIGNAL)
    if file is not None:
        file.close()


def dump_tree(procs: list[Proc], folder: str | None) -> tuple[list[Stacks], str]:
    """Every process's stacks (Python ones read, others listed) and how they were read."""
    python = [p for p in procs if p.python]
    others = [Stacks(p, [], "not a Python process") for p in procs if not p.python]
    taken, skipped = python[:MAX_PROCS], python[MAX_PROCS:]
    rest = [Stacks(p, [], f"not read: more than {MAX_PROCS} processes") for p in skipped]
    uid = os.geteuid()
    foreign = [p for p in taken if p.uid not in (uid, -1) and uid != 0]
    taken = [p for p in taken if p not in foreign]
    rest += [Stacks(p, [], f"not read: runs as uid {p.uid}, not {uid}") for p in foreign]
    exe = pyspy()
    method = "py-spy"
    results: list[Stacks] = []
    if exe is None:
        method = "faulthandler (py-spy is not installed: pip install pytest-distrank[stacks])"
    else:
        results = _by_pyspy(exe, taken)
        refused = [s for s in results if s.missing.startswith("refused")]
        if refused and len(refused) == len(results):
            why = refused[0].missing.removeprefix("refused: ")
            method = f"faulthandler (py-spy was refused: {why})"
            results = []
    if not results and taken:
        results = _by_faulthandler(taken, folder)
    return results + others + rest, method


def _by_pyspy(exe: str, procs: list[Proc]) -> list[Stacks]:
    deadline = time.monotonic() + BOUND_S

    def one(proc: Proc) -> Stacks:
        left = max(0.1, deadline - time.monotonic())
        command = [exe, "dump", "--pid", str(proc.pid), "--json"]
        try:
            child = subprocess.Popen(command, stdout=PIPE, stderr=PIPE, text=True)
        except OSError as exc:
            return Stacks(proc, [], f"refused: {exe} could not run ({exc})")
        OWN_CHILDREN.add(child.pid)  # its exit status is no death of the tree's
        try:
            out, err = child.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            return Stacks(proc, [], f"py-spy did not answer within {BOUND_S:g} s")
        if child.returncode != 0:
            first = (err.strip().splitlines() or ["no output"])[0]
            if any(word in err for word in _REFUSED):
                return Stacks(proc, [], f"refused: {first}")
            return Stacks(proc, [], f"py-spy failed: {first}")
        return Stacks(proc, parse_pyspy(out))

    with concurrent.futures.ThreadPoolExecutor(max(1, min(MAX_PROCS, len(procs)))) as pool:
        return list(pool.map(one, procs))


def parse_pyspy(text: str) -> list[tuple[str, list[str]]]:
    """py-spy's ``dump --json``: the main thread first, then the others."""
    try:
        threads = json.loads(text)
    except ValueError:
        return []
    out = []
    for thread in threads if isinstance(threads, list) else []:
        frames = [
            f'File "{f.get("filename")}", line {f.get("line")} in {f.get("name")}'
            for f in thread.get("frames") or []
        ]
        title = f"Thread {thread.get('os_thread_id')} ({thread.get('thread_name') or '?'})"
        out.append((title, frames))
    out.sort(key=lambda t: "(MainThread)" not in t[0])
    return out


def _by_faulthandler(procs: list[Proc], folder: str | None) -> list[Stacks]:
    """Signal each process in turn; what any dump file grows by is that process's stacks."""
    if folder is None or not os.path.isdir(folder):
        return [Stacks(p, [], "no stack: the fallback was not armed") for p in procs]
    deadline = time.monotonic() + BOUND_S
    out = []
    for proc in procs:
        if time.monotonic() > deadline:
            out.append(Stacks(proc, [], f"not read: the {BOUND_S:g} s bound was spent"))
            continue
        sizes = _sizes(folder)
        try:
            os.kill(proc.pid, TREE_SIGNAL)
        except OSError as exc:
            out.append(Stacks(proc, [], f"no stack: {exc.strerror}"))
            continue
        text = _grown(folder, sizes, min(deadline, time.monotonic() + 1.0))
        if text:
            out.append(Stacks(proc, parse_faulthandler(text)))
        else:
            out.append(Stacks(proc, [], "no stack: it did not answer the fallback's signal"))
    return out


def _sizes(folder: str) -> dict[str, int]:
    out = {}
    for name in os.listdir(folder):
        with contextlib.suppress(OSError):
            out[name] = os.path.getsize(os.path.join(folder, name))
    return out


def _grown(folder: str, before: dict[str, int], until: float) -> str:
    """What the dump files gained, once they stopped growing (or at ``until``)."""
    last: dict[str, int] = dict(before)
    quiet = 0
    while time.monotonic() < until:
        time.sleep(0.02)
        now = _sizes(folder)
        if now != last:
            last, quiet = now, 0
        elif now != before:
            quiet += 1
            if quiet >= 2:
                break
    text = ""
    for name, size in last.items():
        start = before.get(name, 0)
        if size > start:
            with open(os.path.join(folder, name), "rb") as f:
                f.seek(start)
                text += f.read(size - start).decode("utf-8", "replace")
    return text


def parse_faulthandler(text: str) -> list[tuple[str, list[str]]]:
    """faulthandler's dump: the thread that took the signal (the main one, usually) first."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            out.append((line.rstrip(":").replace(" (most recent call first)", ""), []))
        elif line.strip().startswith("File ") and out:
            out[-1][1].append(line.strip())
    out.sort(key=lambda t: not t[0].startswith("Current"))
    return out
