"""The ``mesh`` fixture's ``DeviceMesh``: made once per pool and shape, owned by the plugin.

Runs in rank processes of both modes (the ``mesh`` fixture of :mod:`fixtures`, set up by every
rank of the test at the same point). The first test of a shape makes the mesh with
``init_device_mesh(device.type, shape, mesh_dim_names=names)`` over the default group; later
tests of the pool with that shape get the same object. The subgroups it creates are the
plugin's (:func:`ownedgroups.own`), so the leftover check never names them as the test's; a
test that destroys one gets a new mesh in the next test that asks for that shape. torch is
imported only when a function is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _compat
from ..planning.meshes import Mesh
from .ownedgroups import disown, own

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

#: (id of the default group, shape, device type) -> (the mesh, the groups it created).
_MESHES: dict[tuple[int, Mesh, str], tuple[Any, list[Any]]] = {}


def device_mesh(shape: Mesh, device_type: str) -> DeviceMesh:
    """The pool's mesh of ``shape`` on ``device_type``, made on first need."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.group.WORLD
    alive = {id(pg) for pg in _compat.process_groups()}
    for key, (_, groups) in list(_MESHES.items()):  # a world replaced, a subgroup destroyed
        if key[0] != id(world) or any(id(pg) not in alive for pg in groups):
            for pg in groups:
                disown(pg)
            del _MESHES[key]
    key = (id(world), shape, device_type)
    found = _MESHES.get(key)
    if found is not None:
        return found[0]
    mesh = init_device_mesh(device_type, shape.shape, mesh_dim_names=shape.names)
    made = [pg for pg in _compat.process_groups() if id(pg) not in alive]
    for pg in made:
        own(pg)
    _MESHES[key] = (mesh, made)
    return mesh
