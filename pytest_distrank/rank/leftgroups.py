"""What a test left that is dealt with after its reports: its process groups, destroyed, and the
sockets still listening once they are.

Runs in pool-mode rank processes (:class:`leftovers.LeftoverCheck` keeps a :class:`Found` per
test, and per gap between two tests, and ends it with these after the test's sequence numbers
were read: a group destroyed before would show its collectives as missing).
"""

from __future__ import annotations

import dataclasses
import gc
from typing import Any

from . import processstate as ps
from .leftoverwords import NAMES, few, group_words, not_restored
from .snapshot import live_groups


@dataclasses.dataclass
class Found:
    """What a test left, on this rank: words (restored, or named with
    :data:`checks.NOT_RESTORED` or " still running"), why the pool must go, groups."""

    words: list[str] = dataclasses.field(default_factory=list)
    unfit: list[str] = dataclasses.field(default_factory=list)
    #: Process groups to destroy after the test's sequence numbers were read, and to name.
    groups: list[Any] = dataclasses.field(default_factory=list)
    #: Groups of a DeviceMesh the test built: destroyed too, never named (normal, not a leak).
    mesh_groups: list[Any] = dataclasses.field(default_factory=list)
    #: Sockets the test opened and still holds: named in :meth:`LeftoverCheck.finish` if they
    #: still listen once its groups are destroyed (a gloo group listens until then).
    sockets: frozenset[int] = frozenset()


def destroy(found: Found) -> bool:
    """Destroy the groups ``found`` holds (a DeviceMesh's unnamed); whether any was."""
    # Under init_process_group=False the pool destroys whatever the test left, by design
    # (rankgroup.group_problem, before this): only groups still alive are leftovers.
    groups, meshes = found.groups, found.mesh_groups
    found.groups = found.mesh_groups = []
    live = live_groups() if groups or meshes else {}
    named = {id(pg) for pg in groups}
    for pg in (pg for pg in [*groups, *meshes] if id(pg) in live):
        words = group_words(pg)
        try:
            import torch.distributed as dist

            dist.destroy_process_group(pg)
        except Exception as exc:
            found.unfit.append(f"left {words} that could not be destroyed ({exc!r})")
        else:
            if id(pg) in named:
                found.words.append(words)
    return bool(live)


def listening(sockets: frozenset[int], destroyed: bool) -> list[str]:
    """Words for the new sockets that still listen once garbage is collected: a destroyed
    group's listener closes only when the group is freed (one the check destroyed, or one the
    test or a harness class's tearDown destroyed: PyTorch's subgroup tests); a collection runs
    only when a new socket still listens."""
    new = sockets & ps.socket_inodes() if sockets else sockets  # no new socket: no walk
    left = ps.listening(new) if new else {}
    if left:  # a group destroyed (by the check, the test, a harness) listens until freed
        gc.collect()
        left = ps.listening(new & ps.socket_inodes())
    words = few([ps.socket_words(address) for address in sorted(left.values())], NAMES["sockets"])
    if words and destroyed:
        words[-1] += (
            " (a process group destroyed after the test listens until freed: a DeviceMesh "
            "or group the test kept in a global holds it)"
        )
    return [not_restored(w) for w in words]
