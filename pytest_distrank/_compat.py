"""Every private pytest, CPython and torch API the plugin uses, each behind one named function.

Imported in every process of both modes: the controller, pool rank processes (and the fork server
that preloads the plugin), and the ranks of a launched world. So it imports no torch at module
level (the torch functions import it when called) and nothing that a process lacks.

The rule: no other module of the package imports ``_pytest`` or touches a private attribute of
pytest's objects (``tests/unit/test_imports.py`` checks it). Where pytest exports a name
(``pytest.TestReport``, ``pytest.CollectReport``, ``pytest.CallInfo``) the public name is used
instead. Each function's docstring says why the private access is needed and what breaks if it
changes; the guards (``getattr`` defaults, ``hasattr``) are those the call sites always had.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import signal
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import pytest

# Failure reports are built from pytest's own repr classes so that the terminal, ``-ra`` and
# junitxml render them as any other failure; a rename breaks every merged failure report (and
# the import of merge.py). No public names exist for them.
from _pytest._code.code import (
    ExceptionChainRepr,
    ExceptionRepr,
    ReprEntryNative,
    ReprFileLocation,
    ReprTracebackNative,
)
from _pytest._io import TerminalWriter
from _pytest.junitxml import xml_key
from _pytest.runner import runtestprotocol
from _pytest.tmpdir import TempPathFactory

__all__ = [
    "ExceptionChainRepr",
    "ExceptionRepr",
    "ReprEntryNative",
    "ReprFileLocation",
    "ReprTracebackNative",
    "argparse_parser",
    "can_redirect_terminal",
    "close_fork_server_alive_fd",
    "default_plugin_modules",
    "drop_junit_xml",
    "dump_flight_recorder",
    "ensure_unconfigure",
    "finish_fixture",
    "fixture_info",
    "forget_setup_stack",
    "forkserver_pid",
    "getbasetemp",
    "kill_fork_server",
    "mp_process_config",
    "option_actions",
    "option_groups",
    "redirect_terminal",
    "rendezvous_handlers",
    "replace_catching_logs",
    "request_item",
    "rerun_condition",
    "rerun_count",
    "rerun_delay",
    "rerun_failures_db",
    "rerun_hard_fail",
    "rerun_path_excluded",
    "rerunfailures_module",
    "run_test_protocol",
    "session_fixturedefs",
    "set_given_basetemp",
    "setup_stack",
    "skip_exception",
    "stop_fork_server",
    "take_suite_rerun",
    "teardown_exact",
    "terminal_writer",
    "user_temp_root",
]

# -- running a test and its fixtures -------------------------------------------------------------


def run_test_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """pytest's runtest protocol without logging (launcher ranks run it; no public API; a changed
    signature breaks every launcher-mode test)."""
    runtestprotocol(item, log=False, nextitem=nextitem)


def teardown_exact(session: pytest.Session, nextitem: pytest.Item | None) -> None:
    """Tear down what ``nextitem`` does not need (None: everything), as pytest's teardown phase
    does; without SetupState the controller and ranks cannot keep fixtures in step."""
    session._setupstate.teardown_exact(nextitem)


def setup_stack(session: pytest.Session) -> list[object]:
    """The nodes pytest holds set up, outermost first; if ``stack`` changes shape, the check
    before a rank's next test fails."""
    return list(session._setupstate.stack)


def forget_setup_stack(session: pytest.Session) -> None:
    """Drop every set-up node without tearing it down (after a stuck rank its teardown could
    hang); if ``stack`` goes, launcher mode hangs in teardown after a stuck test."""
    session._setupstate.stack.clear()


def session_fixturedefs(session: pytest.Session, name: str) -> Sequence[Any]:
    """The fixture definitions ``name`` resolves to at session level (no public lookup); a change
    breaks the reset of ``pg``/``backend``/``device`` when a launcher rank replaces its group."""
    manager: Any = session._fixturemanager
    defs: Sequence[Any] = manager.getfixturedefs(name, session) or ()
    return defs


