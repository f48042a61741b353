"""What a test can change in its rank process outside torch, as the leftover checks read and name.

Runs in pool-mode rank processes (:mod:`rank.leftovers` reads these before and after every test).
Everything here is named, never restored: ``sys.path`` and ``sys.modules`` (a module imported
again that registered a ``torch.library`` namespace raises, so ``sys.modules`` is never put back),
the umask, signal dispositions, loggers' levels and handlers, child processes still running and
sockets left listening (a process or a socket can be named or killed, not put back). Each reader
returns a category of :class:`leftovers.Snapshot`: a dict of key to value, None for absent.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import operator
import os
import signal
import sys
import types
from collections.abc import Iterable
from typing import Any

from . import fingerprint

#: Handler classes of these modules are pytest's and the plugin's own: pytest attaches its
#: capture handler to the root logger and every non-propagating logger at each phase, the
#: plugin a relay to each non-propagating logger. Never a test's leftover.
OWN_HANDLER_MODULES = ("_pytest.", "pytest_distrank.")
#: The key of ``logging.disable``'s level in the ``logging`` category.
DISABLE = "(logging.disable)"
#: torch's own loggers: torch reconfigures them itself (``torch._logging``, on the first
#: compile or ``set_logs``), so their handlers change without a test's doing. Not compared.
TORCH_LOGGER = "torch"
#: A logger's state in a fresh process: level NOTSET, no handlers, propagating, enabled.
FRESH_LOGGER = (logging.NOTSET, (), True, False)
_UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)
#: ``_signal.getsignal``'s numbers for the default and ignored dispositions, as ``signal.getsignal``
#: returns them.
_HANDLERS: dict[int, signal.Handlers] = {int(h): h for h in signal.Handlers}
#: ``signal.getsignal`` less its enum lookup (an exception raised and caught per Python handler):
#: the C function it wraps, where there is one.
_GETSIGNAL: Any = getattr(importlib.import_module("_signal"), "getsignal", signal.getsignal)
#: In the command lines of the helper processes that live as long as the rank, started on
#: first use: inductor's compile workers, multiprocessing's forkserver and resource tracker.
PROCESS_HELPERS = (
    "_inductor/compile_worker",
    "from multiprocessing.forkserver import main",
    "from multiprocessing.resource_tracker import main",
)
#: torch's DataLoader's SIGCHLD handler (installed once per process, on the first loader
#: with workers): the process's, never a test's leftover.
TORCH_SIGCHLD = ("torch.utils.data._utils.signal_handling", "_set_SIGCHLD_handler.<locals>.")


def path_state() -> dict[str, Any]:
    return {"": tuple(sys.path)}


def modules_state() -> dict[str, Any]:
    """``sys.modules`` as it is: name -> the module object (a shallow copy: ``dict.copy`` clones
    the table, ~15 us; ``dict(sys.modules)`` inserts entry by entry, ~40-60 us), the last copy
    again while the dict's version is unchanged (:func:`fingerprint.dict_mark`)."""
    modules = sys.modules
    return fingerprint.MODULES.read(fingerprint.dict_mark(modules), modules.copy)


def umask_state() -> dict[str, Any]:
    mask = os.umask(0o022)
    os.umask(mask)
    return {"": mask}


def signal_state() -> dict[str, Any]:
    """Each signal's Python-level disposition (a handler torch or a C library installed is not
    seen: Python reports it as None before and after alike). torch's DataLoader SIGCHLD
    handler reads as the disposition it replaced (the process's, set once)."""
    getsignal = _GETSIGNAL
    state = {
        name: _HANDLERS.get(h, h) if type(h) is int else h
        for name, number in _signals()
        for h in (getsignal(number),)
    }
    key = str(int(signal.SIGCHLD))
    state[key] = _before_torch(state.get(key))
    return state


