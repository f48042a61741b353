"""What a rank forked from a template collects: its pool's tests, and nothing beside them.

Runs in a fork of a rank template (template.py), once, as it becomes a fresh rank and before
its collection. A rank started afresh collects its pool's whole files (1.2 s a rank for one of
PyTorch's RPC files); a fork collects only its pool's test functions, by node id
(:func:`collection_args`). Collecting ``file.py::test_x`` still makes an item of every function
and class of the module (pytest filters by name afterwards: 13 ms of a 30-test module's fork's
CPU, a third of all it did before its test); :class:`OnlyTheirTests` refuses, in the modules and
classes on the way to the pool's tests, to make the items of the names off that way; a unittest
``TestCase`` class's other methods too (0.1 s a fork for one of PyTorch's RPC classes).
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterable, Sequence

import pytest

from ... import _compat
from ...planning.crossize import ITEM_SUFFIX


def collection_args(nodeids: Sequence[str], files: Sequence[str], rootdir: str) -> list[str]:
    """What a fork collects: its pool's test functions by node id (a rank started afresh
    collects its pool's whole files: 1.2 s a rank for one of PyTorch's RPC files), each once,
    without a parameter id: every parametrization of the function is collected, so that an id
    that differs from the controller's (a value drawn at import) is a test the rank did not
    collect, said as for a rank that collects files, not a collection error. Node ids are
    relative to the rootdir, arguments to the invocation folder: joined to the rootdir."""
    if not nodeids:
        return list(files)
    args = []
    for nodeid in nodeids:
        path, sep, names = nodeid.partition("::")
        if nodeid.endswith(ITEM_SUFFIX):  # a cross-size fixture's producer: made at collection
            sep = names = ""  # from the module's tests that request it (crossize.ProducerItems)
        args.append(os.path.join(rootdir, path + sep + names.partition("[")[0]))
    return list(dict.fromkeys(args))


def wanted_paths(nodeids: Iterable[str]) -> tuple[frozenset[str], frozenset[str]]:
    """The node ids on the way to ``nodeids``' test functions (parameter ids left out), and
    those of them whose other names are not collected: all but a module that holds a
    cross-size fixture's producer (its items are made from the module's tests)."""
    wanted: set[str] = set()
    whole: set[str] = set()
    for nodeid in nodeids:
        path, _, names = nodeid.partition("::")
        if nodeid.endswith(ITEM_SUFFIX) or not names:
            whole.add(path)
            continue
        parts = [path, *names.partition("[")[0].split("::")]
        wanted.update("::".join(parts[:end]) for end in range(1, len(parts) + 1))
    return frozenset(wanted), frozenset(w for w in wanted if w.partition("::")[0] not in whole)


class OnlyTheirTests:
    """A fork's collection makes the items of its pool's tests only (registered by the
    template, aimed by each fork at its tests): a module's or class's other functions and
    classes, and a unittest ``TestCase`` class's other methods, are left uncollected, as pytest
    would drop them by name after making them. What differs from a start: no
    ``pytest_pycollect_makeitem`` or ``pytest_generate_tests`` call for those names, no instance
    of a ``TestCase`` class made for each of its other methods."""

    def __init__(self, nodeids: Iterable[str] = ()) -> None:
        self.wanted, self.filtered = wanted_paths(nodeids)
        #: The classes being collected on the way to the tests: id -> (class, node id).
        self.classes: dict[int, tuple[type, str]] = {}

    def aim(self, nodeids: Iterable[str]) -> None:
        """Collect ``nodeids`` only (in a fork: its pool's tests; none filters nothing)."""
        self.wanted, self.filtered = wanted_paths(nodeids)

    @pytest.hookimpl(wrapper=True)
    def pytest_collection(self) -> Generator[None, object, object]:
        with _compat.unittest_names(self._keeps):
            return (yield)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collectstart(self, collector: pytest.Collector) -> None:
        if isinstance(collector, pytest.Class) and collector.nodeid in self.filtered:
            self.classes[id(collector.obj)] = (collector.obj, collector.nodeid)

    def _keeps(self, case: type, name: str) -> bool:
        known = self.classes.get(id(case))
        return known is None or known[0] is not case or f"{known[1]}::{name}" in self.wanted

    @pytest.hookimpl(tryfirst=True)
    def pytest_pycollect_makeitem(
        self, collector: pytest.Collector, name: str
    ) -> list[object] | None:
        nodeid = collector.nodeid
        if nodeid in self.filtered and f"{nodeid}::{name}" not in self.wanted:
            return []  # handled: no item (pytest stops at the first result that is not None)
        return None
