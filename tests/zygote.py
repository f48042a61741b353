"""A warm process that inner pytest sessions of the e2e tests are forked from (the suite's zygote).

Two sides live here. The *server* runs in its own process (``python tests/zygote.py``, started by
the outer pytest process, one per xdist worker): it imports torch, numpy and pytest once, then
forks one child per inner session, and the child runs ``python -m pytest ARGS`` as a fresh
interpreter would (``runpy``), in the session's folder, environment, ``sys.path`` and standard
streams. The *client* (:class:`Zygote`, in the outer pytest process) sends it one session at a
time and returns pytester's ``RunResult``, as ``Pytester.runpytest_subprocess`` would. A session
costs its own work, not an ``import torch`` (~2 s of CPU on the 2-core machine, ~130 sessions).

What a child could inherit that a fresh interpreter would not have, and how it is kept out:

- modules: the server imports only libraries that no pytest plugin package owns (torch, numpy,
  pytest itself); a plugin package imported before pytest's assertion rewriter would warn
  (``Module already imported so cannot be rewritten``). The plugin and the test's own modules are
  imported by each child, afresh;
- what a library reads from the environment when it is imported: a session whose environment
  differs from the server's in such a variable (:func:`import_sensitive`) runs in a real
  subprocess instead;
- ``sys.path``, ``sys.argv``, ``__main__``, the working folder, the environment, stdin (an empty
  pipe), stdout and stderr (the session's files): set in the child (whose process group is the
  server's, as a subprocess's is its parent's);
- interpreter exit: the child waits for its non-daemon threads and runs the ``atexit`` handlers, as
  ``Py_Finalize`` does, then ``os._exit``.

Processes a session leaves behind cannot be found by the environment tag of ``helpers.py`` (a
forked process's ``/proc/PID/environ`` is its exec's, the server's), so the server is a child
subreaper: whatever a session left running is re-parented to it, and :meth:`Zygote.descendants`
lists them for the leak check.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

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
#: ``PYTHON*`` variables a child applies itself.
APPLIED = ("PYTHONPATH",)
#: ``DISTRANK_TEST_ZYGOTE=off``: every inner session a subprocess of its own (to compare, or to
#: rule the zygote out when a test behaves otherwise under it).
OFF_ENV = "DISTRANK_TEST_ZYGOTE"
#: ``prctl(PR_SET_CHILD_SUBREAPER, 1)``.
PR_SET_CHILD_SUBREAPER = 36
#: Seconds the server has to reap a session killed at its timeout.
KILLED_WAIT = 30
#: The server's exit code when a child could not be set up (before pytest ran).
SETUP_FAILED = 70


def import_sensitive(server: Mapping[str, str], session: Mapping[str, str]) -> list[str]:
    """The variables read at import (:data:`IMPORT_SENSITIVE`) that ``session`` sets otherwise
    than ``server``."""
    names = {*server, *session}
    return sorted(
        name
        for name in names
        if name.startswith(IMPORT_SENSITIVE)
        and name not in APPLIED
        and server.get(name) != session.get(name)
    )


# --------------------------------------------------------------------------------- the server


def _session_path(cwd: str, pythonpath: str, base: Sequence[str]) -> list[str]:
    """``sys.path`` of ``python -m pytest`` started in ``cwd`` with ``PYTHONPATH=pythonpath``."""
    entries = [*(os.path.abspath(p) for p in pythonpath.split(os.pathsep) if p), *base]
    return [cwd, *dict.fromkeys(entries)]  # site removes duplicates before the script's folder


def _exit_like_python(code: object) -> int:
    """Finish as ``Py_Finalize`` would after ``SystemExit(code)``; the exit status."""
    import atexit
    import threading

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads, as at exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            status = status or 120
    return status


def _child(request: dict[str, Any], base: Sequence[str]) -> None:
    """In the forked child: become ``python -m MODULE ARGS`` (pytest, or a launcher such as
    ``torch.distributed.run``) in the session's setting; never returns."""
    status = SETUP_FAILED
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        empty, writer = os.pipe()
        os.close(writer)
        os.dup2(empty, 0)
        os.close(empty)
        for fd, name in ((1, "stdout"), (2, "stderr")):
            if fd == 2 and request["stderr"] == request["stdout"]:
                os.dup2(1, 2)  # one file, one offset: as 2>&1
                continue
            target = os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        os.closerange(3, 1024)
        sys.path[:] = _session_path(request["cwd"], request["env"].get("PYTHONPATH", ""), base)
        module = request.get("module", "pytest")
        sys.argv = [module, *request["args"]]
        import runpy

        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code: object = 0
        except SystemExit as stop:
            code = stop.code
        except Exception:  # uncaught (torchrun's ChildFailedError): as the interpreter does
            import traceback

            traceback.print_exc()
            code = 1
        status = _exit_like_python(code)
    except BaseException:
        import traceback

        traceback.print_exc()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    os._exit(status)