def _before_torch(handler: Any) -> Any:
    """``handler``, or the one torch's SIGCHLD handler replaced (and calls on)."""
    module, qualname = TORCH_SIGCHLD
    if getattr(handler, "__module__", None) != module or not str(
        getattr(handler, "__qualname__", "")
    ).startswith(qualname):
        return handler
    try:
        cell = handler.__closure__[handler.__code__.co_freevars.index("previous_handler")]
        previous = cell.cell_contents
    except (AttributeError, ValueError, IndexError, TypeError):
        return handler
    return signal.SIG_DFL if previous is None else previous


@functools.cache
def _signals() -> tuple[tuple[str, int], ...]:
    """(key, number) of each signal a handler can be set for (real-time ones included) and
    Python reads, looked up once."""
    found = []
    for number in sorted(signal.valid_signals()):
        if number in _UNCATCHABLE:
            continue
        try:
            signal.getsignal(number)
        except (ValueError, OSError):
            continue
        found.append((str(int(number)), int(number)))
    return tuple(found)


def logging_state() -> dict[str, Any]:
    """Per logger (the root as ``""``): level, the handlers a test may add (pytest's and the
    plugin's own left out), whether it propagates, whether it is disabled. Read raw, for all
    loggers at once; built into the category only when the raw read differs from the last one
    (:data:`fingerprint.LOGGING`), over a list of loggers kept while ``loggerDict`` is unchanged."""
    manager = logging.Logger.manager
    root, table = logging.root, manager.loggerDict
    table_mark = fingerprint.dict_mark(table)
    mark = None if table_mark is None else (manager, root, table_mark)
    names, loggers = fingerprint.LOGGERS.read(mark, lambda: _loggers(root, table))
    raw = (
        manager.disable,
        [*map(_LEVELS, loggers)],
        [*map(tuple, map(_HANDLERS_OF, loggers))],
    )
    return fingerprint.LOGGING.read(
        None if mark is None else (mark, raw), lambda: _logging_category(names, *raw)
    )


#: A logger's plain state and its handlers, read for all loggers with ``map``.
_LEVELS = operator.attrgetter("level", "propagate", "disabled")
_HANDLERS_OF = operator.attrgetter("handlers")


def _loggers(
    root: logging.Logger, table: dict[str, Any]
) -> tuple[tuple[str, ...], tuple[logging.Logger, ...]]:
    """(names, loggers) compared: the root as ``""``, every logger (no placeholder) but
    torch's own."""
    found = [("", root)] + [
        (name, lg)
        for name, lg in list(table.items())
        if isinstance(lg, logging.Logger)
        and not (name == TORCH_LOGGER or name.startswith(TORCH_LOGGER + "."))
    ]
    return tuple(name for name, _ in found), tuple(lg for _, lg in found)


def _logging_category(
    names: tuple[str, ...],
    disable: int,
    levels: list[tuple[int, bool, bool]],
    handlers: list[tuple[logging.Handler, ...]],
) -> dict[str, Any]:
    state: dict[str, Any] = {DISABLE: disable}
    for name, (level, propagate, disabled), own in zip(names, levels, handlers, strict=True):
        kept = tuple(h for h in own if not _own_handler(h)) if own else ()
        state[name] = (level, kept, propagate, disabled)
    return state


def _own_handler(handler: logging.Handler) -> bool:
    return type(handler).__module__.startswith(OWN_HANDLER_MODULES)


def children_state() -> dict[str, Any]:
    """This process's children still running (zombies left out): pid -> its command line.

    Read from ``/proc/self/task/*/children`` (a rank is a child subreaper: orphans of its
    children are re-parented to it and listed there too), unless the rank has no child at all
    (:func:`fingerprint.has_children`). A fork of this process
    that multiprocessing does not manage is left out: it runs the rank's own code, and the fork
    check (:func:`hygiene.stray_forks`) reports it; so is torch.compile's pool of compile
    workers (inductor's, started on the first compile, living as long as the process), and
    multiprocessing's forkserver and resource tracker (started on first use, likewise)."""
    return {} if fingerprint.has_children() is False else _walk_children()


