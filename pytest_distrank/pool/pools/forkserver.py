"""Where the fork server's socket lies, and the fork server's end with the session.

Runs in the controller (pool mode), for :class:`~poolset.PoolSet`, which starts the server.

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

import os
import shutil
import tempfile
from pathlib import Path

from ... import _compat

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
