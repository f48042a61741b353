"""Meshes and backends as test ids: ``@pytest.mark.mesh`` and ``world_size(backend=(...))`` ->
one :class:`Variant` per test id.

Runs where tests are collected and planned: in the controller and in every rank (both collect
the same tests and must agree on ids), and in rank 0 of a launched world; :func:`shape_of` also in
the ranks, for the ``mesh`` fixture. Pure logic on pytest's marker objects; no torch. :mod:`spec`
hands a test to this module when it carries a ``mesh`` marker or a tuple of backends
(:func:`applies`), and raises what this module finds wrong as an error of that test alone.

How ids compose: ``ws<N>``, then the mesh (``dp2-tp2``), then a simulated world's mode and rank
(``fake``, ``r7``), then the backend when ``backend=`` is a tuple (``gloo``, ``nccl``), each part
joined by ``-``: ``ws4-dp2-tp2-nccl``, ``ws1024-dp8-tp128-fake-r1023``. Every id the plugin makes
starts with the number of ranks, so ``-k ws4`` selects every test on 4 ranks and ``-k dp2-tp2``
every test of that shape.

Which worlds a mesh test runs in: each shape runs in every world of its size. The real worlds are
the sizes of ``world_size`` (``world_size()`` without sizes: every shape's size); without a
``world_size`` marker, every shape's size, unless the test is simulated (then only the simulated
worlds run, as for a test with ``simulate`` alone). ``simulate(mode)`` without sizes simulates
every shape's size. A world that no shape fits, or a shape that fits no world, is an error.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from ..parsing import parse_backend

#: The marker's name (its line for ``pytest --markers`` is in :mod:`markers`).
MARKER = "mesh"
#: Name of the hidden parameter that ``world_size(2, 4)`` parametrizes (ids ``ws2``, ``ws4``): an
#: int, a :class:`Simulated` world or a :class:`Variant`.
WS_PARAM = "_distrank_world_size"
#: A dimension's name: it is part of the id, so letters, digits and _, not a leading digit.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: One dimension of a shape written as text (``dp2``): the name cannot end in a digit there.
_TEXT_DIM = re.compile(r"([A-Za-z_][A-Za-z0-9_]*?)([0-9]+)")


class MeshError(Exception):
    """A ``mesh`` marker, or a tuple of backends, that cannot be honoured; the message names it."""


@dataclasses.dataclass(frozen=True)
class Simulated:
    """One simulated world a test runs in (``@pytest.mark.simulate``): one process plays
    ``rank`` of ``size`` ranks."""

    mode: str
    size: int
    #: The rank a fake world's process plays; 0 in local mode (the process plays every rank).
    rank: int
    #: Whether the marker named its ranks (then the id names the rank too).
    named_rank: bool = False
    #: The ``device`` fixture's type: "cpu" or "meta" (fake mode only).
    device: str = "cpu"

    @property
    def id(self) -> str:
        tail = f"-r{self.rank}" if self.named_rank else ""
        return f"ws{self.size}-{self.mode}{tail}"

    def describe(self) -> str:
        if self.mode == "local":
            return f"world size {self.size} simulated (local: every rank at once)"
        device = f", device {self.device}" if self.device != "cpu" else ""
        return f"world size {self.size} simulated ({self.mode}, as rank {self.rank}{device})"


@dataclasses.dataclass(frozen=True)
class Mesh:
    """One shape of a ``mesh`` marker: named dimensions, outermost first."""

    dims: tuple[tuple[str, int], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.dims)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(size for _, size in self.dims)

    @property
    def size(self) -> int:
        """The world size the shape needs: the product of its dimensions."""
        out = 1
        for _, size in self.dims:
            out *= size
        return out

    @property
    def id(self) -> str:
        return "-".join(f"{name}{size}" for name, size in self.dims)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One test id of a mesh test or of a tuple of backends: the hidden parameter's value."""

    #: Ranks of the world (simulated or real).
    size: int
    mesh: Mesh | None = None
    #: A simulated world, or None for real ranks.
    simulated: Simulated | None = None
    #: The backend picked from ``backend=(...)``; None: the marker's single backend or default.
    backend: str | None = None

    @property
    def id(self) -> str:
        parts = [f"ws{self.size}"]
        if self.mesh is not None:
            parts.append(self.mesh.id)
        if self.simulated is not None:
            parts.append(self.simulated.id.split("-", 1)[1])  # "fake" or "fake-r7"
        if self.backend is not None:
            parts.append(backend_id(self.backend))
        return "-".join(parts)


