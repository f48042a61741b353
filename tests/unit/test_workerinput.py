"""Unit tests of what ranks get of other plugins (pool/workerinput.py): pure logic over a real
plugin manager with pytest-xdist's node hook."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pluggy
import pytest

from pytest_distrank import _compat
from pytest_distrank.pool.workerinput import RankInputs, rank_worker_id, xdist_environ

hookspec = pluggy.HookspecMarker("pytest")


class XdistSpec:
    @hookspec
    def pytest_configure_node(self, node: Any) -> None:
        """pytest-xdist's hook, as xdist declares it."""


class Randomly:
    """As pytest-randomly: hands its settled seed to each worker."""

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["randomly_seed"] = node.config.option.randomly_seed


class Roots:
    """As pytest-cov's DistMaster: reads the node's manager and gateway."""

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["roots"] = [str(r) for r in node.nodemanager.roots]
        node.workerinput["gateway"] = node.gateway.id


class Broken:
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["half"] = 1
        raise KeyError("sock_port")


class NotData:
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["handle"] = object()


class Cov:
    def pytest_configure_node(self, node: Any) -> None:
        raise AssertionError("pytest-cov's node hook is never called for ranks")


def config(*plugins: tuple[str, object], xdist: bool = True, **attrs: Any) -> pytest.Config:
    pm = pytest.PytestPluginManager()  # takes unmarked pytest_* methods, as pytest does
    if xdist:
        pm.add_hookspecs(XdistSpec)
    for name, plugin in plugins:
        pm.register(plugin, name)
    fake = SimpleNamespace(hook=pm.hook, pluginmanager=pm, option=SimpleNamespace(), **attrs)
    fake.option.randomly_seed = 1234
    return cast(pytest.Config, fake)


def test_ranks_get_what_each_plugins_node_hook_adds_and_xdists_keys() -> None:
    notes: list[str] = []
    plugins = [("randomly", Randomly()), ("roots", Roots()), ("broken", Broken())]
    inputs = RankInputs(config(*plugins, ("notdata", NotData()), ("_cov", Cov())), notes)
    first = inputs.for_rank(1, 0)
    second = inputs.for_rank(1, 1)
    assert first["workerid"] == "distrank-pool1-rank0"
    assert second["workerid"] == "distrank-pool1-rank1"
    assert first["testrunuid"] == second["testrunuid"] and len(first["testrunuid"]) == 32
    assert first["workercount"] == 1 and isinstance(first["mainargv"], list)
    assert first["randomly_seed"] == 1234
    assert first["roots"] == [] and first["gateway"] == "distrank-pool1-rank0"
    assert first["half"] == 1  # what a hook wrote before it raised stays; the note says it failed
    assert "handle" not in first
    assert notes == [
        "pytest_configure_node of plugin 'broken' failed in the controller (KeyError('sock_port')):"
        " what it adds to config.workerinput does not reach ranks",
        "config.workerinput['handle'] (from plugin 'notdata') is not JSON data (object): ranks "
        "do not get it",
    ]  # each once, however many ranks


def test_under_xdist_ranks_get_the_controllers_own_workerinput() -> None:
    own = {"workerid": "gw1", "workercount": 2, "testrunuid": "abc", "mainargv": ["pytest"]}
    own["randomly_seed"] = 99
    inputs = RankInputs(config(("broken", Broken()), workerinput=own), [])
    rank = inputs.for_rank(2, 1)
    assert rank == {**own, "workerid": "gw1-pool2-rank1"}  # no node hook called again
    assert own["workerid"] == "gw1"


def test_randomly_seed_is_handed_over_without_xdist() -> None:
    """pytest-randomly registers its node hook only under xdist, yet reads the key whenever
    config.workerinput exists."""

    class Plain:
        pass

    inputs = RankInputs(config(("randomly", Plain()), xdist=False), [])
    assert inputs.for_rank(1, 0)["randomly_seed"] == 1234
    assert "randomly_seed" not in RankInputs(config(xdist=False), []).for_rank(1, 0)


def test_xdist_environment_follows_the_workerinput() -> None:
    assert rank_worker_id("gw3", 4, 1) == "gw3-pool4-rank1"
    assert xdist_environ({"workerid": "w", "testrunuid": "u", "workercount": 3}) == {
        "PYTEST_XDIST_WORKER": "w",
        "PYTEST_XDIST_TESTRUNUID": "u",
        "PYTEST_XDIST_WORKER_COUNT": "3",
    }
    assert xdist_environ({}) == {}


def test_ranks_keep_no_rerun_counts_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's pytest-rerunfailures gets its no-op status db instead of a client of the
    controller's server (a socket per rank process, never closed in 14.x)."""
    rerunfailures = pytest.importorskip("pytest_rerunfailures")
    monkeypatch.setattr(rerunfailures, "ClientStatusDB", rerunfailures.ClientStatusDB)
    _compat.keep_rerun_counts_out_of_ranks()
    db = rerunfailures.ClientStatusDB(1, "token")  # port 1: a real client would fail to connect
    assert isinstance(db, rerunfailures.StatusDB) and not hasattr(db, "sock")