def finish_fixture(fixturedef: Any, session: pytest.Session) -> None:
    """Finish a session fixture (and its dependants) with a stand-in request holding only
    ``node``: high risk, breaks if ``FixtureDef.finish`` reads more of its request."""
    shim: Any = types.SimpleNamespace(node=session)
    fixturedef.finish(shim)


def fixture_info(item: pytest.Item) -> Any | None:
    """The item's resolved fixtures (``_fixtureinfo``; None for items without one): if renamed,
    no test is told that it uses a rank fixture without a world_size marker."""
    return getattr(item, "_fixtureinfo", None)


def request_item(request: pytest.FixtureRequest) -> Any:
    """The test function item a fixture request is for (``_pyfuncitem``, else ``request.node``):
    only names the test in the misuse message."""
    return getattr(request, "_pyfuncitem", request.node)


def skip_exception(reason: str) -> BaseException:
    """A skip reported at the item's location, as a marker's skip is (``_use_item_location`` is a
    private keyword); if removed, every skip decided before a test runs raises TypeError."""
    return pytest.skip.Exception(reason, _use_item_location=True)


# -- session, config, reporting ------------------------------------------------------------------


def getbasetemp(config: pytest.Config) -> Path | None:
    """pytest's basetemp, made on first use (``config._tmp_path_factory``; None when the tmpdir
    plugin is off): if renamed, the session folder moves to the system temp folder."""
    factory = getattr(config, "_tmp_path_factory", None)
    return factory.getbasetemp() if factory is not None else None


def user_temp_root(config: pytest.Config) -> Path:
    """pytest's ``pytest-of-<user>`` folder, made and checked by pytest's own ``getbasetemp``:
    refused (OSError, pytest's message) when another user owns it or it is a link, made 0700 and
    narrowed to that when wider. It is the parent of this process's numbered basetemp, which this
    makes (``tmp_path`` makes it anyway); without the tmpdir plugin a factory with pytest's
    defaults makes one. Call it only without ``--basetemp``. Private: ``config._tmp_path_factory``
    and ``TempPathFactory(..., _ispytest=True)``; if the numbered folder moves, launcher mode's run
    folder moves with it (still checked by pytest)."""
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None:
        factory = TempPathFactory(None, 3, "all", lambda *args: None, _ispytest=True)
    base: Path = factory.getbasetemp()
    return base.parent


def set_given_basetemp(config: pytest.Config, path: Path) -> None:
    """Give this launcher rank its own ``--basetemp`` (a write to ``_given_basetemp``; nothing
    without the tmpdir plugin): high risk, if ignored the ranks of a node empty each other's."""
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is not None:
        factory._given_basetemp = path


def ensure_unconfigure(config: pytest.Config) -> None:
    """Run pytest's unconfigure (from the launcher watchdog thread, which ends a stuck run): high
    risk, a change leaves plugins unconfigured (or raises, which the caller suppresses)."""
    config._ensure_unconfigure()


def can_redirect_terminal(reporter: object) -> bool:
    """Whether the terminal reporter has the writer :func:`redirect_terminal` replaces (``_tw``);
    when it has not, rank reports go to the terminal as usual."""
    return reporter is not None and hasattr(reporter, "_tw")


def redirect_terminal(reporter: Any, stream: TextIO) -> None:
    """Send a rank's terminal report to ``stream`` (no public way); call only when
    :func:`can_redirect_terminal` said yes."""
    reporter._tw = TerminalWriter(stream)


def terminal_writer(stream: TextIO) -> TerminalWriter:
    """pytest's TerminalWriter over ``stream``, for ``report.toterminal`` (it takes no other):
    if moved, a launcher rank's log loses its failure tracebacks."""
    return TerminalWriter(stream)


def drop_junit_xml(config: pytest.Config) -> None:
    """Unregister junitxml in a launcher rank other than 0 (``xml_key``): if moved, the import of
    this module fails, and every rank would write the same junit file."""
    xml = config.stash.get(xml_key, None)
    if xml is not None:
        config.pluginmanager.unregister(xml)
        del config.stash[xml_key]


