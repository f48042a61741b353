"""Process groups the plugin owns in a rank: created on first need, kept for the pool's life,
never a test's leftover.

Runs in rank processes of both modes. The checks across ranks (:mod:`api.parity`) run their
collectives on a twin of the test's group (the same ranks, gloo, made once per rank set), so
that they never advance the sequence numbers of the test's own groups, which the hang verdicts
and the sequence-number check read. Only a twin's members take part in making it, and it takes a
name of its own that every member derives alike (its ranks and the meeting that agreed on it:
:func:`_compat.torch_internals.new_gloo_group_named`), so the counter that names the test's
later groups ("1", "2", ...) does not move, and members holding different numbers of groups
agree (torch's hashed name counts the groups each process holds). :mod:`rank.leftovers` leaves
owned groups alone (:func:`is_owned`). The ``mesh`` fixture's groups (:mod:`rank.meshes`) are
owned too (:func:`own`): the fixture keeps each shape's mesh for the pool's life. torch is
imported only when a function is called.

A pool's ranks make the twin of their world when the pool starts (:func:`twin_of_world`), so a
rank that skips a check leaves its peers in a collective the hang verdicts judge. Any other
twin is made by the first check on its ranks; its members first meet on the default group's
store (:func:`meet`): new_group's own rendezvous waits for its store's timeout (minutes) and
names nobody, the meeting waits :data:`MEET_WAIT` seconds and names the ranks that did not come.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .. import _compat
from ..outcome.merge import ranks_words

#: What an owned group is for, as torch's ``group_desc`` (shown in flight records).
OWNED_DESC = "distrank_checks"
#: (id of the default group, ranks) -> the owned twin of that rank set.
_TWINS: dict[tuple[int, tuple[int, ...]], Any] = {}
#: How long the members of a new twin wait for each other before the check fails.
MEET_WAIT = 30.0
#: (node id, ranks) -> twins of those ranks this process made during that test.
_MEETINGS: dict[tuple[str, tuple[int, ...]], int] = {}
#: Other groups the plugin keeps (the ``mesh`` fixture's), by ``id``.
_OWNED: dict[int, Any] = {}


def is_owned(pg: Any) -> bool:
    """Whether ``pg`` is one of the plugin's own groups (not the test's)."""
    return any(pg is twin for twin in _TWINS.values()) or _OWNED.get(id(pg)) is pg


def own(pg: Any) -> None:
    """Count ``pg`` among the plugin's groups from now on: never a test's leftover."""
    _OWNED[id(pg)] = pg


def disown(pg: Any) -> None:
    _OWNED.pop(id(pg), None)


def twin(ranks: list[int], check: str = "a check across ranks") -> Any:
    """The plugin's gloo group of ``ranks`` (global ranks, this rank among them), made on
    first need: every member must call this at the same point, as for any new group. A
    member that does not come within :data:`MEET_WAIT` seconds fails the check on the others,
    named (:class:`TwinMeetingError`)."""
    import torch.distributed as dist

    alive = _compat.process_groups()
    for key, pg in list(_TWINS.items()):  # a test's own world (init_process_group=False) ended
        if not any(pg is g for g in alive):
            del _TWINS[key]
    key = (id(dist.group.WORLD), tuple(ranks))
    pg = _TWINS.get(key)
    if pg is None:
        # the group's store keys live under its name: apart from the meeting's
        name = f"{meet(ranks, check)}/group"
        pg = _TWINS[key] = _compat.new_gloo_group_named(ranks, name, OWNED_DESC)
    return pg


def twin_of_world() -> None:
    """Make the twin of the default group now (a pool's ranks, right after they start: every
    rank is there), so that no check waits in its rendezvous."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        ranks = list(range(dist.get_world_size()))
        name = f"distrank-twin/world/{_ranks_key(ranks)}"
        _TWINS[(id(dist.group.WORLD), tuple(ranks))] = _compat.new_gloo_group_named(
            ranks, name, OWNED_DESC
        )


class TwinMeetingError(RuntimeError):
    """A member of a check's group did not call the check (its twin's meeting timed out)."""

    __module__ = "builtins"


def _ranks_key(ranks: list[int]) -> str:
    return ",".join(map(str, ranks))


def meet(ranks: list[int], check: str, wait: float | None = None) -> str:
    """Wait until every one of ``ranks`` came here, at most ``wait`` seconds, on the default
    group's store; a TwinMeetingError names those that did not. Returns the meeting's name,
    the same on every member and unique in the world: the twin's name. Keys: this test's node
    id, the ranks, and how many twins of them this process made in this test (the same on
    every member that calls the same checks). The last to come says "go"; one that gives up
    says "gave up" first (``compare_set``: one of the two wins, everyone reads the same)."""
    import torch.distributed as dist

    wait = MEET_WAIT if wait is None else wait
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    count = _MEETINGS[(test, tuple(ranks))] = _MEETINGS.get((test, tuple(ranks)), 0) + 1
    name = f"distrank-twin/{test}/{_ranks_key(ranks)}/{count}"
    store = _default_store()
    if store is None:
        return name
    me = dist.get_rank()
    where = dist.PrefixStore(f"{name}/", store)
    where.set(f"came/{me}", "1")
    if where.add("came", 1) == len(ranks):
        where.compare_set("verdict", "", "go")
    end = time.monotonic() + wait
    while not where.check(["verdict"]) and time.monotonic() < end:
        time.sleep(0.01)
    verdict = where.compare_set("verdict", "", "gave up").decode()
    if verdict == "go":
        return name
    missing = [r for r in ranks if not where.check([f"came/{r}"])]
    group = f"the group of ranks {', '.join(map(str, ranks))}"
    if missing:
        who = ranks_words(missing)
        came = ranks_words(r for r in ranks if r not in missing)
        what = f"{who} did not call {check} within {wait:g} s; {came} did"
    else:
        what = f"rank {me} came more than {wait:g} s after the others, who stopped waiting"
    raise TwinMeetingError(
        f"{check} on {group} in {test or 'this test'}: {what}. Every rank of the group must "
        "call the check at the same point (a rank that returns early or skips it leaves the "
        "others waiting)."
    )


def _default_store() -> Any:
    """The default group's store (torch keeps it private: ``_get_default_store``), or None."""
    from torch.distributed import distributed_c10d as c10d

    get = getattr(c10d, "_get_default_store", None)
    try:
        return get() if get is not None else None
    except (RuntimeError, ValueError):
        return None
