"""Unit tests of meshes and backends as test ids (planning/meshes.py, through markers.py): the
shapes a ``mesh`` marker gives, how ids compose, which worlds run which shape, the errors, and
launcher mode's skip of a shape its world does not fit (launch/plan.py)."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import cast

import pytest

from pytest_distrank.launch.plan import Step, decide
from pytest_distrank.launch.session import RankSession
from pytest_distrank.planning.meshes import (
    WS_PARAM,
    Mesh,
    MeshError,
    Variant,
    backend_id,
    parse_meshes,
)
from pytest_distrank.planning.spec import MarkerError, spec_of, variants
from pytest_distrank.settings import Settings

from .test_launch_plan import _rank_session, _settings

m = pytest.mark


class _Item:
    """What variants() and spec_of() read of an item: its markers (all its own), its stash, and
    the id's parameter (``variant``)."""

    def __init__(self, *marks: pytest.MarkDecorator, variant: Variant | None = None) -> None:
        self.own_markers = [mark.mark for mark in marks]
        self.stash = pytest.Stash()
        self.name = "test_x"
        self.nodeid = "test_x.py::test_x"
        if variant is not None:
            self.callspec = SimpleNamespace(marks=[], params={WS_PARAM: variant})

    def iter_markers(self, name: str) -> list[pytest.Mark]:
        return [mark for mark in self.own_markers if mark.name == name]

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return next(iter(self.iter_markers(name)), None)


def ids(*marks: pytest.MarkDecorator) -> list[str]:
    return [v.id for v in variants(cast(pytest.Item, _Item(*marks)), 2)]


def test_the_three_spellings_of_a_shape_are_the_same_mesh() -> None:
    dp2tp2 = Mesh((("dp", 2), ("tp", 2)))
    assert parse_meshes(m.mesh(dp=2, tp=2).mark) == (dp2tp2,)
    assert parse_meshes(m.mesh({"dp": 2, "tp": 2}, "dp4").mark) == (dp2tp2, Mesh((("dp", 4),)))
    assert parse_meshes(m.mesh("dp2-tp2").mark) == (dp2tp2,)
    assert (dp2tp2.id, dp2tp2.size, dp2tp2.names, dp2tp2.shape) == (
        "dp2-tp2",
        4,
        ("dp", "tp"),
        (2, 2),
    )


@pytest.mark.parametrize(
    ("marks", "expected"),
    [
        ((m.mesh(dp=2, tp=2),), ["ws4-dp2-tp2"]),
        ((m.mesh({"dp": 2, "tp": 2}, {"dp": 2}),), ["ws4-dp2-tp2", "ws2-dp2"]),
        ((m.mesh(dp=2, tp=2), m.world_size(4)), ["ws4-dp2-tp2"]),
        ((m.mesh(dp=2, tp=2), m.world_size(backend="gloo")), ["ws4-dp2-tp2"]),
        (
            (m.mesh(dp=2, tp=2), m.world_size(backend=("gloo", "nccl"))),
            ["ws4-dp2-tp2-gloo", "ws4-dp2-tp2-nccl"],
        ),
        ((m.world_size(2, 4, backend=("nccl",)),), ["ws2-nccl", "ws4-nccl"]),
        ((m.world_size(backend=("gloo", "cpu:gloo,cuda:nccl")),), ["ws2-gloo", "ws2-gloo+nccl"]),
        ((m.mesh(dp=8, tp=128), m.simulate("fake")), ["ws1024-dp8-tp128-fake"]),
        (
            (m.mesh(dp=8, tp=128), m.simulate("fake", ranks=(0, 1023))),
            ["ws1024-dp8-tp128-fake-r0", "ws1024-dp8-tp128-fake-r1023"],
        ),
        (
            (
                m.mesh({"dp": 2, "tp": 2}, {"dp": 8, "tp": 128}),
                m.world_size(4),
                m.simulate("fake", 1024),
            ),
            ["ws4-dp2-tp2", "ws1024-dp8-tp128-fake"],
        ),
        (
            (m.mesh(dp=2, tp=2), m.world_size(), m.simulate("local")),
            ["ws4-dp2-tp2", "ws4-dp2-tp2-local"],
        ),
        (
            (m.world_size(2, backend=("gloo", "nccl")), m.simulate("fake", 8)),
            ["ws2-gloo", "ws2-nccl", "ws8-fake"],
        ),
    ],
)
def test_how_ids_compose(marks: tuple[pytest.MarkDecorator, ...], expected: list[str]) -> None:
    """ws<N>, the mesh, a simulated world's mode and rank, the backend of a tuple."""
    assert ids(*marks) == expected


def test_a_mapping_backend_has_a_short_id() -> None:
    assert backend_id("cpu:gloo,cuda:nccl") == "gloo+nccl"
    assert backend_id("nccl") == "nccl"


