"""Resolved plugin settings, with where each value came from.

Runs in every pytest process of both modes: the controller and its pool ranks (which re-read the
user's command line), and every rank of a launched world. Precedence, lowest to highest: built-in
default < ini file < environment variable < command line < marker. The options themselves (flag,
ini key, variable, parser, help text) are :mod:`options`' table; every validation error names the
option, the bad value and where it came from.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Generic, TypeVar

import pytest

from .envvars import TEST_WAITS_ENV
from .options import (
    DEADLOCKS,
    FAILURE_GRACE,
    FRESH_RANKS,
    GPU_MEMORY_WAIT,
    LEFTOVERS,
    OPTIONS,
    ORDER,
    REPLAY_BUDGET,
    SEED,
    TIMEOUT,
    Option,
)
from .parsing import parse_order, parse_seconds, parse_seed

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Value(Generic[T]):
    """A resolved setting and a human description of where it came from."""

    value: T
    source: str


def _ini_source(config: pytest.Config, ini: str, raw: str) -> str:
    where = f"in {config.inipath.name}" if config.inipath else "from -o"
    return f"{ini} = {raw} ({where})"


def resolve(config: pytest.Config, option: Option[T], early: bool = False) -> Value[T]:
    """Resolve one option: default < ini < environment < command line (``early``: before
    pytest parsed the command line, from what its first pass knew)."""
    raw: Any = (
        getattr(config.known_args_namespace, option.dest, None)
        if early
        else config.getoption(option.dest)
    )
    if raw is not None and raw is not False:
        text = "true" if raw is True else str(raw)
        source = option.flag if raw is True else f"{option.flag}={raw}"
        return _parse(option, text, f"{source} (command line)")
    env = os.environ.get(option.env)
    if env is not None and env != "":
        return _parse(option, env, f"{option.env}={env} (environment)")
    ini = config.getini(option.ini)
    if ini not in ("", None):
        return _parse(option, str(ini), _ini_source(config, option.ini, str(ini)))
    seam = os.environ.get(TEST_WAITS_ENV, "")
    if option.dest == FAILURE_GRACE.dest and seam:
        return _parse(option, seam, f"{TEST_WAITS_ENV}={seam} (test seam)")
    return Value(option.parse(option.default), "default")


def _parse(option: Option[T], text: str, source: str) -> Value[T]:
    try:
        return Value(option.parse(text), source)
    except ValueError as exc:
        raise pytest.UsageError(
            f"pytest-distrank: invalid value {text!r} for {option.flag} "
            f"(ini: {option.ini}, env: {option.env}), from {source}:\n  {exc}"
        ) from None


@dataclasses.dataclass(frozen=True)
class Settings:
    """The session-wide settings of the controller."""

    world_size: Value[int]
    backend: Value[str]
    start_method: Value[str]
    isolate: Value[bool]
    timeout: Value[float]
    failure_grace: Value[float]
    preload: Value[tuple[str, ...]]
    gpu_lock_dir: Value[str]
    gpu_wait: Value[float]
    gpu_oversubscribe: Value[bool]
    gpu_fallback: Value[str]
    cuda_growth: Value[int]
    debug_rank: Value[int | None]
    seed: Value[int | str | None] = Value(parse_seed(SEED.default), "default")
    leftovers: Value[str] = Value(LEFTOVERS.default, "default")
    deadlocks: Value[str] = Value(DEADLOCKS.default, "default")
    fresh_ranks: Value[str] = Value(FRESH_RANKS.default, "default")
    replay: Value[bool] = Value(True, "default")
    replay_budget: Value[float] = Value(parse_seconds(REPLAY_BUDGET.default), "default")
    order: Value[tuple[str, int | None]] = Value(parse_order(ORDER.default), "default")
    gpu_memory_wait: Value[float] = Value(parse_seconds(GPU_MEMORY_WAIT.default), "default")

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        """Each field from its option (in field order); the timeout by :func:`_resolve_timeout`."""
        by_field = {option.dest.removeprefix("distrank_"): option for option in OPTIONS}
        values: dict[str, Any] = {
            f.name: _resolve_timeout(config)
            if f.name == "timeout"
            else resolve(config, by_field[f.name])
            for f in dataclasses.fields(cls)
        }
        return cls(**values)


def _resolve_timeout(config: pytest.Config) -> Value[float]:
    """The session deadline, ours and pytest-timeout's settings interleaved.

    --distrank-timeout > --timeout > DISTRANK_TIMEOUT > PYTEST_TIMEOUT > ini distrank_timeout >
    ini timeout > 300 s.
    """
    has_timeout_plugin = config.pluginmanager.hasplugin("timeout")
    own_cli = config.getoption(TIMEOUT.dest)
    if own_cli is not None:
        return _parse(TIMEOUT, str(own_cli), f"{TIMEOUT.flag}={own_cli} (command line)")
    if has_timeout_plugin:
        cli = config.getoption("timeout", None)
        if cli is not None:
            return _parse(TIMEOUT, str(cli), f"--timeout={cli} (pytest-timeout, command line)")
    for env in (TIMEOUT.env, "PYTEST_TIMEOUT" if has_timeout_plugin else ""):
        raw = os.environ.get(env) if env else None
        if raw:
            return _parse(TIMEOUT, raw, f"{env}={raw} (environment)")
    for ini in (TIMEOUT.ini, "timeout" if has_timeout_plugin else ""):
        raw = config.getini(ini) if ini else None
        if raw not in ("", None):
            return _parse(TIMEOUT, str(raw), _ini_source(config, ini, str(raw)))
    return Value(TIMEOUT.parse(TIMEOUT.default), "default")


def item_timeout(item: pytest.Item, session_timeout: Value[float]) -> Value[float]:
    """The deadline of one distributed test: ``@pytest.mark.timeout(N)`` beats the session's."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        raw = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
        if raw is not None:
            try:
                return Value(parse_seconds(str(raw)), f"@pytest.mark.timeout({raw})")
            except ValueError as exc:
                raise ValueError(f"@pytest.mark.timeout({raw!r}): {exc}") from None
    return session_timeout
