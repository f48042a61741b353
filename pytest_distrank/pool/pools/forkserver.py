"""The session's fork server: its start (early, beside collection), readiness, socket and end.

Runs in the controller (pool mode), for :class:`~poolset.PoolSet`. :class:`ForkServer` starts
multiprocessing's fork server with what it preloads (preloads.py), waits once for it to fork
(its imports done) within the pool start's bound, and remembers a failure for later pools.

multiprocessing binds the fork server's socket in its per-process temp folder (the ``tempdir``
setting, :func:`_compat.mp_process_config`; by default a ``pymp-*`` folder that it makes in
TMPDIR and removes when the process exits cleanly). A controller killed with SIGKILL removes
nothing, so :func:`use_socket_folder` puts that folder inside the session's private folder (in
pytest's basetemp, whose old folders pytest itself deletes): nothing is left in TMPDIR. When
that path is too long for ``AF_UNIX``, a short folder under /tmp is used instead, removed at
exit (left behind only by SIGKILL).

:func:`stop` ends the server with the session. Left alone it would see its "alive" pipe close
only when pytest's process exits, then spend ~0.5-1 s in interpreter shutdown (it imported
torch): it outlived pytest by that much.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ... import _compat
from ...envvars import START_TIMEOUT_ENV
from ...options import PRELOAD as PRELOAD_OPTION
from ...parsing import FORKSERVERS
from ...settings import Settings, Value
from . import earlyfork
from .pool import PoolStartError
from .preloads import PRELOAD, plugin_modules

#: The longest ``AF_UNIX`` socket path on Linux, in bytes (``sun_path`` is 108 with its NUL), and
#: the name multiprocessing gives the fork server's socket in its folder.
UNIX_PATH_MAX, LISTENER_NAME = 107, "/listener-xxxxxxxx"
#: The folder's name in the session's folder.
FOLDER_NAME = "pymp"
#: The short folder made under /tmp, when one was (made once per process, not per pool start).
_short = [""]


def use_socket_folder(workdir: Path) -> None:
    """multiprocessing's temp folder, for this process from now on: ``workdir/pymp``, or a short
    one under /tmp when that is too long for a socket path (see the module)."""
    from multiprocessing import util

    config = _compat.mp_process_config()
    current = config.get("tempdir")
    if current and os.path.isdir(current) and current in (str(workdir / FOLDER_NAME), _short[0]):
        return  # this session's already (every pool start asks)
    folder = workdir / FOLDER_NAME
    if len(os.fsencode(str(folder) + LISTENER_NAME)) <= UNIX_PATH_MAX:
        folder.mkdir(mode=0o700, exist_ok=True)
        config["tempdir"] = str(folder)
        return
    short = tempfile.mkdtemp(prefix="distrank-mp-", dir="/tmp")
    util.Finalize(None, shutil.rmtree, args=(short, True), exitpriority=-100)
    config["tempdir"] = _short[0] = short


def stop() -> None:
    """Kill the fork server and reap it now (its ranks are gone): pytest's exit leaves none.
    Without one running, nothing happens."""
    _compat.kill_fork_server()
    _compat.stop_fork_server()  # reaps it (a SIGKILLed process: at once), unlinks its socket


class SessionStartError(PoolStartError):
    """What a pool start needs from the session failed: a folder, the fork server.

    Its message stands alone (it is not about the pool's ranks), and the controller does not keep
    it per pool key: a folder is tried again by the next test, and the fork server keeps its own
    failure here.
    """


class ForkServer:
    """The fork server of the session's pools."""

    def __init__(
        self,
        config: pytest.Config,
        settings: Settings,
        workdir: Callable[[], Path],
        start_timeout: Value[float] | None,
    ) -> None:
        self.config = config
        self.settings = settings
        self._workdir = workdir
        self.start_timeout = start_timeout
        #: The multiprocessing context ranks start from (None: not started).
        self.context: Any = None
        #: The fork server seen forking (a pid), or why it could not start (later pools fail).
        self.ready_pid = 0
        self.failed: str | None = None
        #: Modules of torch's distributed stack the test files import (preloads.py), in the
        #: order collection met them (earlystart.py adds each file's).
        self.file_preloads: list[str] = []
        #: What the server imports before it forks (set with the context; an early server
        #: gets the test files met after its start at the first pool start: :meth:`_finish`).
        self._preload: list[str] = []

    @property
    def started(self) -> bool:
        return self.context is not None

    def start(self) -> str | None:
        """Start the fork server now, not waiting for its imports (they run beside collection).
        Never raises: the first pool start tries again and reports a failure; returns why the
        session's folder could not be made, for the first pool start to report."""
        if self.settings.start_method.value in FORKSERVERS and self.failed is None:
            try:
                self._ensure()
            except SessionStartError as exc:  # the session's folder: the first pool says so
                return str(exc)
            except Exception:
                pass
        return None

    def _finish(self) -> None:
        """An early server imports, before it forks, the modules of the test files collected
        after its start too, so that no rank imports them for itself (each rank of each pool:
        ~1.5 s of CPU for ``torch.distributed.fsdp``). multiprocessing's own server (late) has
        only those known when it started."""
        extra = [m for m in dict.fromkeys(self.file_preloads) if m not in self._preload]
        if earlyfork.finish([*extra, PRELOAD[-1]]):
            self._preload[-1:-1] = extra  # the heap freeze stays last

    def stop(self) -> None:
        """End the fork server with the session (:func:`stop`); never raises."""
        earlyfork.finish([])  # adopted, never used: it serves, sees the session gone, exits
        earlyfork.discard()  # forked at pytest's start and never used
        if self.context is not None and self.settings.start_method.value in FORKSERVERS:
            with contextlib.suppress(Exception):
                stop()

    def forget(self) -> None:
        """The session's folder vanished, and the server's socket with it: the next pool start
        starts a new server in the new folder."""
        self.stop()
        self.ready_pid = 0

    def _ensure(self) -> int:
        """Start the fork server unless it runs; its pid. Returns at once (the server imports
        PRELOAD and the ``--distrank-preload`` modules before it forks); raises OSError, or
        SessionStartError when the session's folder (its socket's) cannot be made."""
        from multiprocessing import forkserver

        if self.context is None:
            self.context = multiprocessing.get_context("forkserver")
            wanted = [
                *plugin_modules(self.config),
                *self.file_preloads,
                *self.settings.preload.value,
            ]
            extra = [m for m in dict.fromkeys(wanted) if m not in PRELOAD]
            # preload (the heap freeze) stays last.
            self._preload = [*PRELOAD[:-1], *extra, PRELOAD[-1]]
        # Each time: the context is the process's, and a session nested in a test of this one
        # (pytest.main) set its own list, which a server started after it would import.
        self.context.set_forkserver_preload(self._preload)
        use_socket_folder(self._workdir())  # not in TMPDIR: see forkserver.py
        # The server forked at pytest's start, if there is one: all but the heap freeze now
        # (beside collection), the rest at the first pool start (_finish).
        earlyfork.adopt(self._preload[:-1])
        forkserver.ensure_running()
        return _compat.forkserver_pid()

    def context_for(self, timeout: float) -> tuple[Any, int]:
        """The multiprocessing context ranks start from, and the pid that will be their parent.

        Under forkserver the server must be ready, i.e. done with its imports, within
        ``timeout`` seconds (0: no bound); else :class:`SessionStartError`. Ranks check their
        parent's pid after setting PDEATHSIG.
        """
        if self.settings.start_method.value not in FORKSERVERS:
            if self.context is None:
                self.context = multiprocessing.get_context("spawn")
            return self.context, os.getpid()
        if self.failed is not None:
            raise SessionStartError(f"{self.failed}\n(from an earlier start; not retried)")
        try:
            pid = self._ensure()
        except OSError as exc:
            folder = _compat.mp_process_config().get("tempdir")
            raise SessionStartError(
                f"pytest-distrank could not start the fork server that ranks come from: {exc}\n"
                f"Its socket goes in multiprocessing's temp folder ({folder or 'not made'}, in "
                f"TMPDIR or /tmp). Point TMPDIR at a writable folder with free space, or start "
                "ranks with --distrank-start-method=spawn."
            ) from None
        if pid != self.ready_pid:
            self._finish()
            self._wait_until_forking(timeout)
            self.ready_pid = pid
        return self.context, pid

    def _wait_until_forking(self, timeout: float) -> None:
        """Fork a probe (it returns at once) from a thread and wait for it: the server forks
        only after its imports. Past ``timeout``, or if the probe fails, the server is killed
        and every later pool start fails at once with the reason."""
        context = self.context
        failure: list[BaseException] = []

        def probe() -> None:
            try:
                process = context.Process(target=os.getpid, name="distrank-fork-server-probe")
                process.start()
                process.join()
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=probe, name="distrank-fork-server-probe", daemon=True)
        thread.start()
        try:
            thread.join(min(timeout, threading.TIMEOUT_MAX) if timeout > 0 else None)
        except BaseException:
            _kill_fork_server(thread)  # Ctrl-C: a server stuck in an import never exits
            raise
        timed_out = thread.is_alive()
        if not timed_out and not failure:
            return
        _kill_fork_server(thread)
        self.failed = self._problem(timeout, [] if timed_out else failure)
        raise SessionStartError(self.failed)

    def _problem(self, timeout: float, failure: list[BaseException]) -> str:
        preload = self.settings.preload
        if failure:
            head = (
                f"the fork server died before it forked a rank ({failure[0]!r}); its traceback, "
                "if it printed one, is in the output above."
            )
            cause = "One of them fails at import with an error other than ImportError"
        else:
            limit = self.start_timeout
            source = f"from {limit.source}" if limit else f"{START_TIMEOUT_ENV} sets it"
            head = (
                "the fork server did not finish importing its preload modules within "
                f"{timeout:g} s (the pool start limit, {source}), so no rank could start; "
                "it was killed."
            )
            cause = "One of them hangs at import, or this machine is very slow"
        return (
            f"pytest-distrank: {head}\nIt imports torch, pytest and pytest's plugins, then the "
            f"modules of {PRELOAD_OPTION.flag}: {', '.join(preload.value) or 'none'}, from "
            f'{preload.source}.\n{cause}: try each in a plain `python -c "import NAME"` '
            f"and drop the culprit from {PRELOAD_OPTION.flag}."
        )


def _kill_fork_server(probe: threading.Thread) -> None:
    """Kill a fork server that never got ready, and forget it (its socket, its pipe, its pid)."""
    _compat.kill_fork_server()
    probe.join(5)  # the probe's read of its pid ends
    if not probe.is_alive():
        _compat.stop_fork_server()
