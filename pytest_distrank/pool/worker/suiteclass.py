"""Inside a pool rank: a harness class's state as the harness's processes would see it.

Runs in pool-mode rank processes only (used by :mod:`suiterank`). Under PyTorch's harness,
``setUpClass`` runs in the parent process; the test runs in a child that sees the class state
only if it was forked from that parent (``_fork_processes``, ``_start_processes`` with a fork
context). A spawned child (``_spawn_processes``, every ``MultiProcContinuousTest`` worker)
imports the test module afresh: it sees the class as imported. A rank plays both parts in one
process, so it swaps the class's attributes around the child's part (:func:`child_view`): the
child's view in, the parent's back afterwards, as the child's exit would leave it.
"""

from __future__ import annotations

import contextlib
import unittest
from collections.abc import Iterator


class ClassState:
    """The attributes a test class and its bases hold at one moment, to put back later.

    Only the class's own chain is kept (``object`` and ``unittest.TestCase`` are left alone),
    and only what changed is put back: values are compared by identity.
    """

    def __init__(self, saved: list[tuple[type, dict[str, object]]]) -> None:
        self.saved = saved

    @classmethod
    def of(cls, klass: type) -> ClassState:
        chain = [c for c in klass.__mro__ if c not in (object, unittest.TestCase)]
        return cls([(c, dict(vars(c))) for c in chain])

    def restore(self) -> None:
        for klass, attrs in self.saved:
            now = dict(vars(klass))
            for name in now.keys() - attrs.keys():
                with contextlib.suppress(AttributeError, TypeError):
                    delattr(klass, name)
            for name, value in attrs.items():
                if now.get(name, _MISSING) is not value:
                    with contextlib.suppress(AttributeError, TypeError):
                        setattr(klass, name, value)


_MISSING = object()


@contextlib.contextmanager
def child_view(cls: type, view: ClassState | None) -> Iterator[None]:
    """``cls`` as the harness's child sees it (``view``; None: as the parent holds it now),
    and the parent's class back afterwards: the child's changes die with the child."""
    parent = ClassState.of(cls)
    if view is not None:
        view.restore()
    try:
        yield
    finally:
        parent.restore()