def default_plugin_modules() -> list[str]:
    """pytest's built-in plugin modules, preloaded by the fork server; ``[]`` when pytest no
    longer has ``_pytest.config.default_plugins`` (they are then imported by each rank)."""
    try:
        from _pytest.config import default_plugins
    except ImportError:
        return []
    return [f"_pytest.{name}" for name in default_plugins]


def replace_catching_logs(replacement: type) -> bool:
    """Make pytest's logging plugin use ``replacement`` for ``_pytest.logging.catching_logs``;
    False (nothing changed) when this pytest has none, and ranks keep pytest's own."""
    import _pytest.logging

    if not isinstance(getattr(_pytest.logging, "catching_logs", None), type):
        return False
    _pytest.logging.catching_logs = replacement  # type: ignore[misc,assignment]
    return True


def share_rewritten_modules(folder: str) -> Callable[[], None] | None:
    """Keep pytest's assertion-rewritten test modules in ``folder`` when bytecode is not written.

    pytest caches a rewritten module in ``__pycache__`` unless ``sys.dont_write_bytecode``
    (``PYTHONDONTWRITEBYTECODE=1``, ``-B``): then the controller and every rank rewrite each
    test module again (about 1 ms per test per process). With this, the first process to rewrite
    a module writes it to ``folder`` (a session's private folder) and the others read it back,
    as pytest reads its own cache (``_read_pyc`` checks the source's hash, or mtime and size).
    Wraps ``_pytest.assertion.rewrite.get_cache_dir`` and ``_rewrite_test``; they do nothing new
    when bytecode is written. Returns what undoes it, or None (nothing changed) when this pytest
    lacks them or they are wrapped already.
    """
    import sys

    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return None
    get_cache_dir = getattr(rewrite, "get_cache_dir", None)
    rewrite_test = getattr(rewrite, "_rewrite_test", None)
    write_pyc = getattr(rewrite, "_write_pyc", None)
    tail = getattr(rewrite, "PYC_TAIL", None)
    key = getattr(rewrite, "assertstate_key", None)
    if not (callable(get_cache_dir) and callable(rewrite_test) and callable(write_pyc)):
        return None
    if tail is None or key is None or getattr(rewrite_test, "_distrank_shared", False):
        return None
    shared = Path(folder)

    def cache_dir(file_path: Path) -> Path:
        if not sys.dont_write_bytecode:
            return Path(get_cache_dir(file_path))  # pytest's own cache, untouched
        return shared.joinpath(*file_path.parts[1:-1])

    def rewrite_and_keep(fn: Path, config: pytest.Config) -> Any:
        result = rewrite_test(fn, config)
        if sys.dont_write_bytecode:  # pytest will not write it: keep it for the others
            with contextlib.suppress(Exception):
                pyc = cache_dir(fn) / (fn.name[:-3] + tail)
                pyc.parent.mkdir(parents=True, exist_ok=True)
                write_pyc(config.stash[key], result[1], result[0], pyc)
        return result

    def undo() -> None:
        rewrite.get_cache_dir = get_cache_dir
        rewrite._rewrite_test = rewrite_test

    rewrite_and_keep._distrank_shared = True  # type: ignore[attr-defined]
    rewrite.get_cache_dir = cache_dir
    rewrite._rewrite_test = rewrite_and_keep
    return undo


def argparse_parser(config: pytest.Config) -> argparse.ArgumentParser:
    """The controller's argparse parser, with every option it knows (``config._parser``); if it
    changes, rank command lines cannot be built and no pool starts."""
    parser = config._parser
    build = getattr(parser, "_getparser", None)  # pytest 8 builds one per parse
    if build is not None:
        built: argparse.ArgumentParser = build()
        return built
    return parser.optparser  # pytest >= 9: one parser, options added to it as they come


