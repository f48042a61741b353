"""The parent's side of ``in_child``'s process: start the child, wait with a bound, end its tree.

Runs in the process of the test that uses ``in_child``: the pytest process (or an xdist worker)
for an ordinary test, a rank for a distributed one. Linux only, like the rest of the plugin's
process handling. :class:`Child` is one child: forked (``os.fork``, as vLLM's fork-per-test
decorator does) or spawned (a fresh ``python -c`` that imports the test's module); either way the
parent waits on its pid (a pidfd where the kernel has them), asks it for its stack when its time
is up, and kills it with every process below it (stopped first, so none forks away while they
are listed); once it ended by itself, what it left in its process group is killed too.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from time import monotonic as _monotonic  # at import: a test's patched clock is not this one's
from time import sleep as _sleep
from typing import Any

from . import childmain
from .childmain import DUMP_SIGNAL, STACK, STDERR, STDOUT, ChildSpec, end_tree

#: How long a child gets to write its stack once asked, before it is killed anyway.
DUMP_WAIT = 2.0
#: The spawned interpreter's program: the plugin's folder first, then the child's entry.
SPAWN_CODE = (
    "import sys; sys.path.insert(0, sys.argv[2]); "
    "from pytest_distrank.api.childmain import spawned; spawned(sys.argv[1])"
)


class Child:
    """One child of a test, from its start to its end."""

    def __init__(
        self, spec: ChildSpec, fn: Callable[..., Any], args: Any, kwargs: Any, request: Any = None
    ) -> None:
        self.spec = spec
        #: Its exit code once reaped (``-N``: signal N); None while running, or when unknown.
        self.status: int | None = None
        self.reaped = False
        self.process: subprocess.Popen[bytes] | None = None
        for name in (STDOUT, STDERR, STACK):
            Path(spec.folder, name).touch()
        if spec.start == "fork":
            self.pid = _fork(spec, fn, args, kwargs, request)
        else:
            self.process = _spawn(spec)
            self.pid = self.process.pid

    def wait(self, timeout: float | None) -> bool:
        """Wait until the child exits (not reaped yet) or ``timeout`` passed: whether it exited."""
        end = None if timeout is None else _monotonic() + timeout
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            pidfd = -1
        try:
            while not self._exited():
                left = None if end is None else end - _monotonic()
                if left is not None and left <= 0:
                    return False
                if pidfd >= 0:
                    poll = select.poll()
                    poll.register(pidfd, select.POLLIN)
                    poll.poll(None if left is None else max(1, int(left * 1000)))
                else:
                    _sleep(min(0.02, left) if left is not None else 0.02)
            return True
        finally:
            if pidfd >= 0:
                os.close(pidfd)

    def stopped_by(self) -> int:
        """The signal that stopped the child (``SIGTTIN``: it read the terminal under ``-s``);
        0 when it is not stopped."""
        try:
            found = os.waitid(os.P_PID, self.pid, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return 0
        return found.si_status if found is not None and found.si_code == os.CLD_STOPPED else 0

    def dump_stack(self, stopped: bool = False) -> str:
        """Ask the child for its stack (faulthandler, every thread) and read it back; a stopped
        child is continued (its dump handler runs before it is stopped again)."""
        with contextlib.suppress(OSError):
            os.kill(self.pid, DUMP_SIGNAL)
            if stopped:
                os.kill(self.pid, signal.SIGCONT)
        path = Path(self.spec.folder, STACK)
        end, size = _monotonic() + DUMP_WAIT, -1
        while _monotonic() < end and not self._exited():
            now = path.stat().st_size
            if now and now == size:  # written, and no longer growing
                break
            size = now
            _sleep(0.05)
        return path.read_text(errors="replace")

    def end(self) -> list[str]:
        """Kill the child and every process below it, and reap it: its descendants' lines."""
        named = end_tree([self.pid], include_roots=True) if not self._exited() else []
        named += self._group_left()
        self._reap()
        return named

    def _group_left(self) -> list[str]:
        """Once the child exited (a zombie, so its pid is not reused): kill what its process
        group still holds (orphans of a child that crashed)."""
        left = [childmain.command_line(pid) for pid in sorted(_group_members(self.pid))]
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)
        return left

    def _exited(self) -> bool:
        try:
            found = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return found is not None

    def _reap(self) -> None:
        if self.reaped:
            return
        try:
            _, status = os.waitpid(self.pid, 0)
            self.status = os.waitstatus_to_exitcode(status)
            self.reaped = True
        except ChildProcessError:  # another handler reaped it: its status is unknown
            self.reaped = True
        if self.process is not None:
            self.process.returncode = -1 if self.status is None else self.status


def _fork(spec: ChildSpec, fn: Callable[..., Any], args: Any, kwargs: Any, request: Any) -> int:
    with warnings.catch_warnings():  # Python 3.12+ warns of forking with threads: asked for
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        childmain.child_main(spec, fn, args, kwargs, request)
    except BaseException:
        code = 70
        with contextlib.suppress(Exception):
            sys.stderr.write("in_child: the child's own code failed:\n")
            import traceback

            traceback.print_exc()
    finally:
        os._exit(code)


def _spawn(spec: ChildSpec) -> subprocess.Popen[bytes]:
    path = os.path.join(spec.folder, childmain.SPEC)
    with open(path, "wb") as f:
        pickle.dump(spec, f)
    package_root = str(Path(childmain.__file__).resolve().parents[2])
    out = open(os.path.join(spec.folder, STDOUT), "ab") if spec.redirect else None
    err = open(os.path.join(spec.folder, STDERR), "ab") if spec.redirect else None
    try:
        return subprocess.Popen(
            [sys.executable, "-c", SPAWN_CODE, path, package_root],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )
    finally:
        for stream in (out, err):
            if stream is not None:
                stream.close()


def _group_members(pgid: int) -> set[int]:
    """Living processes of the process group ``pgid`` (its leader left out)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == pgid:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            found.add(int(entry))
    return found
