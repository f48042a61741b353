"""The process-wide state a test can change in a warm rank, taken, compared and put back.

Runs in pool-mode rank processes (:mod:`rank.leftovers` takes a :class:`Snapshot` when each test
starts and after its teardown). A snapshot is pure data by category: each category maps a key
to its value (None: absent). :func:`diff` and :func:`restore` are the rules the leftover check
applies; which categories are restored and which only named is :data:`RESTORED` and
:data:`NAMED` (docs/reuse.md#leftovers lists them for users).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from .. import _compat
from . import processstate
from .ownedgroups import is_owned
from .switches import switches_state
from .torchstate import set_torch_flag, torch_flags

Category = dict[Any, Any]
#: Categories put back as they were (the process groups a test left: destroyed).
RESTORED = ("env", "cwd", "torch", "switches", "groups", "compiled")
#: Categories named, never put back (threads: the pool goes if one would hold a fresh exit up).
NAMED = ("threads", "path", "modules", "umask", "signals", "logging", "children", "sockets")


@dataclasses.dataclass
class Snapshot:
    """The process-wide state a test can change, by category."""

    env: Category
    cwd: Category
    torch: Category
    #: Switches outside torch's flags (:mod:`switches`): the collector, numpy's errors, ...
    switches: Category
    threads: Category
    groups: Category
    compiled: Category
    path: Category
    modules: Category
    umask: Category
    signals: Category
    logging: Category
    children: Category
    #: The sockets held open, by inode (whether one listens is read only for new ones).
    sockets: Category

    @classmethod
    def take(cls) -> Snapshot:
        return cls(
            _compat.environ_data(),  # encoded names and values: decoded only where they differ
            {"": _cwd()},
            torch_flags(),
            switches_state(),
            {t.ident: t for t in threading.enumerate()},
            live_groups(),
            {"": _compat.compile_state()},
            processstate.path_state(),
            processstate.modules_state(),
            processstate.umask_state(),
            processstate.signal_state(),
            processstate.logging_state(),
            processstate.children_state(),
            dict.fromkeys(processstate.socket_inodes(), True),  # None would read absent
        )

    def categories(self) -> dict[str, Category]:
        return {name: getattr(self, name) for name in _FIELDS}

    def copy(self) -> Snapshot:
        return Snapshot(**{name: dict(values) for name, values in self.categories().items()})

    def put(self, category: str, key: Any, value: Any) -> None:
        """Set one entry (a wider fixture's change) in a copy of its category: a category read
        through a mark is the same object in other snapshots, never changed in place."""
        values = dict(getattr(self, category))
        values[key] = value
        setattr(self, category, values)


#: The categories, in the order taken (read once: ``dataclasses.fields`` costs more than a read).
_FIELDS = tuple(field.name for field in dataclasses.fields(Snapshot))


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:  # the test removed the folder it left the rank in
        return "(a removed folder)"


def live_groups() -> Category:
    """The process groups alive in this rank that are not the plugin's own, by ``id`` (walked
    every time: a last read kept would keep a destroyed group, and its listening socket, alive)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return {}
    # The plugin's own groups (the checks' twins) live as long as the pool: never a leftover.
    return {id(pg): pg for pg in _compat.process_groups() if not is_owned(pg)}


def owned_groups() -> int:
    """How many of the plugin's own groups are alive (a check's twin, the mesh fixture's)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return 0
    return sum(1 for pg in _compat.process_groups() if is_owned(pg))


def diff(before: Snapshot, after: Snapshot) -> Iterable[tuple[tuple[str, Any], Any]]:
    """((category, key), the value before) for every key whose value differs."""
    now = after.categories()
    for category, values in before.categories().items():
        other = now[category]
        if same(values, other):
            continue
        # In the order taken: torch's precision is restored before the flags it also sets.
        for key in [*values, *(k for k in other if k not in values)]:
            if not same(values.get(key), other.get(key)):
                yield (category, key), values.get(key)


def same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # a value whose comparison raises: unchanged only if it is the same
        return False


def restore(category: str, key: Any, value: Any) -> bool:
    """Put one entry of a :data:`RESTORED` category back (the others are only named); whether
    it was put back."""
    restorers: dict[str, Callable[[Any, Any], None]] = {
        "env": _restore_env,
        "cwd": lambda _, v: os.chdir(v),
        "torch": set_torch_flag,
    }
    put_back = restorers.get(category)
    if put_back is None:
        return False
    try:
        put_back(key, value)
    except Exception:  # e.g. the folder is gone; named either way
        return False
    return True


def env_key(name: str) -> Any:
    """``name`` as :func:`_compat.environ_data` keys it (encoded where the OS has bytes)."""
    return os.fsencode(name) if os.supports_bytes_environ else name


def decoded(value: Any) -> str:
    """A name or value of :func:`_compat.environ_data` as ``os.environ`` shows it."""
    return os.fsdecode(value) if isinstance(value, bytes) else str(value)


def _restore_env(name: Any, value: Any) -> None:
    if value is None:
        os.environ.pop(decoded(name), None)
    else:
        os.environ[decoded(name)] = decoded(value)
    if decoded(name) == "TZ":  # libc keeps the zone it read at the last tzset()
        time.tzset()
