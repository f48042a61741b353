"""A test module imported in a spawned child as pytest imports it: with its asserts rewritten;
and the test's evaluated xfail mark, for ``in_child``'s parent to match ``raises=``.

Runs in the fresh interpreter that ``in_child(start="spawn")`` starts (:mod:`api.childmain`),
where no pytest session runs, so no import hook rewrites the test module's asserts. The
rewriting is pytest's own, private: ``_pytest.assertion.rewrite.rewrite_asserts`` (what its
import hook does to a test module). If it moves, the child's asserts fail with a plain
``AssertionError`` (no intermediate values): the outcome is still right. pytest's comparison
explanations (the diff lines of a failed ``==`` of long containers) need its session's config
and are left out; the rewritten message still shows both sides and the ``where`` lines.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from pathlib import Path


def import_rewritten(name: str, path: str) -> types.ModuleType:
    """Import the module ``name`` from the file ``path``, its asserts rewritten as pytest
    rewrites a test module's, and register it in ``sys.modules`` (pickles of its classes
    resolve to it)."""
    source = Path(path).read_bytes()
    tree = ast.parse(source, filename=path)
    try:
        from _pytest.assertion.rewrite import rewrite_asserts

        rewrite_asserts(tree, source, path)
    except ImportError:
        pass
    code = compile(tree, path, "exec", dont_inherit=True)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec) if spec else types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module
    exec(code, module.__dict__)
    return module


def xfailed(item: object) -> object:
    """The test's evaluated ``xfail`` mark (pytest's private ``xfailed_key`` of the item's
    stash: ``reason``, ``raises``, ...), None when it has none or the key moved."""
    try:
        from _pytest.skipping import xfailed_key
    except ImportError:
        return None
    stash = getattr(item, "stash", None)
    return stash.get(xfailed_key, None) if stash is not None else None