def option_groups(config: pytest.Config) -> list[Any]:
    """pytest's option groups (``config._parser._groups``), to strip whole groups from rank
    command lines; if renamed, no pool starts."""
    return list(config._parser._groups)


def option_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """argparse's table of option strings to actions (CPython private); without it the controller's
    arguments cannot be read for the ranks."""
    return dict(parser._option_string_actions)


# -- CPython multiprocessing -----------------------------------------------------------------------


def mp_process_config() -> dict[str, Any]:
    """multiprocessing's per-process settings (``current_process()._config``, holding ``tempdir``
    where its sockets go); if renamed, fork server starts fail with AttributeError."""
    from multiprocessing import process

    config: dict[str, Any] = process.current_process()._config  # type: ignore[attr-defined]
    return config


def forkserver_pid() -> int:
    """The running fork server's pid (``forkserver._forkserver._forkserver_pid``, unguarded as
    always); if renamed, every fork server pool start fails."""
    from multiprocessing import forkserver

    return int(forkserver._forkserver._forkserver_pid)  # type: ignore[attr-defined]


def kill_fork_server() -> None:
    """SIGKILL a fork server that never got ready (its private pid); if the attribute goes,
    AttributeError reaches the caller, as it always did."""
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver
    with contextlib.suppress(ProcessLookupError, TypeError):
        os.kill(server._forkserver_pid, signal.SIGKILL)


def stop_fork_server() -> None:
    """Forget a killed fork server (``_stop``: its pipe, its zombie, its socket); when missing,
    nothing is forgotten and the next start may find a stale server."""
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver
    with contextlib.suppress(OSError, AttributeError):
        server._stop()  # closes the server's pipe, reaps it, unlinks its socket


def close_fork_server_alive_fd() -> None:
    """Close a forked rank's copy of the fork server's alive pipe (``_forkserver_alive_fd``); if
    renamed, nothing is closed and ranks outlive a dead controller until PDEATHSIG fires."""
    from multiprocessing import forkserver

    server: Any = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None


# -- torch (imported lazily: the controller never imports torch for gloo) ------------------------


def rendezvous_handlers() -> dict[str, Any] | None:
    """torch's registered rendezvous handlers (``_rendezvous_handlers``); None when torch has no
    such table, and tests' own rendezvous then see torchrun's agent-store setting unscoped."""
    import importlib

    module = importlib.import_module("torch.distributed.rendezvous")
    handlers = getattr(module, "_rendezvous_handlers", None)
    return handlers if isinstance(handlers, dict) else None


def dump_flight_recorder() -> bytes:
    """The NCCL/gloo flight recorder's dump as JSON (``_dump_fr_trace_json(includeCollectives,
    onlyActive)``; read by ``collectives.load``, never unpickled), which has no stack traces
    (symbolizing them takes seconds: 3.5 s for 21 collectives in a rank); callers treat any
    exception (a torch without it) as "no entries", so a change only loses the collective counts
    and the hang explanations."""
    import torch

    raw: bytes = torch._C._distributed_c10d._dump_fr_trace_json(True, False)
    return with_group_members(raw)


def with_group_members(raw: bytes) -> bytes:
    """A JSON flight-recorder dump with each group this rank holds in its ``pg_config``, as
    NCCL's dump lists them (``{"name", "desc", "ranks": "[0, 1]"}``): gloo's lists none (one
    entry with an empty name), so a hang on a subgroup could name it only ``group '1'``. The
    members are read from ``distributed_c10d._world`` (private); the dump as it was where that
    fails."""
    import json

    from torch.distributed import distributed_c10d as c10d

    try:
        data = json.loads(raw)
        config = data.setdefault("pg_config", {})
        for pg, name in list(c10d._world.pg_names.items()):
            members = sorted(c10d._world.pg_group_ranks.get(pg) or ())
            listed = config.get(name)
            if members and not (isinstance(listed, dict) and listed.get("ranks", "[]") != "[]"):
                desc = str(getattr(pg, "group_desc", ""))
                config[name] = {"name": name, "desc": desc, "ranks": str(members)}
        return json.dumps(data).encode()
    except Exception:
        return raw


