"""Unit tests of fixtures at another world size (planning/crossize.py, pool/crossize.py): the
decorator, what a bad world size says, which producers an item requests, launcher mode's skip
(launch/plan.py), a producer's outcome from its reports, and the xdist lock: once per run."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pytest import TestReport

from pytest_distrank import _compat
from pytest_distrank import fixture as distrank_fixture
from pytest_distrank.launch.plan import Step
from pytest_distrank.outcome.reports import synthesized_failure
from pytest_distrank.planning import crossize
from pytest_distrank.planning.crossize import PRODUCER_ATTR, Producer, launcher_step
from pytest_distrank.pool.crossize import CrossSize, Outcome, judge
from pytest_distrank.settings import Value

from .test_meshes import _decide


def produce(rank: int, fixture_path: Path) -> None:
    """A producer's function: never run here."""


def producer(world_size: Any = 4, backend: Any = None) -> Producer:
    return Producer("produce", produce, world_size, backend)


# -- the decorator -----------------------------------------------------------------------------


def test_the_decorator_registers_a_session_fixture_of_the_functions_name() -> None:
    made = distrank_fixture(world_size=4)(produce)
    if hasattr(made, "_get_wrapped_function"):  # pytest >= 8.4: a FixtureFunctionDefinition
        assert (made.name, made._fixture_function_marker.scope) == ("produce", "session")
        function = made._get_wrapped_function()
    else:  # older pytest: the function, marked
        marker = made._pytestfixturefunction
        assert (marker.name, marker.scope) == ("produce", "session")
        function = made
    found = getattr(function, PRODUCER_ATTR)
    assert (found.name, found.func, found.world_size) == ("produce", produce, 4)
    assert found.key == f"{__file__}:{__name__}.produce"
    assert found.folder_name.startswith("produce-") and len(found.folder_name) == 16


@pytest.mark.parametrize("call", [lambda: distrank_fixture(produce), lambda: distrank_fixture()])
def test_the_world_size_is_a_keyword_and_required(call: Any) -> None:
    with pytest.raises(TypeError, match=r"write @pytest_distrank.fixture\(world_size=4\)"):
        call()


@pytest.mark.parametrize("size", [0, -2, True, "4", 2.0, None, [4]])
def test_a_world_size_that_is_not_a_positive_int_names_the_fixture_and_the_value(
    size: Any,
) -> None:
    assert producer(size).problem() == (
        f"fixture 'produce': pytest_distrank.fixture(world_size={size!r}): world size "
        f"{size!r} is not a positive integer; write e.g. pytest_distrank.fixture(world_size=4)."
    )


def test_a_bad_backend_is_named() -> None:
    problem = producer(2, backend="glo").problem()
    assert problem is not None
    assert problem.startswith(
        "fixture 'produce': pytest_distrank.fixture(world_size=2, backend='glo'): unknown backend"
    )
    assert producer(2, backend=3).problem() is not None
    assert producer(2, backend="gloo").problem() is None
    assert producer(1).problem() is None


# -- which producers an item requests ----------------------------------------------------------


class _Item:
    """What producers_of() reads: the resolved fixtures (through _compat.fixture_info); and
    what decide() reads: a ``world_size(2)`` marker, a stash."""

    def __init__(self, *defs: tuple[str, Any]) -> None:
        self.nodeid = "test_x.py::test_x"
        self.name = "test_x"
        self.stash = pytest.Stash()
        self.own_markers = [pytest.mark.world_size(2).mark]
        self.info = SimpleNamespace(
            names_closure=[name for name, _ in defs],
            name2fixturedefs={name: [SimpleNamespace(func=func)] for name, func in defs},
        )

    def iter_markers(self, name: str) -> list[pytest.Mark]:
        return [mark for mark in self.own_markers if mark.name == name]

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return next(iter(self.iter_markers(name)), None)


@pytest.fixture(autouse=True)
def _fixture_info(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_compat, "fixture_info", lambda item: getattr(item, "info", None))


def registered(p: Producer) -> Any:
    def function() -> None:
        pass

    setattr(function, PRODUCER_ATTR, p)
    return function


def test_an_item_requests_the_producers_in_its_closure_once_each_in_order() -> None:
    a, b = producer(4), producer(2)
    item = _Item(
        ("rank", produce), ("b", registered(b)), ("a", registered(a)), ("a2", registered(a))
    )
    assert crossize.producers_of(cast(pytest.Item, item)) == [b, a]
    assert crossize.producers_of(cast(pytest.Item, _Item(("rank", produce)))) == []


# -- launcher mode -----------------------------------------------------------------------------


def test_launcher_mode_skips_a_test_whose_fixture_needs_another_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISTRANK_FAKE_GPU_COUNT", "0")
    item = _Item(("produce", registered(producer(4))))
    assert _decide(cast(Any, item), 2) == Step(
        "skip",
        "fixture 'produce' (world size 4) needs world_size 4, this launched world has 2 ranks "
        "(torchrun); run it in pool mode (pytest without a launcher)",
    )
    same = _decide(cast(Any, item), 4)
    assert same.kind == "skip" and "runs on ranks of its own, in pool mode only" in same.reason
    assert same.reason.endswith("this launched world has 4 ranks (torchrun)")


