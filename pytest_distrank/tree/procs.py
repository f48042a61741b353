"""A test's process tree read from /proc: who is in it, who died during it, what it holds.

Runs in the process that runs the test (the controller for an ordinary test, a rank for a
distributed one) and, for a stuck rank's tree at its deadline, in the controller. Linux only.
A watch thread polls /proc every :data:`POLL_S` while the test runs: a process born during the
test joins the tree, one that turns zombie is read for its exit status before its parent reaps
it (one reaped in between is seen gone, its status unknown, and not named).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Iterator

from ..rank.processstate import PROCESS_HELPERS
from ..rank.reaper import kill_all
from .reaped import read_reaped

POLL_S = 0.1
#: faulthandler's signal in the tree's processes (SIGUSR1 and SIGUSR2 are the ranks' own). A
#: process with no handler for it dies of it: the plugin's doing, not a death of the test's.
FALLBACK_SIGNAL = signal.SIGRTMIN + 7
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


@dataclasses.dataclass(frozen=True)
class Proc:
    """One process as /proc showed it."""

    pid: int
    ppid: int
    cmdline: str
    uid: int
    python: bool
    start: int = 0  # its start time (/proc/<pid>/stat field 22): a pid with another is another

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.start)


@dataclasses.dataclass(frozen=True)
class Death:
    """A process of the tree that ended during the test with a signal or a non-zero exit."""

    proc: Proc
    status: int  # waitpid's: the low 7 bits the signal, else the exit code << 8
    at: float  # seconds into the test

    @property
    def signal(self) -> int:
        return self.status & 0x7F

    @property
    def exit_code(self) -> int:
        return (self.status >> 8) & 0xFF


def _fields(pid: int) -> list[bytes] | None:
    """/proc/<pid>/stat's fields from the third (the state letter) on."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _stat(pid: int) -> tuple[str, int, int] | None:
    """State letter, parent pid and (for a zombie) exit status, from /proc/<pid>/stat."""
    fields = _fields(pid)
    try:
        code = int(fields[49]) if fields is not None and len(fields) > 49 else 0
        return (fields[0].decode(), int(fields[1]), code) if fields is not None else None
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> int:
    """When ``pid`` started (clock ticks since boot), 0 when unknown: with the pid, a process's
    identity (a pid is reused)."""
    fields = _fields(pid)
    try:
        return int(fields[19]) if fields is not None else 0
    except (IndexError, ValueError):
        return 0


def read_proc(pid: int, ppid: int) -> Proc:
    cmdline, uid, python = "", -1, False
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    if not cmdline:  # a zombie, a kernel thread: its name alone, as ps shows it
        with contextlib.suppress(OSError, IndexError), open(f"/proc/{pid}/stat", "rb") as f:
            name = f.read().split(b"(", 1)[1].rsplit(b")", 1)[0]
            cmdline = f"[{name.decode('utf-8', 'replace')}]"
    with contextlib.suppress(OSError):
        uid = os.stat(f"/proc/{pid}").st_uid
    with contextlib.suppress(OSError):
        python = "python" in os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    return Proc(pid, ppid, cmdline, uid, python, start_time(pid))


def all_parents(zombies: dict[int, int] | None = None) -> dict[int, int]:
    """pid -> parent pid of every living process; zombies go to ``zombies`` when given."""
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[0] != "Z":
                out[int(entry)] = stat[1]
            elif stat is not None and zombies is not None:
                zombies[int(entry)] = stat[1]
    return out


def descendants_of(roots: set[int], parents: dict[int, int] | None = None) -> dict[int, int]:
    """pid -> parent pid of every living descendant of ``roots``."""
    parents = all_parents() if parents is None else parents
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, int] = {}
    todo = list(roots)
    while todo:
        parent = todo.pop()
        for child in children.get(parent, []):
            if child not in found and child not in roots:
                found[child] = parent
                todo.append(child)
    return found


def is_helper(proc: Proc, parent_cmdline: str | None = None) -> bool:
    """A multiprocessing forkserver or resource tracker, an inductor compile worker: started
    on first use and kept for the process's life, not a test's own worker. A fork server's
    worker has its command line too, and its parent's (``parent_cmdline``, read from /proc when
    not given): it is a worker."""
    helper = next((h for h in PROCESS_HELPERS if h in proc.cmdline), None)
    if helper is None:
        return False
    if parent_cmdline is None:
        parent_cmdline = read_proc(proc.ppid, -1).cmdline if proc.ppid > 0 else ""
    return helper not in parent_cmdline


