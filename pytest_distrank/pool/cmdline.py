"""The command line of a rank's own pytest session, built by the controller.

Runs in the controller. A rank re-reads the user's command line, as a pytest-xdist worker does
(xdist sends ``config.invocation_params.args`` and overrides what the worker must own): the
controller's ini ``addopts``, ``PYTEST_ADDOPTS`` and ``invocation_params.args``, in pytest's order,
so that options a conftest.py adds, ``--runxfail``, ``--setup-plan``, ``-p`` plugins and ``-W``
filters reach every rank. From that list the controller strips what a rank must not take:

- test selection and positional arguments (files, node ids, ``-k``, ``-m``, ``--lf``,
  ``--deselect`` ...): a rank collects the files of its pool and serves the node ids the
  controller planned;
- what a rank owns or must not do: ``-x``/``--maxfail``, ``--junitxml``, ``--pdb``/``--trace``,
  the cache and stepwise, ``--basetemp``, ``--rootdir``, ``-c``, ``--log-file``, ``--co`` and the
  other modes that run no test, the session deadline, and every option of pytest-xdist,
  pytest-cov (worker/main.py measures ranks itself), pytest-rerunfailures and this plugin;

then adds its own: the pool's files first, the plugin under the name the controller loaded it by
(``-p distrank`` when the entry point loaded it, as pytest refuses a second name for a registered
plugin; ``-p pytest_distrank.plugin`` when a checkout on PYTHONPATH did), no cache provider, the
controller's rootdir and ini file (so node ids match), a basetemp per rank, ``--verbosity`` as the
controller ended up with it (an int: a conftest may set ``config.option.verbose = True``), ``-o
addopts=`` (the ini's addopts were forwarded, filtered, above) and, last so that it wins over the
user's ``-W error``, the filter for the one warning the fork server causes.

How options are recognised: the walk below reads each argument with the controller's own argparse
parser (:func:`_compat.argparse_parser`), which knows every option pytest, the plugins and the
initial conftests added, with its ``dest`` and ``nargs``. So ``--opt=v``, ``--opt v``, ``-n2``,
``-n 2`` and clusters such as ``-xvs`` read as argparse read them, and a conftest's option is
forwarded with its value instead of its value being taken for a file. Re-parsing into a namespace
would lose the order and the spelling; a hand-written list of flags would miss every option nobody
listed.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from .. import _compat

#: The fork server imported the plugin before the rank's pytest session could mark it for
#: assertion rewriting; that warning must not become an error under filterwarnings=error or -W
#: error. It goes last: of Python's warning filters, the one given last wins.
REWRITE_WARNING_FILTER = (
    "ignore:Module already imported so cannot be rewritten:pytest.PytestAssertRewriteWarning"
)

#: Options (by ``dest``) dropped from the controller's command line, with their values.
STRIPPED_DESTS = frozenset(
    {
        # Selection: the controller selected; a rank serves the node ids it planned.
        "keyword", "markexpr", "deselect", "ignore", "ignore_glob", "pyargs",
        "lf", "failedfirst", "newfirst", "last_failed_no_failures",
        "stepwise", "stepwise_skip", "stepwise_reset",
        # What a rank owns (the controller decides, reports, debugs), sets itself or must not do.
        "maxfail", "xmlpath", "junitprefix", "usepdb", "usepdb_cls", "trace",
        "cacheshow", "cacheclear", "basetemp", "rootdir", "inifilename", "verbose",
        "continue_on_collection_errors", "debug", "log_file", "pastebin", "session_timeout",
        # Modes that run no test: the controller runs none in them either.
        "collectonly", "help", "version", "markers", "showfixtures", "show_fixtures_per_test",
    }
)  # fmt: skip
#: Option groups (``parser.getgroup`` names) of plugins whose work the controller does for its
#: ranks: pytest-xdist, pytest-cov, pytest-rerunfailures, and this plugin's own ``--distrank-*``.
STRIPPED_GROUPS = frozenset({"xdist", "cov", "rerunfailures", "distrank"})

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def rank_pytest_args(config: pytest.Config, files: list[str], basetemp: Path) -> list[str]:
    """Arguments for ``pytest.main`` in a rank that serves tests from ``files``."""
    plugin_name = _plugin_name(config)
    args = [*files, "-p", plugin_name, "-p", "no:cacheprovider"]
    args += [f"--rootdir={config.rootpath}", f"--basetemp={basetemp}"]
    if config.inipath is not None:
        args.append(f"-c={config.inipath}")
    args += forwarded_args(config, skip_plugins={plugin_name})
    args += [
        "--continue-on-collection-errors",
        # The rank renders its failures: it must do so as verbosely as the controller does.
        f"--verbosity={_as_int(getattr(config.option, 'verbose', 0))}",
        "-o",
        "addopts=",
        "-o",
        "log_file=",  # an ini log_file would be truncated and rewritten by every rank
        "-W",
        REWRITE_WARNING_FILTER,
    ]
    return args


def forwarded_args(
    config: pytest.Config, skip_plugins: set[str] | frozenset[str] = frozenset()
) -> list[str]:
    """The controller's options as pytest read them (ini ``addopts``, ``PYTEST_ADDOPTS``, the
    command line), less positional arguments and what a rank must not take (see the module)."""
    parser = _compat.argparse_parser(config)
    actions = _compat.option_actions(parser)
    stripped = set(STRIPPED_DESTS)
    for group in _compat.option_groups(config):
        if group.name in STRIPPED_GROUPS:
            stripped.update(option.dest for option in group.options)
    given = [str(a) for a in config.getini("addopts")]
    given += shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))
    given += [os.fspath(a) for a in config.invocation_params.args]
    given = _expand_arg_files(given, parser, config.invocation_params.dir)
    out: list[str] = []
    for action, spelling, values in _walk(given, actions):
        if action is None:  # positional: a file, folder or node id of the controller's
            continue
        if action.dest in stripped:
            continue
        if action.dest == "plugins" and values:
            name = values[0].strip()
            if name in skip_plugins or name.removeprefix("no:") in skip_plugins:
                continue  # the rank loads the plugin itself (a "no:" of it came before the -p)
        if action.dest == "override_ini" and values and values[0].split("=", 1)[0] == "addopts":
            continue
        out += _spell(action, spelling, values)
    return out


def _plugin_name(config: pytest.Config) -> str:
    """The name the controller registered the plugin under: the rank loads it the same way.

    ``distrank`` when the entry point loaded it (autoload or ``-p distrank``); the module path
    (``pytest_distrank.plugin``) when ``-p``, ``PYTEST_PLUGINS`` or a conftest's
    ``pytest_plugins`` imported it from a checkout that is not installed.
    """
    from .. import plugin

    return config.pluginmanager.get_name(plugin) or "distrank"


def _expand_arg_files(args: list[str], parser: argparse.ArgumentParser, base: Path) -> list[str]:
    """Expand ``@file`` arguments as pytest's parser does (``fromfile_prefix_chars``)."""
    prefixes = parser.fromfile_prefix_chars or ""
    out: list[str] = []
    for arg in args:
        if arg[:1] and arg[0] in prefixes:
            text = (base / arg[1:]).read_text()
            lines = [a for line in text.splitlines() for a in parser.convert_arg_line_to_args(line)]
            out += _expand_arg_files(lines, parser, base)
        else:
            out.append(arg)
    return out