def shape_of(item: pytest.Item) -> Mesh | None:
    """The mesh shape of a test's id (``@pytest.mark.mesh``), or None."""
    callspec = getattr(item, "callspec", None)
    param = callspec.params.get(WS_PARAM) if callspec is not None else None
    return param.mesh if isinstance(param, Variant) else None


def missing_message(nodeid: str) -> str:
    """The ``mesh`` fixture's error for a test without a shape."""
    return (
        f"{nodeid} uses the fixture 'mesh', which needs a shape: add "
        "@pytest.mark.mesh(dp=2, tp=2) (or mesh({'dp': 2, 'tp': 2}, {'dp': 4}) for several) "
        "to the test."
    )


def backend_id(backend: str) -> str:
    """A backend's part of an id: ``nccl``; a mapping ``cpu:gloo,cuda:nccl`` -> ``gloo+nccl``."""
    return "+".join(part.split(":", 1)[-1].strip() for part in backend.split(","))


def _format(marker: pytest.Mark) -> str:
    args = [repr(a) for a in marker.args] + [f"{k}={v!r}" for k, v in marker.kwargs.items()]
    return f"@pytest.mark.{marker.name}({', '.join(args)})"


def mesh_marker(item: pytest.Item) -> pytest.Mark | None:
    """The ``mesh`` marker that applies (the closest); two on the test itself are an error."""
    own = [m for m in getattr(item, "own_markers", []) if m.name == MARKER]
    if len(own) > 1:
        raise MeshError(
            f"{len(own)} mesh markers on the test itself: "
            f"{' and '.join(_format(m) for m in own)}; pytest would keep one and drop the rest "
            "without a word. Give every shape to one marker: "
            "@pytest.mark.mesh({'dp': 2, 'tp': 2}, {'dp': 4})."
        )
    return item.get_closest_marker(MARKER)


def backend_tuple(marker: pytest.Mark | None) -> bool:
    """Whether a ``world_size`` marker gives several backends (``backend=("gloo", "nccl")``)."""
    raw = marker.kwargs.get("backend") if marker is not None else None
    return isinstance(raw, tuple | list)


def applies(item: pytest.Item, world_size: pytest.Mark | None) -> bool:
    """Whether this module makes the test's ids: a ``mesh`` marker or a tuple of backends."""
    return item.get_closest_marker(MARKER) is not None or backend_tuple(world_size)


def parse_meshes(marker: pytest.Mark) -> tuple[Mesh, ...]:
    """The shapes a ``mesh`` marker asks for, in its order."""
    where = _format(marker)
    if marker.args and marker.kwargs:
        raise MeshError(
            f"{where}: give one shape as keywords (mesh(dp=2, tp=2)) or several as dicts or "
            "texts (mesh({'dp': 2, 'tp': 2}, 'dp4')), not both."
        )
    raw: list[Any] = list(marker.args) if marker.args else [dict(marker.kwargs)]
    if not marker.args and not marker.kwargs:
        raise MeshError(f"{where}: no shape; write e.g. @pytest.mark.mesh(dp=2, tp=2).")
    shapes = tuple(_shape(one, where) for one in raw)
    seen: set[Mesh] = set()
    for shape in shapes:
        if shape in seen:
            raise MeshError(f"{where}: shape {shape.id} given twice.")
        seen.add(shape)
    return shapes


def _shape(raw: Any, where: str) -> Mesh:
    if isinstance(raw, str):
        return Mesh(tuple(_text_dims(raw, where)))
    if isinstance(raw, Mapping):
        if not raw:
            raise MeshError(f"{where}: shape {{}} has no dimension.")
        return Mesh(tuple(_dims(raw.items(), where, repr(dict(raw)))))
    raise MeshError(
        f"{where}: shape {raw!r} is not a dict of dimension sizes or a text such as 'dp2-tp2'."
    )


