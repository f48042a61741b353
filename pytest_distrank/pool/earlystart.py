"""The fork server's start while pytest collects, and the test modules it shares with ranks.

Runs in the controller (pool mode), as a plugin the :class:`~controller.Controller` registers.
The fork server imports torch (~1.5 s of CPU): started when the first test file that mentions
``world_size`` is about to be imported, that import runs beside collection instead of after it.
Without bytecode writing, the test modules pytest rewrites here are kept for the ranks, which
would otherwise rewrite each again (:func:`_compat.share_rewritten_modules`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from .. import _compat
from ..parsing import FORKSERVERS
from ..settings import Settings
from .pools.poolset import PoolSet
from .pools.preloads import file_preloads


class EarlyStart:
    """Starts the session's fork server early (a pytest plugin of the controller)."""

    def __init__(
        self, config: pytest.Config, pools: PoolSet, settings: Settings, nested: bool
    ) -> None:
        self.config, self.pools, self.settings, self.nested = config, pools, settings, nested
        #: Undoes _share_rewrites at the session's end.
        self._undo_rewrites: Callable[[], None] | None = None

    def start(self) -> None:
        """Start the fork server now: its import of torch (~1.5 s of CPU) then runs beside the
        controller's own work (collection, which typically imports torch too) instead of after.
        """
        if self.pools.server.started or self.settings.start_method.value not in FORKSERVERS:
            return
        if self.config.option.collectonly or self.nested:
            return  # nested: a test's in-process session may start no rank at all
        with self.pools.capture_suspended():
            self.pools.start_fork_server()  # never raises: a pool start reports a failure

    @pytest.hookimpl(tryfirst=True)
    def pytest_collect_file(self, file_path: Path) -> None:
        """A test file that mentions ``world_size`` is about to be imported: start the server
        (the first), and add the torch modules it imports to the server's preloads (each).

        A cheap look at the text, before the import; a false positive costs only an idle
        process, or an import in it.
        """
        if file_path.suffix != ".py":
            return
        try:
            text = file_path.read_bytes()
        except OSError:
            return
        if b"world_size" in text:
            self.pools.server.file_preloads.extend(file_preloads(text))
            if not self.pools.server.started:
                self._share_rewrites()
                self.start()

    def _share_rewrites(self) -> None:
        """Without bytecode writing, keep the test modules pytest rewrites here for the ranks,
        which would rewrite each again (_compat.share_rewritten_modules)."""
        if not sys.dont_write_bytecode or self._undo_rewrites is not None:
            return
        # In pytest's basetemp, not the session's folder: that is made at the first pool start,
        # which reports a failure to make it; the rewritten modules' folder is made when the
        # first one is written, and is not needed (ranks rewrite for themselves) if it cannot be.
        try:
            base = _compat.getbasetemp(self.config)
        except OSError:
            return
        if base is None:
            return
        folder = base / "distrank-rewritten"
        self._undo_rewrites = _compat.share_rewritten_modules(str(folder))
        if self._undo_rewrites is not None:
            self.pools.rewritten = str(folder)

    def undo(self) -> None:
        """The session's end: pytest rewrites its modules as before."""
        if self._undo_rewrites is not None:
            self._undo_rewrites()
            self._undo_rewrites = None
