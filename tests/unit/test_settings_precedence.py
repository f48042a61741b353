"""Unit tests of option precedence (settings.py): default < ini < environment < command line <
marker, each value with the source it names; and huge deadlines, from any source, mean none.

The end-to-end tests keep one run per behaviour (tests/e2e/test_errors.py: the header of a
session and the world size its ranks get; tests/e2e/test_honest.py: a huge deadline from each
source passes a test).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import cast

import pytest

from pytest_distrank.outcome.endgame import MAX_WAIT, clamp_wait, effective_timeout
from pytest_distrank.settings import Settings, Value, item_timeout

#: ``settings(*ARGS)``: the settings of a session started with ``pytest -p distrank ARGS`` here.
SettingsOf = Callable[..., Settings]


@pytest.fixture
def settings(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> SettingsOf:
    for name in ("DISTRANK_WORLD_SIZE", "DISTRANK_TIMEOUT", "PYTEST_TIMEOUT", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)

    def of(*args: str) -> Settings:
        return Settings.from_config(pytester.parseconfig("-p", "distrank", *args))

    return of


def _pair(value: Value[int] | Value[float]) -> tuple[float, str]:
    return value.value, value.source


def test_world_size_command_line_beats_environment_beats_ini(
    settings: SettingsOf, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _pair(settings().world_size) == (2, "default")
    pytester.makeini("[pytest]\ndistrank_world_size = 4\n")
    assert _pair(settings().world_size) == (4, "distrank_world_size = 4 (in tox.ini)")
    monkeypatch.setenv("DISTRANK_WORLD_SIZE", "3")
    assert _pair(settings().world_size) == (3, "DISTRANK_WORLD_SIZE=3 (environment)")
    world_size = settings("--distrank-world-size=2").world_size
    assert _pair(world_size) == (2, "--distrank-world-size=2 (command line)")


def test_deadline_ours_and_pytest_timeouts_interleaved(
    settings: SettingsOf, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--distrank-timeout > --timeout > DISTRANK_TIMEOUT > PYTEST_TIMEOUT > ini
    distrank_timeout > ini timeout > 300 s."""
    assert _pair(settings().timeout) == (300, "default")
    pytester.makeini("[pytest]\ntimeout = 60\n")
    assert _pair(settings().timeout) == (60, "timeout = 60 (in tox.ini)")
    pytester.makeini("[pytest]\ntimeout = 60\ndistrank_timeout = 50\n")
    assert _pair(settings().timeout) == (50, "distrank_timeout = 50 (in tox.ini)")
    monkeypatch.setenv("PYTEST_TIMEOUT", "40")
    assert _pair(settings().timeout) == (40, "PYTEST_TIMEOUT=40 (environment)")
    monkeypatch.setenv("DISTRANK_TIMEOUT", "30")
    assert _pair(settings().timeout) == (30, "DISTRANK_TIMEOUT=30 (environment)")
    timeout = settings("--timeout=7").timeout
    assert _pair(timeout) == (7, "--timeout=7.0 (pytest-timeout, command line)")
    timeout = settings("--timeout=7", "--distrank-timeout=5").timeout
    assert _pair(timeout) == (5, "--distrank-timeout=5 (command line)")


def _marked(*args: object) -> pytest.Item:
    """An item whose closest ``timeout`` marker has ``args``."""
    mark = pytest.mark.timeout(*args).mark
    return cast(pytest.Item, SimpleNamespace(get_closest_marker=lambda name: mark))


def test_a_timeout_marker_beats_the_session_deadline() -> None:
    session = Value(300.0, "default")
    assert _pair(item_timeout(_marked(4), session)) == (4, "@pytest.mark.timeout(4)")
    unmarked = cast(pytest.Item, SimpleNamespace(get_closest_marker=lambda name: None))
    assert item_timeout(unmarked, session) is session
    with pytest.raises(ValueError, match=r"^@pytest.mark.timeout\(-1\): expected a number"):
        item_timeout(_marked(-1), session)


def test_huge_deadlines_from_every_source_mean_none(
    settings: SettingsOf, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DISTRANK_TIMEOUT=inf and --distrank-timeout=1e308 are beyond a year: no deadline.
    pytest-timeout's --timeout=3000000 (35 days) and a marker of 10**7 s (116 days) are
    deadlines, but no single wait for them overflows a timer: each is cut to a day."""
    monkeypatch.setenv("DISTRANK_TIMEOUT", "inf")
    assert effective_timeout(settings().timeout.value) is None
    monkeypatch.delenv("DISTRANK_TIMEOUT")
    assert effective_timeout(settings("--distrank-timeout=1e308").timeout.value) is None
    marker = item_timeout(_marked(10**7), Value(300.0, "default")).value
    pytest_timeout = settings("--timeout=3000000").timeout.value
    for seconds in (marker, pytest_timeout):
        assert effective_timeout(seconds) == seconds
        assert clamp_wait(seconds) == MAX_WAIT
