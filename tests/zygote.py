"""The suite's zygote: inner pytest sessions of the e2e tests forked from a warm process.

Runs in the outer pytest process (the client). Its server (``tests/zygote_server.py``, one per
outer process, started at the first session) imports torch, numpy and pytest once, then forks
each process a request names, and the child runs ``python -m MODULE ARGS`` as a fresh
interpreter would (``runpy``). :class:`Zygote` sends it inner sessions (:meth:`Zygote.runpytest`
returns pytester's ``RunResult``, as ``Pytester.runpytest_subprocess`` would), the processes of a
launched world together (torchrun agents, ranks started by hand: :meth:`Zygote.run`), and
sessions that run beside others or under a pseudo-terminal (:meth:`Zygote.popen`, a process as
``subprocess.Popen`` shows one). The server serves while they run. A process costs its own work,
not an ``import torch`` (~1.5 s of CPU on the 2-core machine, ~170 processes in the suite).

What a child could inherit that a fresh interpreter would not have, and how it is kept out:

- modules: the server imports only libraries that no pytest plugin package owns (torch, numpy,
  pytest itself); a plugin package imported before pytest's assertion rewriter would warn
  (``Module already imported so cannot be rewritten``). The plugin and the test's own modules are
  imported by each child, afresh;
- what a library reads from the environment when it is imported: a session whose environment
  differs from the server's in such a variable (:func:`import_sensitive`) runs in a real
  subprocess instead, but for those a child applies (``OMP_NUM_THREADS``, a count: torch's
  threads set to it; ``PYTHONBREAKPOINT``, read at each ``breakpoint()``);
- ``sys.path``, ``sys.argv``, ``__main__``, the working folder, the environment, the umask (a
  launched world's 022), stdin (an empty pipe, or the terminal), stdout and stderr (the
  session's files, or the terminal): set in the child, whose process group is the server's (as a
  subprocess's is its parent's) or, for a terminal or a session of its own, a new session's;
- interpreter exit: the child waits for its non-daemon threads and runs the ``atexit`` handlers, as
  ``Py_Finalize`` does, then ``os._exit``.

One thing differs on purpose: the server's heap is frozen (``gc.freeze()``) after its imports, so
a child's garbage collections (pytest's at its end, twice) skip torch's objects, as the plugin's
own fork server does for its ranks: ~0.1 s of CPU less a session, and pages not copied on write;
``gc.get_objects()`` leaves those objects out.

Processes a session leaves behind cannot be found by the environment tag of ``helpers.py`` (a
forked process's ``/proc/PID/environ`` is its exec's, the server's), so the server is a child
subreaper: whatever a session left running is re-parented to it, and :meth:`Zygote.descendants`
lists them for the leak check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from .zygote_server import read_lines, thread_count

#: Variables whose value a library may read when it is imported (the server imported it once,
#: with its own environment): a session that sets one differently runs in a real subprocess.
IMPORT_SENSITIVE = (
    "TORCH",
    "PYTORCH",
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "CUDA",
    "NCCL",
    "GLOO",
    "LD_",
    "MALLOC",
    "COV_CORE",
    "COVERAGE",
    "PYTHON",
)
#: ``DISTRANK_TEST_ZYGOTE=off``: every inner session a subprocess of its own (to compare, or to
#: rule the zygote out when a test behaves otherwise under it).
OFF_ENV = "DISTRANK_TEST_ZYGOTE"
#: Seconds the server has to reap a session killed at its timeout.
KILLED_WAIT = 30


def _applied(name: str, value: str | None) -> bool:
    """Whether a child's ``name=value`` works as in a fresh interpreter: ``PYTHONPATH`` (the
    child sets its ``sys.path``), ``PYTHONBREAKPOINT`` (read at each ``breakpoint()``), and
    ``OMP_NUM_THREADS`` as a positive count (``torch.set_num_threads``, what ``import torch``
    makes of it)."""
    if name == "OMP_NUM_THREADS":
        return thread_count(value) is not None
    return name in ("PYTHONPATH", "PYTHONBREAKPOINT")


def import_sensitive(server: Mapping[str, str], session: Mapping[str, str]) -> list[str]:
    """The variables read at import (:data:`IMPORT_SENSITIVE`) that ``session`` sets otherwise
    than ``server`` and a child cannot apply itself."""
    names = {*server, *session}
    return sorted(
        name
        for name in names
        if name.startswith(IMPORT_SENSITIVE)
        and server.get(name) != session.get(name)
        and not _applied(name, session.get(name))
    )


@dataclasses.dataclass(frozen=True)
class Session:
    """One process to fork: ``python -m MODULE ARGS`` in ``cwd`` with ``env`` (that
    :meth:`Zygote.accepts`); its standard output and error to ``output`` (one file twice: as
    ``2>&1``), or all three streams on ``terminal`` (a pty's slave, the controlling terminal of
    a session of its own); under ``umask`` (None: the server's, the outer process's); in a
    session of its own if ``new_session`` (``Popen(start_new_session=True)``); ``signals`` at
    their defaults and unblocked (a ``preexec_fn`` that resets them before the exec)."""

    args: Sequence[str]
    cwd: Path
    env: Mapping[str, str]
    output: tuple[Path, Path] | None = None
    module: str = "pytest"
    umask: int | None = None
    terminal: str | None = None
    new_session: bool = False
    signals: Sequence[int] = ()

    def request(self) -> dict[str, Any]:
        """What the server's child reads (``zygote_server._child``)."""
        output = self.output or (None, None)
        return {
            "module": self.module,
            "args": list(self.args),
            "cwd": str(self.cwd),
            "env": dict(self.env),
            "stdout": str(output[0]),
            "stderr": str(output[1]),
            "umask": self.umask,
            "terminal": self.terminal,
            "new_session": self.new_session,
            "signals": [int(number) for number in self.signals],
        }


