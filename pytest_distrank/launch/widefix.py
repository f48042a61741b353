"""Launcher mode: sub-worlds refused where a wider-scoped fixture uses the process group.

Runs in rank 0 of a launched world, while it makes the plan (:func:`plan.exchange`).

A session-, package-, module- or class-scoped fixture of the user that requests a rank fixture
(``pg``, ``rank``, ``dist_store``...) is set up in the group of the test that first needs it,
and its teardown may run a collective (``dist.barrier()``) in it. A rank tears such a fixture
down at its last test with peers, or when its group is replaced: with sub-worlds the ranks that
set it up reach those points at different tests, and a collective in the teardown waits for
ranks that are in another test (a deadlock). Until fixtures can be torn down together on every
member, a test of world size k < W that could meet such a fixture does not run on a sub-world:
every one, when the fixture is session- or package-scoped; those of the fixture's module, when
it is module- or class-scoped. It is skipped with why (pool mode runs it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from .. import _compat
from .. import fixtures as fixtures_module
from ..fixtures import rank_fixtures_used

#: Scopes whose fixtures outlive a test; the first two outlive a module.
WIDE = ("session", "package", "module", "class")
SESSION_WIDE = ("session", "package")


def wide_group_fixtures(item: pytest.Item) -> dict[str, str]:
    """The user's fixtures of a wide scope in ``item``'s closure that request, directly or
    through other fixtures, one of the plugin's rank fixtures: name -> scope."""
    info = _compat.fixture_info(item)
    own = set(rank_fixtures_used(item))
    if info is None or not own:
        return {}
    defs: Mapping[str, Sequence[object]] = info.name2fixturedefs

    def reaches(name: str, seen: set[str]) -> bool:
        if name in own:
            return True
        seen.add(name)
        got = defs.get(name)
        argnames = getattr(got[-1], "argnames", ()) if got else ()
        return any(arg not in seen and reaches(arg, seen) for arg in argnames)

    found: dict[str, str] = {}
    for name, got in defs.items():
        if not got:
            continue
        fixturedef = got[-1]
        scope = str(getattr(fixturedef, "scope", "function"))
        func = getattr(fixturedef, "func", None)
        if getattr(func, "__module__", None) == fixtures_module.__name__ or scope not in WIDE:
            continue
        if reaches(name, set()):
            found[name] = scope
    return found


def refusals(
    sizes: Sequence[int | None], wide: Sequence[Mapping[str, str]], modules: Sequence[str], ws: int
) -> dict[int, str]:
    """Why each sub-world test that could meet a wide fixture on the group does not run, by
    index (see the module docstring). ``sizes[i]``: test ``i``'s world size when it runs on a
    sub-world, else None; ``wide[i]``: its :func:`wide_group_fixtures`; ``modules[i]``: its
    module."""
    whole = sorted({name for got in wide for name, scope in got.items() if scope in SESSION_WIDE})
    by_module: dict[str, set[str]] = {}
    for got, module in zip(wide, modules, strict=True):
        local = {name for name, scope in got.items() if scope not in SESSION_WIDE}
        by_module.setdefault(module, set()).update(local)
    out: dict[int, str] = {}
    for i, size in enumerate(sizes):
        names = whole or sorted(by_module.get(modules[i], ()))
        if size is None or not names:
            continue
        where = "this run" if whole else modules[i]
        out[i] = (
            f"fixture {', '.join(names)} (wider than a test, used in {where}) requests the "
            "process group or a rank fixture: its teardown may run a collective on the ranks "
            "that set it up, which sub-worlds reach at different tests (a deadlock); a test of "
            f"world size {size} in a launched world of {ws} runs on a sub-world, so it does not "
            "run here: run it in pool mode (pytest without a launcher), or give the fixture "
            "function scope"
        )
    return out
