"""Process groups the plugin owns in a rank: created on first need, kept for the pool's life,
never a test's leftover.

Runs in rank processes of both modes. The checks across ranks (:mod:`rank.parity`) run their
collectives on a twin of the test's group (the same ranks, gloo, made once per rank set), so
that they never advance the sequence numbers of the test's own groups, which the hang verdicts
and the sequence-number check read. A twin is made with ``use_local_synchronization=True``: only
its members take part, and it takes a hashed name, so the counter that names the test's later
groups ("1", "2", ...) does not move. :mod:`rank.leftovers` leaves owned groups alone
(:func:`is_owned`). The ``mesh`` fixture's groups (:mod:`rank.meshes`) are owned too
(:func:`own`): the fixture keeps each shape's mesh for the pool's life. torch is imported only
when a function is called.
"""

from __future__ import annotations

from typing import Any

from .. import _compat

#: What an owned group is for, as torch's ``group_desc`` (shown in flight records).
OWNED_DESC = "distrank_checks"
#: (id of the default group, ranks) -> the owned twin of that rank set.
_TWINS: dict[tuple[int, tuple[int, ...]], Any] = {}
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


def twin(ranks: list[int]) -> Any:
    """The plugin's gloo group of ``ranks`` (global ranks, this rank among them), made on
    first need: every member must call this at the same point, as for any new group."""
    import torch.distributed as dist

    alive = _compat.process_groups()
    for key, pg in list(_TWINS.items()):  # a test's own world (init_process_group=False) ended
        if not any(pg is g for g in alive):
            del _TWINS[key]
    key = (id(dist.group.WORLD), tuple(ranks))
    pg = _TWINS.get(key)
    if pg is None:
        pg = dist.new_group(
            ranks, backend="gloo", use_local_synchronization=True, group_desc=OWNED_DESC
        )
        _TWINS[key] = pg
    return pg
