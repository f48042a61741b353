"""Unit tests of how pool mode reads DeepSpeed's ``DistributedTest`` harness (_compat/deepspeed.py):
which classes are its, the world size its ``__call__`` would launch, the stand-ins put on a class
for one test, and DeepSpeed's communication state put back as imported. Against stand-ins of the
harness's classes and of DeepSpeed's modules (DeepSpeed is not installed here); the end-to-end
tests are in tests/e2e/test_deepspeed_suites.py."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from pytest_distrank import _compat


class DistributedExec:
    world_size: Any = 2

    def _dist_run(self) -> None: ...

    def _launch_daemonic_procs(self) -> str:
        return "base"

    def _launch_non_daemonic_procs(self) -> None: ...

    def _launch_with_file_store(self) -> str:
        return "base"


class DistributedTest(DistributedExec):
    is_dist_test = True


class Sized(DistributedTest):
    world_size: Any = [4]  # noqa: RUF012 (as DeepSpeed writes it)

    def test(self) -> None: ...

    def test_sized(self, world_size: int) -> None: ...

    @pytest.mark.world_size(1)
    def test_marked(self) -> None: ...


class OwnLauncher(DistributedTest):
    def _launch_with_file_store(self) -> str:
        return "own"


def test_its_classes_are_found_by_the_base_and_the_flag() -> None:
    assert _compat.ds_harness_base(Sized) is DistributedExec
    assert _compat.ds_harness_base(DistributedExec) is None  # not a test (no is_dist_test)
    assert _compat.ds_harness_base(object) is None
    assert _compat.ds_harness_base(None) is None
    # a base of that name without the methods pool mode stands in for: not taken over
    lookalike = type("DistributedExec", (), {"_dist_run": lambda self: None})
    assert _compat.ds_harness_base(type("T", (lookalike,), {"is_dist_test": True})) is None


def test_the_world_size_is_read_as_its_call_reads_it() -> None:
    assert _compat.ds_requested_size(Sized, Sized.test, {}) == [4]
    assert _compat.ds_requested_size(Sized, Sized.test_marked, {}) == 1
    assert _compat.ds_requested_size(Sized, Sized.test_sized, {"world_size": 3}) == 3
    # a world_size fixture: not known before the test runs
    assert _compat.ds_requested_size(Sized, Sized.test_sized, {}) is None


def test_stand_ins_go_where_the_class_has_the_harnesss_own_and_come_off() -> None:
    undo = _compat.ds_stand_in(
        OwnLauncher,
        DistributedExec,
        {
            "_launch_with_file_store": lambda self: "stand-in",
            "_launch_daemonic_procs": lambda self: "stand-in",
        },
    )
    test = OwnLauncher()
    assert test._launch_with_file_store() == "own"  # its override stays
    assert test._launch_daemonic_procs() == "stand-in"
    assert DistributedTest()._launch_daemonic_procs() == "base"  # only on the class given
    undo()
    assert test._launch_daemonic_procs() == "base"
    assert "_launch_daemonic_procs" not in vars(OwnLauncher)


def test_deepspeeds_communication_state_comes_back_as_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    comm: Any = types.ModuleType("deepspeed.comm.comm")
    comm.cdb = None
    comm.log = print  # not plain data: left alone
    groups: Any = types.ModuleType("deepspeed.utils.groups")
    groups._EXPERT_PARALLEL_GROUP = {}
    monkeypatch.setitem(sys.modules, "deepspeed.comm.comm", comm)
    monkeypatch.setitem(sys.modules, "deepspeed.utils.groups", groups)
    fresh = _compat.ds_state()
    assert fresh == {
        "deepspeed.comm.comm": {"cdb": None},
        "deepspeed.utils.groups": {"_EXPERT_PARALLEL_GROUP": {}},
    }
    comm.cdb = "backend of the last test"
    comm.log = len
    groups._EXPERT_PARALLEL_GROUP["ep_size_2"] = "a destroyed group"
    _compat.ds_restore_state(fresh)
    assert comm.cdb is None
    assert comm.log is len
    assert groups._EXPERT_PARALLEL_GROUP == {}
    groups._EXPERT_PARALLEL_GROUP["x"] = 1
    assert fresh["deepspeed.utils.groups"]["_EXPERT_PARALLEL_GROUP"] == {}  # a copy each time


def test_the_state_of_modules_not_imported_is_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _compat.DS_STATE_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert _compat.ds_state() == {}
    _compat.ds_restore_state({"deepspeed.comm.comm": {"cdb": None}})  # nothing to put back
