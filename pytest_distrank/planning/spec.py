"""Marker reading: ``world_size``, ``simulate``, ``requires_nccl``, ``requires_gpus`` -> a frozen
spec per item (a ``mesh`` marker or a tuple of backends through :mod:`meshes`).

Runs in the controller and in every rank (both collect the same tests and must agree on ids),
and in rank 0 of a launched world. Pure logic on pytest's marker objects; no torch. A bad marker
never breaks collection: it becomes an error of the one test that carries it (see
:func:`spec_of`). The markers' help lines are :mod:`pytest_distrank.markers`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import unittest
from collections.abc import Iterable
from typing import Any

import pytest

from ..parsing import parse_backend, parse_bytes
from .meshes import (
    WS_PARAM,
    Mesh,
    MeshError,
    Simulated,
    Variant,
    applies,
    backend_tuple,
    compose,
    mesh_marker,
    parse_backends,
    parse_meshes,
)

#: Modes of ``@pytest.mark.simulate``.
SIMULATION_MODES = ("fake", "local")
#: The devices a fake-mode test may ask for (``device=``): meta allocates no memory.
SIMULATION_DEVICES = ("cpu", "meta")
#: The largest simulated world: PyTorch's fake process group takes its size and rank as a C int.
MAX_SIMULATED_SIZE = 2**31 - 1

#: The ini key listing tests that need fresh rank processes (node-id patterns, fnmatch style).
ISOLATE_INI = "distrank_isolate_tests"
#: The class (or method) attribute that asks for fresh rank processes.
ISOLATE_ATTRIBUTE = "distrank_isolate"


class MarkerError(Exception):
    """A marker that cannot be honoured; the message names the marker and the bad value."""


@dataclasses.dataclass(frozen=True)
class DistSpec:
    """What one distributed test asks for."""

    world_size: int
    backend: str
    init_process_group: bool
    needs_nccl: bool
    min_gpus: int
    #: A simulated world: ``world_size`` is then 1 (the process), ``backend`` the mode's.
    simulated: Simulated | None = None
    #: Bytes of each of its GPUs the test needs (``requires_gpus(n, memory=...)``); 0: whole.
    gpu_memory: int = 0
    #: The shape of the test's ``mesh`` fixture (``@pytest.mark.mesh``), or None.
    mesh: Mesh | None = None


def _format_marker(marker: pytest.Mark) -> str:
    args = [repr(a) for a in marker.args] + [f"{k}={v!r}" for k, v in marker.kwargs.items()]
    return f"@pytest.mark.{marker.name}({', '.join(args)})"


def _size(value: Any, marker: pytest.Mark) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MarkerError(
            f"{_format_marker(marker)}: world size {value!r} is not a positive integer; "
            "write e.g. @pytest.mark.world_size(2) or world_size(2, 4)."
        )
    return value


def world_sizes(marker: pytest.Mark, default: int) -> tuple[int, ...]:
    """The sizes a ``world_size`` marker asks for; no argument means the default size."""
    known = {"backend", "init_process_group"}
    unknown = sorted(set(marker.kwargs) - known)
    if unknown:
        raise MarkerError(
            f"{_format_marker(marker)}: unknown keyword {unknown[0]!r}; "
            f"world_size takes sizes and {', '.join(sorted(known))}."
        )
    sizes = tuple(_size(a, marker) for a in marker.args) or (default,)
    if len(set(sizes)) != len(sizes):
        raise MarkerError(f"{_format_marker(marker)}: world size given twice.")
    return sizes


def _backend(marker: pytest.Mark | None, needs_nccl: bool, default: str) -> str:
    raw = marker.kwargs.get("backend") if marker is not None else None
    if raw is None:
        return "nccl" if needs_nccl else default
    assert marker is not None
    if not isinstance(raw, str):
        raise MarkerError(f"{_format_marker(marker)}: backend must be a string, got {raw!r}.")
    try:
        return parse_backend(raw)
    except ValueError as exc:
        raise MarkerError(f"{_format_marker(marker)}: unknown backend {raw!r}; {exc}.") from None


def simulations(
    item: pytest.Item | pytest.Function, sizes_if_none: tuple[int, ...] = ()
) -> tuple[Simulated, ...]:
    """The simulated worlds the ``simulate`` markers of a test ask for (none without);
    ``sizes_if_none``: the sizes of a marker that names none (a mesh test's shapes)."""
    out: list[Simulated] = []
    for marker in item.iter_markers("simulate"):
        unknown = sorted(set(marker.kwargs) - {"ranks", "device"})
        if unknown:
            raise MarkerError(
                f"{_format_marker(marker)}: unknown keyword {unknown[0]!r}; simulate takes a "
                "mode, sizes, ranks and device."
            )
        if not marker.args or marker.args[0] not in SIMULATION_MODES:
            given = repr(marker.args[0]) if marker.args else "none"
            raise MarkerError(
                f"{_format_marker(marker)}: mode {given} is not one of "
                f"{', '.join(repr(m) for m in SIMULATION_MODES)}; write e.g. "
                "@pytest.mark.simulate('fake', 1024)."
            )
        mode, sizes = marker.args[0], tuple(_simulated_size(a, marker) for a in marker.args[1:])
        sizes = sizes or tuple(_simulated_size(a, marker) for a in sizes_if_none)
        if not sizes:
            raise MarkerError(f"{_format_marker(marker)}: give the simulated world size(s).")
        device = _simulated_device(marker, mode)
        if mode == "local" and "ranks" in marker.kwargs:
            raise MarkerError(
                f"{_format_marker(marker)}: local mode plays every rank at once (the `rank` "
                "fixture is a symbolic int of all of them); ranks= picks the rank of a 'fake' "
                "world."
            )
        ranks = _simulated_ranks(marker)
        for size in sizes:
            for rank in ranks:
                if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
                    raise MarkerError(
                        f"{_format_marker(marker)}: rank {rank!r} is not a rank of a world of "
                        f"size {size} (0 to {size - 1})."
                    )
                out.append(Simulated(mode, size, rank, "ranks" in marker.kwargs, device))
    if len(set(out)) != len(out):
        raise MarkerError("@pytest.mark.simulate: the same simulated world is asked for twice.")
    return tuple(out)


def _simulated_size(value: Any, marker: pytest.Mark) -> int:
    size = _size(value, marker)
    if size > MAX_SIMULATED_SIZE:
        raise MarkerError(
            f"{_format_marker(marker)}: world size {size} is more than PyTorch's fake process "
            f"group takes: its size is a C int, at most {MAX_SIMULATED_SIZE}."
        )
    return size


def _simulated_ranks(marker: pytest.Mark) -> tuple[Any, ...]:
    """The ranks a fake world's process plays (``ranks=``): one int or a non-empty sequence."""
    raw = marker.kwargs.get("ranks", (0,))
    if isinstance(raw, int) and not isinstance(raw, bool):
        return (raw,)
    if isinstance(raw, str | bytes) or not isinstance(raw, Iterable):
        raise MarkerError(
            f"{_format_marker(marker)}: ranks={raw!r} is not a rank or a tuple of ranks; write "
            "e.g. ranks=(0, 7)."
        )
    ranks = tuple(raw)
    if not ranks:
        raise MarkerError(
            f"{_format_marker(marker)}: ranks={raw!r} names no rank, so no simulated world "
            "would run; give the rank(s) to play, e.g. ranks=(0,), or leave ranks= out (rank 0)."
        )
    return ranks


def _simulated_device(marker: pytest.Mark, mode: str) -> str:
    device = marker.kwargs.get("device", "cpu")
    if device not in SIMULATION_DEVICES:
        raise MarkerError(
            f"{_format_marker(marker)}: device {device!r} is not one of "
            f"{', '.join(repr(d) for d in SIMULATION_DEVICES)}."
        )
    if mode == "local" and device != "cpu":
        raise MarkerError(
            f"{_format_marker(marker)}: local mode computes every rank's values, on the CPU; "
            "device='meta' is for 'fake' worlds."
        )
    return str(device)


def min_gpus(item: pytest.Item) -> int:
    marker = item.get_closest_marker("requires_gpus")
    if marker is None:
        return 0
    value = marker.args[0] if marker.args else marker.kwargs.get("n")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MarkerError(f"{_format_marker(marker)}: expected a GPU count >= 0, got {value!r}.")
    return value


def gpu_memory(item: pytest.Item) -> int:
    """Bytes of each GPU a test declared it needs (``requires_gpus(n, memory="8GiB")``); 0 when
    it declared none (then its pool leases its GPUs whole)."""
    marker = item.get_closest_marker("requires_gpus")
    raw = marker.kwargs.get("memory") if marker is not None else None
    if raw is None:
        return 0
    assert marker is not None
    try:
        value = parse_bytes(str(raw)) if not isinstance(raw, bool) else 0
    except ValueError as exc:
        raise MarkerError(f"{_format_marker(marker)}: memory {raw!r}: {exc}.") from None
    if value <= 0:
        raise MarkerError(f"{_format_marker(marker)}: memory must be more than 0, got {raw!r}.")
    return value


#: Why an item's distributed spec cannot be honoured, set during collection (by :mod:`pool.suites`:
#: a world_size marker on a class that spawns its own ranks); :func:`spec_of` raises it.
SPEC_ERROR = pytest.StashKey[str]()


def world_size_marker(item: pytest.Item) -> pytest.Mark | None:
    """The ``world_size`` marker that applies to an item, the closest one as pytest finds it.

    A class's or module's marker gives way to a closer one (documented), but two on the test
    itself (stacked decorators, or a ``pytest.param(..., marks=...)`` under the function's own)
    are a :class:`MarkerError`: pytest would keep one and drop the other without a word.
    """
    params = list(getattr(getattr(item, "callspec", None), "marks", []))
    own = [m for m in getattr(item, "own_markers", []) if m.name == "world_size"]
    if len(own) > 1:
        named = [
            _format_marker(m) + (" (from its pytest.param)" if m in params else "") for m in own
        ]
        raise MarkerError(
            f"{len(own)} world_size markers on the test itself: {' and '.join(named)}; pytest "
            "would run it at the size of one and ignore the rest without a word. Keep one "
            "marker (world_size(2, 4) runs the test at both sizes)."
        )
    return item.get_closest_marker("world_size")


def _unittest_method(item: pytest.Item) -> bool:
    """Whether the test is a unittest.TestCase method, which pytest never parametrizes."""
    cls = getattr(item, "cls", None)
    return isinstance(cls, type) and issubclass(cls, unittest.TestCase)


def _param(item: pytest.Item) -> Any:
    """The value of the hidden parameter in the test's id (:data:`WS_PARAM`), or None."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get(WS_PARAM) if callspec is not None else None


def spec_of(item: pytest.Item, default_size: int, default_backend: str) -> DistSpec | None:
    """The distributed spec of an item, or None for an ordinary test.

    Raises :class:`MarkerError` for a marker that cannot be honoured.
    """
    error = item.stash.get(SPEC_ERROR, None)
    if error is not None:
        raise MarkerError(error)
    marker = world_size_marker(item)
    if applies(item, marker):
        return _variant_spec(item, marker, default_size, default_backend)
    simulated = simulations(item)
    if marker is None and not simulated:
        return None
    if simulated and marker is not None and marker.kwargs.get("init_process_group") is False:
        raise MarkerError(
            f"@pytest.mark.simulate beside {_format_marker(marker)}: a simulated world runs on "
            "PyTorch's fake process group, which the plugin initialises before the test, so a "
            "test that initialises its own group cannot run in one. Drop simulate from this "
            "test, or drop init_process_group=False and use the group the plugin makes."
        )
    if simulated and _unittest_method(item):
        raise MarkerError(
            f"@pytest.mark.simulate on the unittest.TestCase method {item.name!r}: pytest never "
            "parametrizes unittest.TestCase methods, so the simulated ids cannot be made. Write "
            "the test as a plain pytest function."
        )
    param = _param(item)
    if isinstance(param, Simulated):
        # Both modes run on PyTorch's fake process group (local mode computes above it).
        return DistSpec(1, "fake", True, False, 0, simulated=param)
    if marker is None:
        raise MarkerError(f"{item.nodeid}: no simulated world to run in")  # pragma: no cover
    init_pg = marker.kwargs.get("init_process_group", True)
    if not isinstance(init_pg, bool):
        raise MarkerError(
            f"{_format_marker(marker)}: init_process_group must be True or False, got {init_pg!r}."
        )
    sizes = world_sizes(marker, default_size)
    if len(sizes) > 1 and _unittest_method(item):
        raise MarkerError(
            f"{_format_marker(marker)} on the unittest.TestCase method {item.name!r}: pytest never "
            "parametrizes unittest.TestCase methods (pytest_generate_tests is not called for "
            "them), so only one size could run. Give it one size, or one TestCase subclass per "
            "size, or write it as a plain pytest function."
        )
    size = param if isinstance(param, int) else sizes[0]
    needs_nccl = item.get_closest_marker("requires_nccl") is not None
    return DistSpec(
        world_size=size,
        backend=_backend(marker, needs_nccl, default_backend),
        init_process_group=init_pg,
        needs_nccl=needs_nccl,
        min_gpus=min_gpus(item),
        gpu_memory=gpu_memory(item),
    )


def parametrize_world_sizes(metafunc: pytest.Metafunc, default_size: int) -> None:
    """``world_size(2, 4)`` -> one test per size, with ids ``ws2`` and ``ws4``; each simulated
    world of a ``simulate`` marker adds one more (``ws1024-fake``).

    A marker that does not parse is left alone here; the test reports it as its own error.
    """
    marker = metafunc.definition.get_closest_marker("world_size")
    if applies(metafunc.definition, marker):
        try:
            found = variants(metafunc.definition, default_size)
        except (MarkerError, MeshError):
            return
        if WS_PARAM not in metafunc.fixturenames:
            metafunc.fixturenames.append(WS_PARAM)
        metafunc.parametrize(WS_PARAM, found, ids=[v.id for v in found])
        return
    try:
        sizes: tuple[int | Simulated, ...] = (
            world_sizes(marker, default_size) if marker is not None else ()
        )
        simulated = simulations(metafunc.definition)
    except MarkerError:
        return
    values = (*sizes, *simulated)
    if len(values) < 2 and not simulated:
        return
    if WS_PARAM not in metafunc.fixturenames:
        metafunc.fixturenames.append(WS_PARAM)
    ids = [v.id if isinstance(v, Simulated) else f"ws{v}" for v in values]
    metafunc.parametrize(WS_PARAM, values, ids=ids)


def variants(item: pytest.Item, default_size: int) -> tuple[Variant, ...]:
    """The test ids of a test with a ``mesh`` marker or a tuple of backends (planning/meshes.py
    says how they compose)."""
    marker = world_size_marker(item)
    found = mesh_marker(item)
    shapes = parse_meshes(found) if found is not None else ()
    simulated = simulations(item, tuple(dict.fromkeys(m.size for m in shapes)))
    real: tuple[int, ...] | None = None  # None: the shapes' sizes
    if marker is not None and (marker.args or not shapes):
        real = world_sizes(marker, default_size)
    elif marker is None and simulated:
        real = ()  # a simulated test runs in its simulated worlds alone
    backends = parse_backends(marker) if marker is not None and backend_tuple(marker) else None
    where = " beside ".join(_format_marker(m) for m in (found, marker) if m is not None)
    return compose(shapes, real, simulated, backends, where)


def _variant_spec(
    item: pytest.Item, marker: pytest.Mark | None, default_size: int, default_backend: str
) -> DistSpec:
    """:func:`spec_of` for a test with a ``mesh`` marker or a tuple of backends."""
    try:
        found = variants(item, default_size)
    except MeshError as exc:
        raise MarkerError(str(exc)) from None
    init_pg = marker.kwargs.get("init_process_group", True) if marker is not None else True
    where = _format_marker(marker) if marker is not None else ""
    if not isinstance(init_pg, bool):
        raise MarkerError(f"{where}: init_process_group must be True or False, got {init_pg!r}.")
    if item.get_closest_marker("mesh") is not None and not init_pg:
        raise MarkerError(
            f"@pytest.mark.mesh beside {where}: the mesh is made over the default process group "
            "the plugin creates, which init_process_group=False leaves out. Drop one of them."
        )
    if _unittest_method(item):
        raise MarkerError(
            f"the mesh or backend ids of the unittest.TestCase method {item.name!r}: pytest never "
            "parametrizes unittest.TestCase methods, so the ids cannot be made. Write the test "
            "as a plain pytest function."
        )
    param = _param(item)
    variant = param if isinstance(param, Variant) else found[0]
    if variant.simulated is not None:
        return DistSpec(1, "fake", True, False, 0, simulated=variant.simulated, mesh=variant.mesh)
    needs_nccl = item.get_closest_marker("requires_nccl") is not None
    backend = variant.backend or _backend(marker, needs_nccl, default_backend)
    return DistSpec(
        world_size=variant.size,
        backend=backend,
        init_process_group=init_pg,
        needs_nccl=needs_nccl,
        min_gpus=min_gpus(item),
        gpu_memory=gpu_memory(item),
        mesh=variant.mesh,
    )


def wants_fresh_ranks(item: pytest.Item, patterns: list[str]) -> bool:
    """Whether a distributed test must run on rank processes of its own: the
    ``distrank_isolate`` marker, a true ``distrank_isolate`` attribute on its class or method, or
    a match among the ``distrank_isolate_tests`` ini patterns (which need no edit of the file)."""
    if item.get_closest_marker("distrank_isolate") is not None:
        return True
    for owner in (getattr(item, "cls", None), getattr(item, "obj", None)):
        if getattr(owner, ISOLATE_ATTRIBUTE, False) is True:
            return True
    return any(fnmatch.fnmatchcase(item.nodeid, pattern) for pattern in patterns)