def process_groups() -> list[Any]:
    """Every process group this rank created, the default one included.

    torch.distributed lists them nowhere public (``distributed_c10d._world.pg_map``, torch 2.x);
    the sequence-number check after each test needs the subgroups a test created too.
    """
    from torch.distributed import distributed_c10d as c10d

    return list(c10d._world.pg_map)


def sequence_number(pg: Any) -> int:
    """The number of collectives and point-to-point ops ``pg`` has issued on this rank.

    ``ProcessGroup._get_sequence_number_for_group()`` (torch 2.x, private; raises on a backend
    without sequence numbers): compared between ranks after every test (~30 us).
    """
    return int(pg._get_sequence_number_for_group())


def print_stacks_on_fatal_signal(enabled: bool) -> None:
    """Turn torch's C++ stack printing on fatal signals on or off
    (``torch._C._set_print_stack_traces_on_fatal_signal``, private): PyTorch's harness turns it
    on in every test process; a warm rank turns it off again after such a test, so that its own
    crash reports (faulthandler) stay what they are."""
    import torch

    setter = getattr(torch._C, "_set_print_stack_traces_on_fatal_signal", None)
    if setter is not None:
        setter(enabled)


#: PyTorch's LocalTensor package (private); messages to users name it for its rank_map helpers.
LOCAL_TENSOR_MODULE = "torch.distributed._local_tensor"


