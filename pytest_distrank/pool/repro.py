"""The command that reruns one distributed test, as the "rerun just this test" section shows it.

Runs in the controller (pool mode). The command names the folder to run from, the session seed
(every rank then draws the same numbers again) and the environment variables the test's file
reads that this session has set: PyTorch's ``test_distributed_spawn.py`` stops at import without
``BACKEND``, ``WORLD_SIZE`` and ``TEMP_DIR``. The file's variables are found in its text, once per
file (``os.environ["X"]``, ``os.environ.get("X")``, ``os.getenv("X")``, ``"X" in os.environ``).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping

#: How a file reads an environment variable, by name in capitals.
_READS = re.compile(
    r"""environ\s*\[\s*["']([A-Z_][A-Z0-9_]*)["']\s*\]"""
    r"""|environ\.get\(\s*["']([A-Z_][A-Z0-9_]*)["']"""
    r"""|getenv\(\s*["']([A-Z_][A-Z0-9_]*)["']"""
    r"""|["']([A-Z_][A-Z0-9_]*)["']\s+(?:not\s+)?in\s+os\.environ"""
)
#: What the plugin or pytest sets: never part of the command.
_OWN = ("DISTRANK_", "PYTEST_", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def variables_read(source: str) -> tuple[str, ...]:
    """The environment variables ``source`` reads, in order of first mention."""
    names: dict[str, None] = {}
    for match in _READS.finditer(source):
        name = next(group for group in match.groups() if group)
        if not name.startswith(_OWN) and name not in _OWN:
            names[name] = None
    return tuple(names)


class Repro:
    """Builds the rerun command of each test; a file's variables are read once."""

    def __init__(self, rootpath: str) -> None:
        self.rootpath = rootpath
        self.by_file: dict[str, tuple[str, ...]] = {}

    def command(
        self, path: str, nodeid: str, seed: int | None, environ: Mapping[str, str] = os.environ
    ) -> str:
        names = self.by_file.get(path)
        if names is None:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    names = variables_read(f.read())
            except OSError:
                names = ()
            self.by_file[path] = names
        env = "".join(f"{n}={shlex.quote(environ[n])} " for n in names if n in environ)
        seeded = f"--distrank-seed={seed} " if seed is not None else ""
        return (
            f"cd {shlex.quote(self.rootpath)} && {env}pytest -p distrank {seeded}"
            f"{shlex.quote(nodeid)}"
        )