class Watch:
    """The tree of one running test: processes born under ``root`` since the start."""

    def __init__(
        self, root: int, folder: str | None = None, ended: set[tuple[int, int]] | None = None
    ) -> None:
        self.root = root
        self.folder = folder
        #: (pid, start time) of the processes the plugin ended in earlier tests: their parent
        #: may reap them during this one. Keyed by start time too: their pids are reused.
        self.ended = ended if ended is not None else set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.rebase()
        self._thread = threading.Thread(target=self._loop, name="distrank-tree-watch", daemon=True)
        self._thread.start()

    def rebase(self) -> None:
        """The tree starts now: what runs now (a wider fixture's server) is not in it."""
        with self._lock:
            self.started = time.monotonic()
            self.wall = time.time()
            self.before = set(descendants_of({self.root}))
            self.procs: dict[int, Proc] = {}
            self.deaths: list[Death] = []
            self._gone: set[int] = set()  # processes no longer watched: gone, or ended

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            self.poll()

    def poll(self) -> None:
        with self._lock:
            now = time.monotonic() - self.started
            zombies: dict[int, int] = {}
            parents = all_parents(zombies)
            live = descendants_of({self.root}, parents)
            for pid, ppid in live.items():
                if pid not in self.before and pid not in self.procs:
                    self._add(pid, ppid)
            tree = {self.root, *live}
            for pid, ppid in zombies.items():  # died before a poll saw it alive, not reaped
                if ppid in tree and pid not in self.procs and pid not in self.before:
                    self._add(pid, ppid)
            self._reaped(now)
            for pid, proc in self.procs.items():
                if pid in live or pid in self._gone:
                    continue
                stat = _stat(pid)
                if stat is not None and stat[0] == "Z":
                    self._gone.add(pid)
                    if stat[2] != 0 and stat[2] & 0x7F != FALLBACK_SIGNAL:
                        self.deaths.append(Death(proc, stat[2], now))
                elif stat is None or stat[1] != proc.ppid:
                    self._gone.add(pid)  # reaped (or the pid reused): status unknown

    def _add(self, pid: int, ppid: int) -> None:
        proc = read_proc(pid, ppid)
        self.procs[pid] = proc
        if proc.key in self.ended:  # ended in an earlier test, not reaped yet
            self._gone.add(pid)

    def _reaped(self, now: float) -> None:
        """Statuses the tree's processes recorded as they reaped their children (reaped.py)."""
        if self.folder is None:
            return
        for pid, (reaper, status, wall) in read_reaped(self.folder).items():
            if pid in self._gone or pid in self.before or wall < self.wall:
                continue
            if status & 0x7F == FALLBACK_SIGNAL:
                continue
            proc = self.procs.get(pid)
            if proc is None:  # born and reaped between two polls: a child of the tree's
                if reaper != self.root and reaper not in self.procs:
                    continue
                if any(pid == ended for ended, _ in self.ended):  # ended earlier, reaped now
                    continue
                proc = Proc(
                    pid, reaper, f"a child of {reaper}, ended before it was seen", -1, False
                )
            self._gone.add(pid)
            self.deaths.append(Death(proc, status, min(now, wall - self.wall)))

    def living(self) -> list[Proc]:
        """The tree's processes alive now (``poll`` first), oldest first."""
        self.poll()
        with self._lock:
            for pid in [pid for pid in self.procs if pid not in self._gone]:
                fresh = read_proc(pid, self.procs[pid].ppid)  # a fork's exec came after its birth
                if fresh.cmdline:
                    self.procs[pid] = fresh
            return [p for pid, p in sorted(self.procs.items()) if pid not in self._gone]

    def forget(self, procs: list[Proc]) -> None:
        """Processes the plugin itself ended: their SIGKILL is no death of the test's."""
        with self._lock:
            self._gone.update(p.pid for p in procs)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(1.0)


def end_tree(procs: list[Proc], root: int) -> list[Proc]:
    """SIGKILL ``procs`` (not the tree's long-lived helpers) and reap those that are ``root``'s
    children now (adopted orphans, and the test's own ``subprocess`` children: a later
    ``Popen.wait`` then reads 0), but for multiprocessing's, which it joins itself (at exit too:
    that join no longer waits). Returns the processes killed."""
    import multiprocessing

    victims = [p for p in procs if not is_helper(p)]  # a fork server's workers are victims
    kill_all([p.pid for p in victims])
    managed = {child.pid for child in multiprocessing.active_children()}
    deadline = time.monotonic() + 2.0
    for proc in victims:
        stat = _stat(proc.pid)
        if stat is None or stat[1] != root or proc.pid in managed:
            continue
        while time.monotonic() < deadline:
            try:
                if os.waitpid(proc.pid, os.WNOHANG)[0]:
                    break
            except (ChildProcessError, OSError):
                break
            time.sleep(0.01)
    return victims


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """This process adopts its orphaned descendants while the block runs (a double fork, a
    ``setsid`` daemon stay in the tree), as it did before after."""
    libc = ctypes.CDLL(None, use_errno=True)
    was = ctypes.c_int(0)
    libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield None
    finally:
        if not was.value:
            libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