class Zygote:
    """The outer process's handle on its server, started at the first session it runs."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.environment: dict[str, str] = {}
        #: CPU seconds of the sessions forked so far, their processes' included, that the outer
        #: process's ``RUSAGE_CHILDREN`` cannot see yet: the server reaped them. Once the server
        #: itself is reaped, they are in it (:meth:`_reaped`).
        self.cpu = 0.0
        #: Processes the server said ended, not yet collected: their wait status.
        self._ended: dict[int, int] = {}
        self._buffer = bytearray()

    def start(self) -> subprocess.Popen[bytes]:
        """The server, started if it is not running."""
        if self.process is None or self.process.poll() is not None:
            # Not the first session's own variables (its process tag: the server is no session's)
            self.environment = {k: v for k, v in os.environ.items() if not k.startswith("DISTRANK")}
            self.process = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("zygote_server.py"))],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=self.environment,
                start_new_session=True,  # Ctrl-C of the outer run ends it through close()
            )
        return self.process

    def accepts(self, env: Mapping[str, str]) -> list[str]:
        """Why a session with environment ``env`` cannot be forked (empty: it can)."""
        server = self.environment if self.process is not None else dict(os.environ)
        return import_sensitive(server, env)

    def begin(self, sessions: Sequence[Session]) -> list[int]:
        """Fork ``sessions`` at once (the processes of one world); their pids."""
        process = self.start()
        assert process.stdin is not None
        try:
            process.stdin.write(json.dumps([s.request() for s in sessions]).encode() + b"\n")
            process.stdin.flush()
            while not (replies := self._replies(None)):
                pass
        except BaseException:
            self.abandon()  # the next request's reply must never be this one's
            raise
        if len(replies) != 1 or "pids" not in replies[0]:
            self.abandon()
            raise RuntimeError(f"the suite's zygote ({process.pid}) said {replies} to a request")
        return [int(pid) for pid in replies[0]["pids"]]

    def wait(self, pids: Sequence[int], timeout: float | None) -> bool:
        """Whether every one of ``pids`` ended within ``timeout`` seconds (None: no bound)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        looked = False  # the replies that came were read once at least
        try:
            while not all(pid in self._ended for pid in pids):
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if left == 0 and looked:
                    return False
                looked = True
                if replies := self._replies(left):
                    raise RuntimeError(f"the suite's zygote said {replies} to no request")
        except BaseException:  # interrupted (pytest-timeout, Ctrl-C), or the server is gone
            self.abandon()
            raise
        return True

    def collect(self, pids: Sequence[int]) -> list[int]:
        """The exit codes of ``pids``, which ended (:meth:`wait`), as ``Popen.returncode``."""
        return [os.waitstatus_to_exitcode(self._ended.pop(pid)) for pid in pids]

    def run(
        self, sessions: Sequence[Session], timeout: float | None
    ) -> tuple[list[int] | None, list[int]]:
        """Run ``sessions`` at once: ``(their exit codes, or None after a timeout; their pids)``.
        Past ``timeout``, every process below the server is killed."""
        pids = self.begin(sessions)
        timed_out = not self.wait(pids, timeout)
        if timed_out:
            for each in [*pids, *self.descendants()]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(each, signal.SIGKILL)
            if not self.wait(pids, KILLED_WAIT):
                self.abandon()
                raise RuntimeError(f"the suite's zygote did not reap {pids}")
        codes = self.collect(pids)
        return (None if timed_out else codes), pids

    def popen(self, session: Session) -> Forked:
        """Fork ``session`` and return at once: the process, as ``subprocess.Popen`` shows one."""
        return Forked(self, self.begin([session])[0])

    def _replies(self, timeout: float | None) -> list[dict[str, Any]]:
        """The server's replies to requests that came within ``timeout`` seconds; the ends it
        reported are kept (``_ended``)."""
        assert self.process is not None and self.process.stdout is not None
        lines = read_lines(self.process.stdout.fileno(), self._buffer, timeout)
        if lines is None:
            raise RuntimeError(f"the suite's zygote ({self.process.pid}) died during a session")
        replies = []
        for line in lines:
            reply = json.loads(line)
            if "ended" in reply:
                self._ended[int(reply["ended"])] = int(reply["status"])
                self.cpu += float(reply["cpu"])
            else:
                replies.append(reply)
        return replies

    def abandon(self) -> None:
        """Kill the server and every process below it; the next session starts a new one."""
        if self.process is None:
            return
        for each in [*self.descendants(), self.process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGKILL)
        with self.process:
            self.process.wait()
        self._reaped()

    def descendants(self) -> list[int]:
        """Live processes below the server (what sessions left running), zombies excepted."""
        if self.process is None or self.process.poll() is not None:
            return []
        parents: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
        found: list[int] = []
        for pid in parents:
            ancestor = parents.get(pid)
            while ancestor is not None and ancestor > 1:
                if ancestor == self.process.pid:
                    found.append(pid)
                    break
                ancestor = parents.get(ancestor)
        return found

    def runpytest(
        self, pytester: pytest.Pytester, *args: str, timeout: float | None = None
    ) -> pytest.RunResult:
        """``pytester.runpytest_subprocess(*args, timeout=timeout)``, forked from the server
        where the session's environment allows it (:meth:`accepts`)."""
        __tracebackhide__ = True
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
        if self.accepts(env) or os.environ.get(OFF_ENV) == "off":
            return pytester.runpytest_subprocess(*args, timeout=timeout)
        basetemp = tempfile.mkdtemp(prefix="runpytest-", dir=pytester.path)
        args = (f"--basetemp={basetemp}", *args)
        for plugin in pytester.plugins:
            if not isinstance(plugin, str):
                raise ValueError(f"a plugin for a forked session is named, not an object: {plugin}")
            args = ("-p", plugin, *args)
        output = (pytester.path / "stdout", pytester.path / "stderr")
        print("running (forked from the suite's zygote): pytest", *args)
        print("     in:", Path.cwd())
        started = time.monotonic()
        codes, pids = self.run([Session(args, Path.cwd(), env, output)], timeout)
        if codes is None:
            raise pytester.TimeoutExpired(
                f"{timeout} second timeout expired running pytest {args} (pid {pids[0]})"
            )
        out, err = (path.read_text(errors="replace").splitlines() for path in output)
        for lines, stream in ((out, sys.stdout), (err, sys.stderr)):
            for line in lines:
                print(line, file=stream)
        ret: int | pytest.ExitCode = codes[0]
        with contextlib.suppress(ValueError):
            ret = pytest.ExitCode(codes[0])
        return pytest.RunResult(ret, out, err, time.monotonic() - started)

    def close(self) -> None:
        """End the server (its stdin closed) and wait for it."""
        if self.process is None:
            return
        with self.process:  # its pipes closed: the server's loop ends
            try:
                self.process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reaped()

    def _reaped(self) -> None:
        self.process = None
        self.cpu = 0.0  # now in RUSAGE_CHILDREN, with the server's own
        self._ended.clear()
        self._buffer.clear()


class Forked:
    """A process forked from the server (:meth:`Zygote.popen`), as ``subprocess.Popen`` shows
    one: ``pid``, ``send_signal()``, ``kill()``, ``poll()``, ``wait(timeout)``
    (``subprocess.TimeoutExpired`` past it) and ``returncode``."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def poll(self) -> int | None:
        return self.wait(0) if self.zygote.wait([self.pid], 0) else self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self.zygote.wait([self.pid], timeout):
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            self.returncode = self.zygote.collect([self.pid])[0]
        return self.returncode


#: This process's server (the ``zygote`` fixture of ``conftest.py`` ends it).
ZYGOTE = Zygote()