def _reap(session: int | None = None) -> tuple[int, float] | None:
    """Reap whatever ended below the server (orphans re-parented to it, and the session's own
    process ``session``); once the session has ended, its wait status and the CPU seconds (user
    + system) of it and of every process it waited for."""
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if pid == 0:
            return None
        if pid == session:
            return status, usage.ru_utime + usage.ru_stime


def serve() -> None:
    """The server's loop: one JSON request per line on stdin, replies on stdout."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    import numpy  # noqa: F401
    import torch
    import torch.distributed
    import torch.multiprocessing  # noqa: F401

    # What sys.path is beyond the script's folder and PYTHONPATH: the interpreter's own.
    own = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in sys.path[1:] if p not in own]
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    while True:
        while not select.select([requests], [], [], 0.2)[0]:
            _reap()
        line = requests.readline()
        if not line:
            return
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, base)
        replies.write(json.dumps({"pid": pid}).encode() + b"\n")
        replies.flush()
        while (ended := _reap(pid)) is None:
            time.sleep(0.02)
        status, cpu = ended
        replies.write(json.dumps({"pid": pid, "status": status, "cpu": cpu}).encode() + b"\n")
        replies.flush()


# --------------------------------------------------------------------------------- the client


class Zygote:
    """The outer process's handle on its server, started at the first session it runs."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.environment: dict[str, str] = {}
        #: CPU seconds of the sessions forked so far, their processes' included, that the outer
        #: process's ``RUSAGE_CHILDREN`` cannot see yet: the server reaped them. Once the server
        #: itself is reaped, they are in it (:meth:`_reaped`).
        self.cpu = 0.0

    def _start(self) -> subprocess.Popen[bytes]:
        if self.process is None or self.process.poll() is not None:
            # Not the first session's own variables (its process tag: the server is no session's)
            self.environment = {k: v for k, v in os.environ.items() if not k.startswith("DISTRANK")}
            self.process = subprocess.Popen(
                [sys.executable, str(Path(__file__))],
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

    def run(
        self,
        args: Sequence[str],
        cwd: Path,
        env: Mapping[str, str],
        output: tuple[Path, Path],
        timeout: float | None,
        module: str = "pytest",
    ) -> tuple[int | None, int]:
        """Run one session (``python -m MODULE ARGS``): ``(exit status or None after a timeout,
        pid)``. A session past ``timeout`` is killed with every process below the server."""
        process = self._start()
        assert process.stdin is not None and process.stdout is not None
        request = {
            "module": module,
            "args": list(args),
            "cwd": str(cwd),
            "env": dict(env),
            "stdout": str(output[0]),
            "stderr": str(output[1]),
        }
        try:
            process.stdin.write(json.dumps(request).encode() + b"\n")
            process.stdin.flush()
            pid = int(json.loads(process.stdout.readline())["pid"])
            timed_out = not self._wait(process, timeout)
            if timed_out:
                for each in [pid, *self.descendants()]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(each, signal.SIGKILL)
                if not self._wait(process, KILLED_WAIT):
                    raise RuntimeError(f"the suite's zygote (pid {process.pid}) did not reap {pid}")
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"the suite's zygote (pid {process.pid}) died during a session")
            reply = json.loads(line)
            if reply.get("pid") != pid:
                raise RuntimeError(f"the suite's zygote (pid {process.pid}) said {reply} for {pid}")
        except BaseException:
            # Interrupted (pytest-timeout, Ctrl-C) or confused between a request and its reply:
            # the next session's reply must never be this one's, so this server goes.
            self.abandon()
            raise
        status = int(reply["status"])
        self.cpu += float(reply.get("cpu", 0.0))
        return (None if timed_out else os.waitstatus_to_exitcode(status)), pid

    @staticmethod
    def _wait(process: subprocess.Popen[bytes], timeout: float | None) -> bool:
        """Whether the server's reply is ready within ``timeout`` seconds (None: no bound)."""
        assert process.stdout is not None
        return bool(select.select([process.stdout], [], [], timeout)[0])

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
        status, pid = self.run(args, Path.cwd(), env, output, timeout)
        if status is None:
            raise pytester.TimeoutExpired(
                f"{timeout} second timeout expired running pytest {args} (pid {pid})"
            )
        out, err = (path.read_text(errors="replace").splitlines() for path in output)
        for lines, stream in ((out, sys.stdout), (err, sys.stderr)):
            for line in lines:
                print(line, file=stream)
        ret: int | pytest.ExitCode = status
        with contextlib.suppress(ValueError):
            ret = pytest.ExitCode(status)
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


#: This process's server (the ``zygote`` fixture of ``conftest.py`` ends it).
ZYGOTE = Zygote()

if __name__ == "__main__":
    serve()