def fake_store() -> Any:
    """The store PyTorch's fake process group takes (``torch.testing._internal``'s
    ``FakeStore``); without it no simulated world starts, and the pool says so at start-up."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


def every_rank_int(size: int) -> Any:
    """A ``torch.SymInt`` that is ``r`` on each simulated rank ``r < size``: ``LocalIntNode`` of
    ``torch.distributed._local_tensor`` (private, torch >= 2.10), which PyTorch's own
    ``LocalDTensorTestBase.rank`` returns."""
    import torch
    from torch.distributed._local_tensor import LocalIntNode

    return torch.SymInt(LocalIntNode({r: r for r in range(size)}))


@contextlib.contextmanager
def local_tensor_mode(size: int) -> Iterator[None]:
    """``LocalTensorMode`` over ranks ``0..size-1`` (``torch.distributed._local_tensor``),
    entered as PyTorch's ``LocalDTensorTestBase`` enters it around a test: autograd's
    record_function off (``torch.autograd._enable_record_function``), DTensor's random-number
    tracker dropped after it (``torch.distributed.tensor._random._rng_tracker``) so the next
    test seeds afresh."""
    import torch
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.tensor import _random

    torch.autograd._enable_record_function(False)
    try:
        with LocalTensorMode(frozenset(range(size))):
            yield
    finally:
        torch.autograd._enable_record_function(True)
        _random._rng_tracker = None


#: Weak references to every DeviceMesh made since :func:`watch_local_collectives`.
_LOCAL_MESHES: list[Any] = []
#: torch's internal names of LocalTensor's collectives, where they differ from the public ones.
_LOCAL_OP_NAMES = {
    "allreduce_coalesced": "all_reduce_coalesced",
    "allgather_base": "all_gather_into_tensor",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter_base": "reduce_scatter_tensor",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
}


def watch_local_collectives(
    check: Callable[[str, Any], None], not_member: Callable[[str], None]
) -> None:
    """For the rest of this process (a local pool's rank): ``check(op, group)`` runs before
    LocalTensorMode computes a collective on ``group``, and may raise; ``not_member(op)`` runs
    where torch skips a collective because the process's rank is not in its group, and may raise.

    LocalTensor computes every collective it implements after resolving its group in
    ``torch.distributed._local_tensor._c10d._prepare_collective_groups`` (private), which this
    wraps (``op`` is the caller's name there, in public words); torch warns of a skipped one in
    ``distributed_c10d._warn_not_in_group`` (private), also wrapped, and the exception logger
    around torch's collectives would replace a refusal there by its own ``ValueError: Invalid
    process group specified`` (``c10d_logger._get_msg_dict`` fails on a group the rank is not
    in): that one falls back to the op's name. Every DeviceMesh made from now on is remembered
    for :func:`mesh_dim_groups` (``DeviceMesh.__init__`` wrapped). A rename in torch makes this
    raise (AttributeError) at the pool's start, which then says so.
    """
    import functools
    import sys
    import weakref

    from torch._C import ScriptObject
    from torch.distributed import c10d_logger
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed._local_tensor import _c10d as local_c10d
    from torch.distributed.device_mesh import DeviceMesh

    prepare = local_c10d._prepare_collective_groups
    if getattr(prepare, "_distrank_watched", False):
        return

    @functools.wraps(prepare)
    def prepare_checked(group: Any) -> Any:
        __tracebackhide__ = True
        caller = sys._getframe(1).f_code.co_name
        name = caller.removeprefix("_local_").removeprefix("functional_").rstrip("_")
        op = _LOCAL_OP_NAMES.get(name, name) if caller.startswith("_local_") else "a collective"
        unboxed = c10d.ProcessGroup.unbox(group) if isinstance(group, ScriptObject) else group
        check(op, unboxed)
        return prepare(group)

    warn = c10d._warn_not_in_group

    @functools.wraps(warn)
    def warn_or_refuse(op_name: str) -> None:
        __tracebackhide__ = True
        not_member(op_name)
        warn(op_name)

    msg_dict = c10d_logger._get_msg_dict

    @functools.wraps(msg_dict)
    def msg_dict_or_name(func_name: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return dict(msg_dict(func_name, *args, **kwargs))
        except Exception:
            return {"func_name": func_name}

    init = DeviceMesh.__init__

    @functools.wraps(init)
    def init_remembered(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        _LOCAL_MESHES.append(weakref.ref(self))

    prepare_checked._distrank_watched = True  # type: ignore[attr-defined]
    local_c10d._prepare_collective_groups = prepare_checked
    c10d._warn_not_in_group = warn_or_refuse
    c10d_logger._get_msg_dict = msg_dict_or_name
    DeviceMesh.__init__ = init_remembered


def mesh_dim_groups() -> set[str]:
    """The names of the process groups of every DeviceMesh dimension made since
    :func:`watch_local_collectives`, while the mesh lives (``DeviceMesh._dim_group_names`` and
    the ``_pg_registry`` a root mesh keeps of its submeshes' and flattened dimensions' groups,
    both private: a rename makes every mesh dimension refused in local mode)."""
    names: set[str] = set()
    _LOCAL_MESHES[:] = [ref for ref in _LOCAL_MESHES if ref() is not None]
    for ref in _LOCAL_MESHES:
        mesh = ref()
        names.update(n for n in getattr(mesh, "_dim_group_names", None) or () if n)
        names.update(getattr(mesh, "_pg_registry", None) or {})
    return names


def dispatch_modes() -> list[str]:
    """The class names of the torch dispatch modes entered now (``torch.utils._python_dispatch.
    _get_current_dispatch_mode_stack``, private); [] when torch is not imported or has no such
    stack (then a test that leaves one entered goes unnoticed, as before)."""
    import sys

    if "torch" not in sys.modules:
        return []
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    except ImportError:
        return []
    return [type(mode).__name__ for mode in _get_current_dispatch_mode_stack()]


# -- pytest-rerunfailures (its decision functions, read from the installed module) ---------------
#
# Read in 14.0, 15.0, 15.1, 16.0, 16.1 and 16.7: the filters match the report's crash line
# (<= 15.0) or the exception and its chain (>= 15.1); a condition gets no error (14.0, 15.x,
# 16.1), a report holding ``excinfo`` (16.0) or the exception info (16.7); the exclude paths, the
# delay's backoff factor and the suite-wide cap exist only in recent versions. Each function asks
# the installed module for what it has; the parameter names say which form a function takes.

#: The module of pytest-rerunfailures (also its plugin object, registered as ``rerunfailures``).
RERUNFAILURES_MODULE = "pytest_rerunfailures"


def rerunfailures_module(config: pytest.Config) -> Any | None:
    """pytest-rerunfailures' module where this process loaded it, else None.

    Ranks unregister the plugin (``worker.CONTROLLER_ONLY_PLUGINS``) but keep the module and its
    options, which is what its decision functions read; under ``-p no:rerunfailures`` neither
    exists.
    """
    if not hasattr(config.option, "only_rerun"):
        return None
    return sys.modules.get(RERUNFAILURES_MODULE)


def _takes(function: Callable[..., Any], name: str) -> bool:
    return name in inspect.signature(function).parameters


def rerun_count(plugin: Any, item: pytest.Item) -> int | None:
    """``get_reruns_count``: the reruns allowed, or None where neither an option nor a ``flaky``
    marker asks for any (rerunfailures then leaves the test alone)."""
    count = plugin.get_reruns_count(item)
    return None if count is None else int(count)


def rerun_delay(plugin: Any, item: pytest.Item) -> tuple[float, float]:
    """The delay before a rerun and its backoff factor: ``get_reruns_delay`` and
    ``get_reruns_delay_backoff_factor`` (1.0, a constant delay, where the version has none)."""
    factor = getattr(plugin, "get_reruns_delay_backoff_factor", None)
    return float(plugin.get_reruns_delay(item) or 0), float(factor(item)) if factor else 1.0


def rerun_path_excluded(plugin: Any, item: pytest.Item) -> bool:
    """``_is_rerun_path_excluded`` (``--rerun-exclude-path``); False where the version has no
    such option."""
    excluded = getattr(plugin, "_is_rerun_path_excluded", None)
    return bool(excluded(item)) if excluded is not None else False


def rerun_failures_db(config: pytest.Config) -> Any | None:
    """The per-test failure counts rerunfailures keeps (``config.failures_db``; a client of the
    xdist controller's under pytest-xdist); None where it set none."""
    return getattr(config, "failures_db", None)


def take_suite_rerun(config: pytest.Config) -> bool:
    """Take one rerun of ``--max-suite-reruns``, the cap shared by every test of the run; True
    when there is no cap (or the version has none), False when it is used up."""
    cap = getattr(config.option, "max_suite_reruns", None)
    db = rerun_failures_db(config)
    take = getattr(db, "try_increment_suite_reruns", None)
    return True if cap is None or take is None else bool(take(cap))


def rerun_hard_fail(
    plugin: Any, item: pytest.Item, report: pytest.TestReport, excinfo: Any
) -> bool:
    """``_should_hard_fail_on_error``: whether ``--only-rerun``/``--rerun-except`` (or the
    marker's ``only_rerun=``/``rerun_except=``) rule out a rerun for this failure. ``excinfo``
    (None: no exception, such as a crash) where the version reads the exception, else the
    report's crash line."""
    judge = plugin._should_hard_fail_on_error
    if _takes(judge, "excinfo"):
        return bool(judge(item, report, excinfo))
    return bool(judge(item, report))


def rerun_condition(plugin: Any, item: pytest.Item, excinfo: Any) -> bool | None:
    """A ``flaky(condition=...)`` for one failure, through ``evaluate_condition``; None where the
    marker gives no condition. Raises what rerunfailures raises for a condition it cannot
    evaluate (``pytest.fail``, in most versions)."""
    marker = item.get_closest_marker("flaky")
    if marker is None or "condition" not in marker.kwargs:
        return None
    evaluate, condition = plugin.evaluate_condition, marker.kwargs["condition"]
    if _takes(evaluate, "excinfo"):
        return bool(evaluate(item, marker, condition, excinfo))
    if _takes(evaluate, "report"):  # 16.0: a report holding the exception info
        return bool(evaluate(item, marker, condition, types.SimpleNamespace(excinfo=excinfo)))
    return bool(evaluate(item, marker, condition))