def test_launcher_mode_errors_a_bad_world_size_and_ignores_tests_without_one() -> None:
    bad = _Item(("produce", registered(producer(0))))
    kind, reason = launcher_step(cast(pytest.Item, bad), 2, "torchrun") or ("", "")
    assert kind == "error" and reason.startswith("test_x.py::test_x: fixture 'produce': ")
    assert launcher_step(cast(pytest.Item, _Item(("rank", produce))), 2, "torchrun") is None


# -- the controller: outcomes and the xdist lock -----------------------------------------------


def _report(outcome: Any, when: Any = "call", longrepr: Any = None) -> TestReport:
    return TestReport(
        "t.py::produce[distrank-fixture]", ("t.py", 1, "p"), {}, outcome, longrepr, when
    )


def test_a_passing_producer_passes_and_a_skipped_one_says_why() -> None:
    p = producer(4)
    assert judge(p, [_report("passed", "setup"), _report("passed")], "/f", "t.py::t").kind == (
        "passed"
    )
    skipped = judge(p, [_report("skipped", "setup", ("t.py", 2, "Skipped: no data"))], "/f", "t")
    assert (skipped.kind, skipped.text) == (
        "skipped",
        "fixture 'produce' (world size 4) was skipped: no data",
    )


def test_a_failing_producer_names_itself_its_phase_its_first_user_and_what_to_do() -> None:
    failed = synthesized_failure(
        "t.py::produce[distrank-fixture]",
        ("t.py", 1, "p"),
        "call",
        "[rank 1/4] AssertionError: no",
        "rank 1/4 failed here",
        note="",
    )
    cast(Any, failed.longrepr).addsection("distrank: rerun just this test", "pytest t.py::produce")
    outcome = judge(producer(4), [_report("passed", "setup"), failed], "/f", "t.py::test_a")
    assert outcome.kind == "failed"
    lines = outcome.text.splitlines()
    assert lines[0] == (
        "fixture 'produce' (world size 4) failed in its call: [rank 1/4] AssertionError: no"
    )
    assert lines[1].startswith("It ran once, before t.py::test_a, on 4 ranks of its own;")
    assert lines[2].startswith("What to do: fix 'produce'")
    assert "rank 1/4 failed here" in outcome.text
    assert "rerun just this test" not in outcome.text  # a producer is rerun through its users


def _cross_size(tmp_path: Path, run_id: str | None) -> CrossSize:
    config = SimpleNamespace(stash=pytest.Stash())
    if run_id is not None:
        config.workerinput = {"testrunuid": run_id}
    return CrossSize(
        cast(pytest.Config, config), Value(300.0, "default"), "gloo", cast(Any, None), _none, []
    )


def _none(*args: Any) -> list[TestReport]:
    raise AssertionError("no producer runs here")


def test_under_xdist_a_producer_runs_once_per_run_behind_a_lock(tmp_path: Path) -> None:
    runs: list[str] = []

    def run() -> Outcome:
        runs.append("ran")
        return Outcome("failed", str(tmp_path / "f"), "it broke", 1.5)

    folder = tmp_path / "produce-12345678"
    first = _cross_size(tmp_path, "run1")._once_per_run(producer(), folder, 10.0, run)
    assert (first.kind, first.text, first.worker) == ("failed", "it broke", "")
    # Another worker of the same run: the outcome, read from beside the folder, not a second run.
    second = _cross_size(tmp_path, "run1")._once_per_run(producer(), folder, 10.0, run)
    assert (second.kind, second.text, runs) == ("failed", "it broke", ["ran"])
    assert second.worker.startswith("xdist worker ")
    data = json.loads((tmp_path / "produce-12345678.json").read_text())
    assert data["run"] == "run1"
    # An outcome of another run (a reused --basetemp) does not count.
    _cross_size(tmp_path, "run2")._once_per_run(producer(), folder, 10.0, run)
    assert runs == ["ran", "ran"]


def test_without_xdist_it_just_runs(tmp_path: Path) -> None:
    outcome = _cross_size(tmp_path, None)._once_per_run(
        producer(), tmp_path / "f", 10.0, lambda: Outcome("passed", "/f")
    )
    assert outcome.kind == "passed" and not list(tmp_path.iterdir())


def test_a_bad_producer_fails_once_without_running_and_a_cycle_is_named(tmp_path: Path) -> None:
    cs = _cross_size(tmp_path, None)
    item = cast(pytest.Item, SimpleNamespace(nodeid="t.py::t"))
    zero = producer(0)
    outcome = cs.ensure(zero, item)
    assert outcome.kind == "failed" and "world size 0 is not a positive integer" in outcome.text
    assert cs.ensure(zero, item) is outcome  # cached: one verdict for every test
    huge = cs.ensure(producer(10**6), item)
    assert "cannot run: world size 1000000 needs 1000000 rank processes" in huge.text
    looping = producer(2)
    cs.running.append(looping)
    assert cs.ensure(looping, item).text == (
        "fixture 'produce' (world size 2) requests itself: produce -> produce."
    )


def test_two_conftests_producers_of_one_name_get_two_folders() -> None:
    """Two folders' conftest.py files both import as ``conftest``: the file tells them apart."""
    made = []
    for path in ("a/conftest.py", "b/conftest.py"):
        space: dict[str, Any] = {"__name__": "conftest"}
        exec(compile("def data(fixture_path):\n    pass\n", path, "exec"), space)
        made.append(Producer("data", space["data"], 2))
    assert made[0].key != made[1].key
    assert made[0].folder_name != made[1].folder_name
