"""Unit: the shared cache of rewritten modules (``_compat.pytest_internals.
share_rewritten_modules``) under ``PYTHONDONTWRITEBYTECODE``: a module pytest already cached
(a run that wrote bytecode left it, e.g. an installed plugin's) is read from pytest's own cache;
only the others go to the session's folder, which nothing outside it is written to."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pytest_distrank._compat.pytest_internals import share_rewritten_modules

#: The module the shim wraps (pytest imported it at its start; only ``_compat`` imports pytest's
#: internals).
rewrite = sys.modules["_pytest.assertion.rewrite"]


def test_pytests_own_cached_rewrite_is_read_where_bytecode_is_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    undo = share_rewritten_modules(str(tmp_path / "kept"))
    assert undo is not None
    try:
        monkeypatch.setattr(sys, "dont_write_bytecode", True)
        monkeypatch.setattr(sys, "pycache_prefix", None)
        source = tmp_path / "site" / "plugin_module.py"
        source.parent.mkdir()
        source.write_text("x = 1\n")
        # nothing cached: the session's folder (the source's folders under it)
        kept = Path(rewrite.get_cache_dir(source))
        assert kept.is_relative_to(tmp_path / "kept")
        # pytest's own rewritten module beside it: read from there
        own = source.parent / "__pycache__"
        own.mkdir()
        (own / ("plugin_module" + rewrite.PYC_TAIL)).write_bytes(b"")
        assert Path(rewrite.get_cache_dir(source)) == own
    finally:
        undo()