def _walk_children() -> dict[str, Any]:
    """The children :func:`children_state` names."""
    found: dict[str, Any] = {}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return found
    pids = [p for task in tasks for p in (_read(f"/proc/self/task/{task}/children") or b"").split()]
    own: str | None = None  # read once a child is found
    for pid in pids:
        command = _command(pid.decode())
        if command is None or any(helper in command for helper in PROCESS_HELPERS):
            continue
        own = _command("self") if own is None else own
        if command != own or _managed(int(pid)):
            found[pid.decode()] = command
    return found


def _read(path: str) -> bytes | None:
    """A /proc file's bytes (None when it cannot be read): os.open, no file object's cost."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    chunks: list[bytes] = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks)


def _managed(pid: int) -> bool:
    """Whether ``pid`` is a child multiprocessing started (a DataLoader's worker, a Pool's)."""
    mp = sys.modules.get("multiprocessing")
    return mp is not None and any(p.pid == pid for p in mp.active_children())


def _command(pid: str) -> str | None:
    """A child's command line in words, or None once it exited (or is a zombie)."""
    try:
        if (_read(f"/proc/{pid}/stat") or b"").rsplit(b")", 1)[1].split()[0] == b"Z":
            return None
    except IndexError:  # gone: nothing was read
        return None
    command = _read(f"/proc/{pid}/cmdline")
    return (
        None if command is None else command.replace(b"\0", b" ").decode("utf-8", "replace").strip()
    )


def socket_inodes() -> frozenset[int]:
    """The inodes of the sockets this process holds open (~2.5 us per descriptor). Read with
    ``readlink`` relative to the open folder (a fifth less than a path from ``/proc`` each
    time), not ``fstat``: an ``fstat`` of a file on a network mount may wait on its server."""
    found = set()
    with contextlib.suppress(OSError):
        folder = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY)
        try:
            for fd in os.listdir(folder):
                try:
                    target = os.readlink(fd, dir_fd=folder)
                except OSError:
                    continue
                if target.startswith("socket:["):  # the folder's own descriptor is not one
                    found.add(int(target[8:-1]))
        finally:
            os.close(folder)
    return frozenset(found)


def listening(inodes: frozenset[int]) -> dict[int, str]:
    """Of ``inodes``, those listening (TCP, TCP over IPv6, Unix): inode -> its address."""
    found: dict[int, str] = {}
    for table in ("tcp", "tcp6"):
        for fields in _rows(table):
            if len(fields) > 9 and fields[3] == "0A" and int(fields[9]) in inodes:
                found[int(fields[9])] = _address(fields[1])
    for fields in _rows("unix"):  # Num RefCount Protocol Flags Type St Inode [Path]
        if len(fields) > 6 and int(fields[3], 16) & 0x10000 and int(fields[6]) in inodes:
            found[int(fields[6])] = fields[7] if len(fields) > 7 else "an unnamed Unix socket"
    return found


def _rows(table: str) -> list[list[str]]:
    try:
        with open(f"/proc/self/net/{table}") as f:
            return [line.split() for line in f.read().splitlines()[1:]]
    except OSError:
        return []


def _address(hex_address: str) -> str:
    """``0100007F:1F90`` -> ``127.0.0.1:8080``; an IPv6 address keeps only its port's words."""
    host, _, port = hex_address.partition(":")
    number = int(port, 16)
    if len(host) == 8:
        octets = bytes.fromhex(host)[::-1]
        return f"{'.'.join(str(b) for b in octets)}:{number}"
    return f"port {number} (IPv6)"


# -- words -------------------------------------------------------------------------------------