@pytest.mark.parametrize(
    ("marks", "message"),
    [
        (
            (m.mesh(dp=0),),
            "@pytest.mark.mesh(dp=0): shape {'dp': 0}: dimension 'dp' has size 0, not a positive "
            "integer",
        ),
        ((m.mesh(dp=2, tp=-2),), "dimension 'tp' has size -2, not a positive integer"),
        ((m.mesh(dp=2.0),), "dimension 'dp' has size 2.0, not a positive integer"),
        ((m.mesh(dp=True),), "dimension 'dp' has size True, not a positive integer"),
        ((m.mesh("dp2-dp4"),), "shape 'dp2-dp4': dimension 'dp' given twice."),
        ((m.mesh("dp2", {"dp": 2}),), "shape dp2 given twice."),
        ((m.mesh("dp"),), "'dp' is not a dimension such as 'dp2'"),
        ((m.mesh({"d-p": 2}),), "dimension name 'd-p' is not a name of letters"),
        ((m.mesh({}),), "shape {} has no dimension."),
        ((m.mesh(),), "no shape; write e.g. @pytest.mark.mesh(dp=2, tp=2)."),
        ((m.mesh(4),), "shape 4 is not a dict of dimension sizes or a text"),
        ((m.mesh({"dp": 2}, tp=2),), "not both."),
        ((m.mesh(dp=2), m.mesh(dp=4)), "2 mesh markers on the test itself"),
        (
            (m.mesh(dp=2, tp=2), m.world_size(2)),
            "@pytest.mark.mesh(dp=2, tp=2) beside @pytest.mark.world_size(2): world size 2 fits "
            "no shape (dp2-tp2: 4 ranks).",
        ),
        (
            (m.mesh({"dp": 2}, {"dp": 4}), m.world_size(2)),
            "shape dp4 needs world size 4, which neither world_size nor simulate names",
        ),
        ((m.mesh(dp=2), m.simulate("fake", 8)), "simulated world size 8 fits no shape"),
        ((m.world_size(2, backend=()),), "backend=() names no backend"),
        ((m.world_size(2, backend=("gloo", "gloo")),), "backend 'gloo' given twice."),
        ((m.world_size(2, backend=("gloo", "glo")),), "unknown backend 'glo'; expected one of"),
        ((m.world_size(2, backend=("gloo", 3)),), "backend 3 is not a string."),
        (
            (m.mesh(dp=2), m.world_size(init_process_group=False)),
            "@pytest.mark.mesh beside @pytest.mark.world_size(init_process_group=False): the mesh",
        ),
    ],
)
def test_bad_input_is_an_error_of_the_test_naming_what_is_wrong(
    marks: tuple[pytest.MarkDecorator, ...], message: str
) -> None:
    with pytest.raises(MarkerError, match=re.escape(message)):
        spec_of(cast(pytest.Item, _Item(*marks)), 2, "gloo")


def test_the_spec_of_each_id() -> None:
    shape = Mesh((("dp", 2), ("tp", 2)))
    marks = (m.mesh(dp=2, tp=2), m.world_size(backend=("gloo", "nccl")))
    nccl = spec_of(
        cast(pytest.Item, _Item(*marks, variant=Variant(4, shape, None, "nccl"))), 2, "gloo"
    )
    assert nccl is not None
    assert (nccl.world_size, nccl.backend, nccl.mesh) == (4, "nccl", shape)
    plain = spec_of(cast(pytest.Item, _Item(m.mesh(dp=2, tp=2))), 2, "mpi")
    assert plain is not None and (plain.backend, plain.mesh) == ("mpi", shape)
    (sim,) = variants(cast(pytest.Item, _Item(m.mesh(dp=8, tp=128), m.simulate("fake"))), 2)
    spec = spec_of(
        cast(pytest.Item, _Item(m.mesh(dp=8, tp=128), m.simulate("fake"), variant=sim)), 2, "gloo"
    )
    assert spec is not None and spec.simulated is not None
    assert (spec.world_size, spec.backend, spec.simulated.size, spec.mesh) == (
        1,
        "fake",
        1024,
        Mesh((("dp", 8), ("tp", 128))),
    )


def _decide(item: _Item, world_size: int) -> Step:
    rs = cast(RankSession, _rank_session(world_size))
    return decide(rs, cast(Settings, _settings(None)), cast(pytest.Item, item))


def test_launcher_mode_runs_the_shapes_that_fit_and_skips_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "0")
    marker = m.mesh({"dp": 2, "tp": 2}, {"dp": 2})
    dp2tp2 = Variant(4, Mesh((("dp", 2), ("tp", 2))))
    dp2 = Variant(2, Mesh((("dp", 2),)))
    assert _decide(_Item(marker, variant=dp2tp2), 4) == Step("all", backend="gloo")
    # A smaller shape runs on a sub-world of the launched one (launch/subworld.py), a larger
    # one is skipped.
    assert _decide(_Item(marker, variant=dp2), 4) == Step("sub", backend="gloo", size=2)
    assert _decide(_Item(marker, variant=dp2tp2), 2) == Step(
        "skip", "mesh dp2-tp2 needs world_size 4, this launched world has 2 ranks (torchrun)"
    )


def test_an_ordinary_test_or_simulate_alone_is_not_this_modules() -> None:
    assert spec_of(cast(pytest.Item, _Item()), 2, "gloo") is None
    with pytest.raises(MeshError):  # the module's own error, before markers.py names the test
        parse_meshes(m.mesh(dp=0).mark)