def _is_option(arg: str, actions: dict[str, argparse.Action]) -> bool:
    """Whether argparse takes ``arg`` for an option rather than a value or a positional."""
    if len(arg) < 2 or arg[0] != "-":
        return False
    name = arg.split("=", 1)[0]
    if arg in actions or name in actions or arg[:2] in actions:
        return True
    return not _NEGATIVE_NUMBER.match(arg) and " " not in arg


def _walk(
    args: Sequence[str], actions: dict[str, argparse.Action]
) -> Iterator[tuple[argparse.Action | None, str, list[str]]]:
    """Yield ``(action, spelling, values)`` per option of ``args``; ``(None, arg, [])`` for a
    positional argument and for an option the parser does not know."""
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":  # the rest is positional
            return
        if not _is_option(arg, actions):
            yield None, arg, []
            continue
        name, eq, attached = arg.partition("=")
        if arg in actions:
            name, eq, attached = arg, "", ""
        if name in actions or name.startswith("--"):
            cluster = [(actions.get(name), name, attached if eq else None)]
        else:  # short options: -n2, -xvs, -vn 2
            cluster, rest = [], arg[1:]
            while rest:
                action = actions.get("-" + rest[0])
                if action is None or action.nargs != 0:
                    cluster.append((action, "-" + rest[0], rest[1:].removeprefix("=") or None))
                    break
                cluster.append((action, "-" + rest[0], None))
                rest = rest[1:]
        for action, spelling, value in cluster:
            if action is None:
                yield None, arg, []
                break
            values = [] if value is None else [value]
            # Exactly one or N values: the controller's parse succeeded, so they follow. "?",
            # "*", "+": as many as follow that do not read as options.
            exact = action.nargs is None or isinstance(action.nargs, int)
            limit = 1 if action.nargs in (None, "?") else action.nargs
            limit = limit if isinstance(limit, int) else len(args)
            while value is None and i < len(args) and len(values) < limit and args[i] != "--":
                if not exact and _is_option(args[i], actions):
                    break
                values.append(args[i])
                i += 1
            yield action, spelling, values


def _spell(action: argparse.Action, spelling: str, values: list[str]) -> list[str]:
    """The option as a rank reads it; ``--opt=v`` where a value could pass for an option."""
    if len(values) != 1:
        return [spelling, *values]
    value = values[0]
    if spelling.startswith("--"):
        return [f"{spelling}={value}"]
    if not value.startswith("-"):
        return [spelling, value]
    longs = [s for s in action.option_strings if s.startswith("--")]
    return [f"{longs[0]}={value}"] if longs else [spelling + value]


def _as_int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def coverage_settings(config: pytest.Config) -> dict[str, Any] | None:
    """What a rank needs to measure coverage like the controller's pytest-cov, or None.

    pytest-cov measures only the process it runs in. Each rank starts its own
    ``coverage.Coverage`` with the controller's source, branch and config file, and saves a
    parallel data file (``.coverage.<host>.<pid>.<random>``) beside the controller's, where
    pytest-cov combines it into the report. Works the same under xdist (the controller is then a
    worker whose data the xdist controller combines).
    """
    return _compat.pytest_cov_settings(config)