def path_words(before: tuple[str, ...], after: tuple[str, ...]) -> str:
    added = [p for p in after if p not in before]
    removed = [p for p in before if p not in after]
    parts = [f"{p!r} added" for p in added[:2]] + [f"{p!r} removed" for p in removed[:2]]
    more = len(added) + len(removed) - len(parts)
    parts += [f"{more} more"] if more > 0 else []
    return f"sys.path changed ({', '.join(parts) or 'reordered'})"


def module_words(name: str, before: Any, after: Any) -> str | None:
    """A ``sys.modules`` entry's change in words; None for an ordinary import (a module that
    was not there and is now, imported under its own name: what any first import does)."""
    if before is None:
        return None if _imported(name, after) else f"sys.modules[{name!r}] added"
    if after is None:
        return f"sys.modules[{name!r}] removed"
    return f"sys.modules[{name!r}] replaced"


def _imported(name: str, module: Any) -> bool:
    """A module imported under ``name``, or an alias of one imported under its own name (a
    package that registers a submodule under a second name as it is imported)."""
    spec = getattr(module, "__spec__", None) if isinstance(module, types.ModuleType) else None
    own = getattr(spec, "name", None)
    return own is not None and (own == name or sys.modules.get(own) is module)


def umask_words(mask: int) -> str:
    return f"umask {mask:#05o}"


def signal_words(number: str, handler: Any) -> str:
    try:
        name = signal.Signals(int(number)).name
    except ValueError:
        name = f"signal {number}"
    if handler is signal.SIG_IGN:
        how = "ignored"
    elif handler is signal.SIG_DFL:
        how = "back to its default"
    elif handler is None:
        how = "handled outside Python"
    else:
        how = f"handled by {getattr(handler, '__qualname__', type(handler).__name__)}"
    return f"{name} {how}"


def logging_words(name: str, before: Any, after: Any, imported: Iterable[str]) -> str | None:
    """A logger's change in words: its level, handlers added or removed, propagation. A logger
    the test created is compared with a fresh one, unless a module imported during the test
    is its name or holds it (``torch._dynamo.guards.__recompiles``): an import configures its
    own loggers. None: no leftover."""
    if name == DISABLE:
        return f"logging.disable({logging.getLevelName(after)})"
    if after is None or (before is None and _by_import(name, imported)):
        return None
    who = "the root logger" if name == "" else f"logger {name!r}"
    old, new = before or FRESH_LOGGER, after
    if old == new:
        return None
    parts = []
    if old[0] != new[0]:
        parts.append(f"level {logging.getLevelName(new[0])}")
    added = [type(h).__name__ for h in new[1] if h not in old[1]]
    removed = [type(h).__name__ for h in old[1] if h not in new[1]]
    parts += [f"a {h} added" for h in added] + [f"a {h} removed" for h in removed]
    if old[2] != new[2]:
        parts.append("propagating" if new[2] else "not propagating")
    if old[3] != new[3]:
        parts.append("disabled" if new[3] else "enabled")
    return f"{who}: {', '.join(parts)}"


def _by_import(name: str, imported: Iterable[str]) -> bool:
    """Whether a module imported during the test is ``name`` or holds it, in any case (a
    library may name its logger ``DeepSpeed`` in package ``deepspeed``)."""
    lowered = {module.lower() for module in imported}
    parts = name.lower().split(".")
    return any(".".join(parts[:n]) in lowered for n in range(len(parts), 0, -1))


def child_words(pid: str, command: str) -> str:
    """A child still running, by its command line, or the kernel's name for it where that is
    empty (a child read amid its ``exec``, or one that cleared its arguments)."""
    if not command:
        name = (_read(f"/proc/{pid}/comm") or b"").decode("utf-8", "replace").strip()
        command = f"{name}, its command line empty" if name else "its command line empty"
    shown = command if len(command) <= 60 else command[:57] + "..."
    return f"child process {pid} ({shown}) still running"


def socket_words(address: str) -> str:
    return f"a socket listening on {address}"