def _text_dims(text: str, where: str) -> list[tuple[str, int]]:
    dims = []
    for part in text.split("-"):
        match = _TEXT_DIM.fullmatch(part.strip())
        if match is None:
            raise MeshError(
                f"{where}: shape {text!r}: {part!r} is not a dimension such as 'dp2' (a name "
                "that does not end in a digit, then its size), in a shape such as 'dp2-tp2'."
            )
        dims.append((match.group(1), int(match.group(2))))
    return _dims(dims, where, repr(text))


def _dims(pairs: Iterable[tuple[Any, Any]], where: str, shape: str) -> list[tuple[str, int]]:
    dims: list[tuple[str, int]] = []
    for name, size in pairs:
        if not isinstance(name, str) or _NAME.fullmatch(name) is None:
            raise MeshError(
                f"{where}: shape {shape}: dimension name {name!r} is not a name of letters, "
                "digits and _ (it is part of the test id)."
            )
        if any(name == seen for seen, _ in dims):
            raise MeshError(f"{where}: shape {shape}: dimension {name!r} given twice.")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise MeshError(
                f"{where}: shape {shape}: dimension {name!r} has size {size!r}, not a positive "
                "integer, so the mesh's world size (the product) is not one either."
            )
        dims.append((name, size))
    return dims


def parse_backends(marker: pytest.Mark) -> tuple[str, ...]:
    """The backends of ``world_size(..., backend=("gloo", "nccl"))``, one test id each."""
    raw = marker.kwargs["backend"]
    where = _format(marker)
    if not raw:
        raise MeshError(f"{where}: backend=() names no backend; give one or more.")
    out: list[str] = []
    for one in raw:
        if not isinstance(one, str):
            raise MeshError(f"{where}: backend {one!r} is not a string.")
        try:
            value = parse_backend(one)
        except ValueError as exc:
            raise MeshError(f"{where}: unknown backend {one!r}; {exc}.") from None
        if backend_id(value) in {backend_id(b) for b in out}:
            raise MeshError(f"{where}: backend {one!r} given twice.")
        out.append(value)
    return tuple(out)


def compose(
    meshes: tuple[Mesh, ...],
    real: tuple[int, ...] | None,
    simulated: tuple[Simulated, ...],
    backends: tuple[str, ...] | None,
    where: str,
) -> tuple[Variant, ...]:
    """Every test id of a test, in order: the real worlds (each shape of that size, each
    backend), then the simulated worlds (each shape of that size).

    ``real``: the sizes the ``world_size`` marker names, or None for what the shapes say (every
    shape's size); ``where`` names the markers in errors.
    """
    variants: list[Variant] = []
    if meshes and real is None:
        real = tuple(dict.fromkeys(m.size for m in meshes))
    fits: list[tuple[int, tuple[Mesh | None, ...]]] = []
    for size in real or ():
        shapes: tuple[Mesh | None, ...] = tuple(m for m in meshes if m.size == size)
        if meshes and not shapes:
            raise MeshError(f"{where}: world size {size} fits no shape ({_sizes(meshes)}).")
        fits.append((size, shapes or (None,)))
    for size, shapes in fits:
        for shape in shapes:
            for backend in backends or (None,):
                variants.append(Variant(size, shape, None, backend))
    for world in simulated:
        shapes = tuple(m for m in meshes if m.size == world.size)
        if meshes and not shapes:
            raise MeshError(
                f"{where}: simulated world size {world.size} fits no shape ({_sizes(meshes)})."
            )
        variants.extend(Variant(world.size, shape, world) for shape in shapes or (None,))
    used = {v.mesh for v in variants}
    for shape in meshes:
        if shape not in used:
            raise MeshError(
                f"{where}: shape {shape.id} needs world size {shape.size}, which neither "
                "world_size nor simulate names; add the size, or drop the shape."
            )
    return tuple(variants)


def _sizes(meshes: tuple[Mesh, ...]) -> str:
    return ", ".join(f"{m.id}: {m.size} ranks" for m in meshes)
