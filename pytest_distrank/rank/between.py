"""What changes in a warm rank between two tests, outside both: what each rank should start from.

Runs in pool-mode rank processes (:mod:`rank.leftovers` asks at each test's start). A test's
leftovers are what its window changed: from its start snapshot to the one after its teardown.
Code also runs outside every window: a fixture of a wider scope torn down only when the next
test shows it is no longer needed (a pool's next test is of another module), a ``conftest.py``
``pytest_runtest_logfinish`` hook, a protocol wrapper outside the check's, an object's
``__del__`` when pytest lets the test's arguments go. What that changes is nobody's test's:
it is found by comparing the next test's start with the previous test's end as the check left
it (its restores applied), named on its own line, and restored where it can be, so that the
next test starts as the previous one ended.

Only the categories that nothing of the plugin's own changes between two tests are compared
(:data:`BETWEEN`): process groups are destroyed, children end, sockets close and modules are
imported there by the plugin itself; of the threads, only one that is no daemon and started
there (a fresh process would wait for it at exit: the pool goes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..envvars import PLUGIN_PORT_ENV
from .snapshot import Snapshot, env_key

#: The categories compared between two tests.
BETWEEN = ("env", "cwd", "torch", "switches", "path", "umask", "signals", "logging")
#: (category, key) -> a value.
Values = Mapping[tuple[str, Any], Any]


def kept(end: Snapshot) -> dict[str, dict[Any, Any]]:
    """What is kept of a test's end snapshot until the next test's start: the categories
    compared (not the process groups, which it would keep alive), the threads, and the modules
    (not compared: told apart from those imported between the two tests, whose loggers are no
    change of anyone's)."""
    return {category: getattr(end, category) for category in (*BETWEEN, "threads", "modules")}


def expected_start(
    ended: Mapping[str, dict[Any, Any]], restored: Values, owned: Values, start: Snapshot
) -> Snapshot:
    """What ``start`` should read: ``ended``, the previous test's end as :func:`kept` keeps it,
    with what the check ``restored`` after it put back, and each key a fixture torn down between
    the two tests ``owned`` (its value before that fixture's setup, in any category); ``start``
    itself in the categories not compared; ``MASTER_PORT`` is the port the plugin serves now.
    :func:`snapshot.diff` of it and ``start`` is what changed between the two tests."""
    # The categories not compared are start's own dicts, the compared ones the end's (diff sees
    # a category read through an unchanged mark the same at once: the same object); each is
    # copied only where a key is put in (a snapshot's categories are never changed in place).
    categories = start.categories()
    categories.update((category, ended[category]) for category in BETWEEN)
    copied: set[str] = set()

    def values(category: str) -> dict[Any, Any]:
        if category not in copied:
            copied.add(category)
            categories[category] = dict(categories[category])
        return categories[category]

    for (category, key), value in restored.items():
        if category in BETWEEN:
            _put(values(category), key, value)
    for (category, key), value in owned.items():  # a torn-down fixture's, in any category
        _put(values(category), key, value)
    threads = categories["threads"] = dict(ended["threads"])
    for ident, thread in start.threads.items():  # a daemon started there: the plugin's, maybe
        if ident not in threads and getattr(thread, "daemon", True):
            threads[ident] = thread
    env = values("env")
    _put(env, _CURRENT_TEST, start.env.get(_CURRENT_TEST))  # as start has it: equal at once
    port = start.env.get(_PLUGIN_PORT)
    if port is not None:  # the plugin serves a fresh store before each test: MASTER_PORT is its
        env[_MASTER_PORT] = port
    return Snapshot(**categories)


#: An ``init_process_group=False`` pool serves a fresh TCPStore before each test and exports
#: its port as both (pool/worker/rankgroup.master_store): a change of the plugin's own.
_PLUGIN_PORT, _MASTER_PORT = env_key(PLUGIN_PORT_ENV), env_key("MASTER_PORT")
#: pytest's, set at each phase and unset after the teardown (never a leftover): as start has it.
_CURRENT_TEST = env_key("PYTEST_CURRENT_TEST")


def _put(values: dict[Any, Any], key: Any, value: Any) -> None:
    if value is None:  # absent (a variable the check unset again)
        values.pop(key, None)
    else:
        values[key] = value
