"""When pytest forks the fork server from itself as it starts (pool/pools/earlyfork.py)."""

from __future__ import annotations

import types

import pytest

from pytest_distrank.pool.pools.earlyfork import NO_TESTS, wanted


def config(plugins: tuple[object, ...] = (), **options: object) -> pytest.Config:
    ns = types.SimpleNamespace(plugins=["distrank"], **options)
    fake = types.SimpleNamespace(
        known_args_namespace=ns, invocation_params=types.SimpleNamespace(plugins=plugins)
    )
    return fake  # type: ignore[return-value]


def test_forked_early_when_the_plugin_is_named_and_this_process_runs_ranks() -> None:
    assert wanted(config(), "forkserver", launched=False)


@pytest.mark.parametrize("method", ["forkserver-late", "spawn"])
def test_not_for_other_start_methods(method: str) -> None:
    assert not wanted(config(), method, launched=False)


def test_not_in_a_launched_rank() -> None:
    assert not wanted(config(), "forkserver", launched=True)


def test_not_when_the_plugin_is_only_installed() -> None:
    """An installed plugin is loaded by every pytest run: it does not import torch into them."""
    plain = config()
    plain.known_args_namespace.plugins = []
    assert not wanted(plain, "forkserver", launched=False)
    by_module = config()
    by_module.known_args_namespace.plugins = ["pytest_distrank.plugin"]
    assert wanted(by_module, "forkserver", launched=False)


def test_not_in_a_session_handed_plugins() -> None:
    """A rank's own session, or pytest run in-process inside a test."""
    assert not wanted(config(plugins=(object(),)), "forkserver", launched=False)


@pytest.mark.parametrize("dest", NO_TESTS)
def test_not_in_a_session_that_runs_no_test(dest: str) -> None:
    session = config()
    setattr(session.known_args_namespace, dest, True)
    assert not wanted(session, "forkserver", launched=False)


def test_not_in_xdists_controller_but_in_its_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert not wanted(config(numprocesses=2), "forkserver", launched=False)
    assert not wanted(config(tx=["popen"]), "forkserver", launched=False)
    assert wanted(config(numprocesses=0), "forkserver", launched=False)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert wanted(config(numprocesses=2), "forkserver", launched=False)


def test_not_in_a_pytest_main_inside_a_test_of_a_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process runs a test of a session of its own: forking it would copy that test."""
    from pytest_distrank.pool.pools import earlyfork

    monkeypatch.setattr(earlyfork, "open_sessions", [object()])
    assert not wanted(config(), "forkserver", launched=False)
