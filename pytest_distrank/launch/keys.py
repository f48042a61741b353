"""Launcher mode's wire protocol: the control store's keys and their payloads, in one place.

Imported by every module of launcher mode, in every rank (main thread and watchdog). The control
store is a ``torch.distributed.TCPStore`` reached through :class:`channel.Channel`, which keeps
each run's keys under a prefix of its own (``distrank/r<restart>/ctl/``) and stores JSON. Each
key has one function here that spells it, and each payload one ``TypedDict``; a key without a
payload type is a counter (:meth:`channel.Channel.add`) or holds a plain value.

Who writes what (rank 0 is "0", the others "N"; "main"/"watchdog" is the thread):

=================================  ========  =================================================
key                                writer    meaning
=================================  ========  =================================================
``run``                            0 main    the run id every rank's folder is named after
``collect/<rank>``                 all main  :class:`Collected`: the rank's node ids, pid, log
``plan``                           0 main    :class:`PlanData`: what every test does
``verdict/<test>``                 0 main    :class:`Verdict`: go on, stop or abort after it
``stopped``                        0 main    :class:`Verdict`: the run stops (first one only)
``early/<test>`` (counter)         N main    how many early payloads were written
``early/<test>/<rank>``            N main    :class:`Early`: the rank failed or skipped
``report/<test>/<rank>``           N main    :class:`PeerReport`: the rank's last reports
``done/<test>`` (counter)          N main    how many last reports were written
``abort/<test>``                   0         :class:`Abort`: stop waiting, send your stacks
``stack/<test>/<rank>``            N wdog    :class:`Stack`: the rank's threads and reports
``fatal/<rank>``                   N main    :class:`Fatal`: the rank's pytest session ended
                                   (0 wdog: the rank is gone, :mod:`liveness`)
``alive/<rank>``                   N wdog    :class:`Alive`: the rank lives, and where it is
``gaveup`` (counter)               N         how many ranks left on a silent rank 0
``gaveup/<rank>``                  N         :class:`GaveUp`: why the rank left (:mod:`gaveup`)
``stray/<test>`` (counter)         forks     how many forked processes said they left
``stray/<test>/<rank>``            forks     :class:`Identity` of a forked process
``count/<test>``                   0 main    rank 0 asks for collective counts after the test
``counts/<test>/<rank>``           N main    :class:`Counts`: the rank's collective counts
``records/<test>``                 0 main    rank 0 asks the ranks that finished a hung test
``records/<test>/<rank>``          N main    :class:`Records`: the rank's flight records
``still/<test>`` (counter)         N wdog    how many stillness payloads were written
``still/<test>/<rank>``            N wdog    :class:`Still`: the rank stands still (or moved)
``world/<test>``                   N main    :class:`SubResult`: a sub-world's reports, from its
                                             rank 0 (a sub-world's keys above use its own ranks)
``heartbeat`` (counter)            0 wdog    bumped every second while rank 0 lives
``exit``                           0         rank 0's exit code (an int)
``bye`` (counter)                  all       ranks that reached the end (they leave together)
=================================  ========  =================================================

Every payload a rank sends about a test carries its :class:`Identity` (pid at send time, test
index, node id): rank 0 credits it to no other test and no other process. Every payload (not the
counters) travels with a MAC over the run, its key, the test and rank the key names
(:func:`subject`) and the attempt (:mod:`auth`): a counter only says "go read", and what is read
must verify. A payload that verified is then read by its kind's reader (:func:`read_stack`, ...,
through :meth:`channel.Channel.get`), which checks every key and type and raises
:class:`MessageError` naming the kind, the key and what was there: past it, fields are read as
they are.
"""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Callable
from typing import Any, Literal, TypedDict, TypeVar, Union, get_args, get_origin, get_type_hints

from ..outcome.records import WarningRecord

#: The run id (rank 0 makes it).
RUN = "run"
#: Rank 0's plan for every test.
PLAN = "plan"
#: The first verdict that stopped the run.
STOPPED = "stopped"
#: Rank 0's exit code.
EXIT = "exit"
#: Counter bumped by rank 0's watchdog every second.
HEARTBEAT = "heartbeat"
#: Counter of ranks that reached the end.
BYE = "bye"


def collect(rank: int) -> str:
    return f"collect/{rank}"


def verdict(index: int) -> str:
    return f"verdict/{index}"


def early_count(index: int) -> str:
    return f"early/{index}"


def early(index: int, rank: int) -> str:
    return f"early/{index}/{rank}"


def report(index: int, rank: int) -> str:
    return f"report/{index}/{rank}"


def done_count(index: int) -> str:
    return f"done/{index}"


def abort(index: int) -> str:
    return f"abort/{index}"


def stack(index: int, rank: int) -> str:
    return f"stack/{index}/{rank}"


#: Counter of ranks that left because rank 0 gave no sign of life (:mod:`gaveup`).
GAVE_UP = "gaveup"


def gave_up(rank: int) -> str:
    return f"gaveup/{rank}"


def fatal(rank: int) -> str:
    return f"fatal/{rank}"


def alive(rank: int) -> str:
    return f"alive/{rank}"


def stray_count(index: int) -> str:
    return f"stray/{index}"


def stray(index: int, rank: int) -> str:
    return f"stray/{index}/{rank}"


def count_request(index: int) -> str:
    """Rank 0's request for every rank's collective counts after test ``index``."""
    return f"count/{index}"


def counts(index: int, rank: int) -> str:
    return f"counts/{index}/{rank}"


def records_request(index: int) -> str:
    """Rank 0's request, when test ``index`` left ranks stuck, for the flight records of the
    ranks that finished it (the collective verdict compares every rank's)."""
    return f"records/{index}"


def records(index: int, rank: int) -> str:
    return f"records/{index}/{rank}"


def still_count(index: int) -> str:
    """Bumped whenever a rank says it stands still in test ``index``, or moves again."""
    return f"still/{index}"


def still(index: int, rank: int) -> str:
    return f"still/{index}/{rank}"


def world(index: int) -> str:
    """A sub-world's result of test ``index``, which its rank 0 sends to the launched rank 0."""
    return f"world/{index}"


#: Keys whose one number is the rank that writes them (in the others it is the test index).
_RANK_KEYS = ("collect", "fatal", "alive", "gaveup")


def subject(key: str) -> tuple[int, int]:
    """The test index (-1: none) and the rank a key speaks for (0: rank 0 writes it), which the
    payload's MAC covers: ``report/3/1`` -> (3, 1), ``verdict/3`` -> (3, 0), ``fatal/2`` ->
    (-1, 2), ``plan`` -> (-1, 0)."""
    name, *numbers = key.split("/")
    values = [int(n) for n in numbers if n.lstrip("-").isdigit()]
    if len(values) >= 2:
        return values[0], values[1]
    if len(values) == 1:
        return (-1, values[0]) if name in _RANK_KEYS else (values[0], 0)
    return -1, 0


# -- payloads ----------------------------------------------------------------------------------


class Identity(TypedDict):
    """Who sent a payload about a test, and which test."""

    pid: int
    index: int
    nodeid: str


def identity(index: int, nodeid: str) -> Identity:
    """This process's identity for a payload about test ``index`` (the pid at send time: a
    process the test forked has another)."""
    return {"pid": os.getpid(), "index": index, "nodeid": nodeid}


class Collected(TypedDict):
    nodeids: list[str]
    pid: int
    host: str
    log: str
    #: The rank's node: the launcher's node number (torchrun's ``GROUP_RANK``, Slurm's
    #: ``SLURM_NODEID``) with the host name, else the host name.
    node: str
    #: The rank's local rank on its node (harness classes run where it equals the test's rank).
    local: int


class StepData(TypedDict):
    """One test's step (:class:`plan.Step` as a dict)."""

    kind: str
    reason: str
    backend: str
    #: A sub-world's test (kind ``sub``): its launched ranks, batch, slot and group id.
    members: list[int]
    batch: int
    slot: int
    init: int
    #: Who makes the test's process group (:attr:`plan.Step.group`): ``plugin``, ``own``
    #: (``init_process_group=False``), ``harness`` (PyTorch's harness classes).
    group: str


class PlanData(TypedDict):
    #: Why no test runs (the ranks collected different tests), or None.
    error: str | None
    steps: list[StepData]
    #: The order the tests run in (indices of the collected order: sub-worlds' batches packed).
    order: list[int]
    #: Each rank's node, numbered from rank 0's (:func:`subworld.nodes_of`).
    nodes: list[int]
    pids: list[int]
    #: rank (as a string: JSON) -> ``host:path`` of its log.
    logs: dict[str, str]


class Verdict(TypedDict):
    action: Literal["continue", "stop", "abort"]
    reason: str
    #: The process group generation the next test runs in (a new one: every rank re-creates it).
    gen: int


class Early(Identity):
    #: The grace trigger (:func:`endgame.grace_trigger`): "failed" or "skipped".
    kind: str
    when: str


class PeerReport(Identity):
    #: pytest's serialized reports (``pytest_report_to_serializable``).
    reports: list[dict[str, Any]]
    #: Whether the rank's default process group survived the test.
    healthy: bool
    warnings: list[WarningRecord]
    #: Group (in words) -> sequence number.
    sequence: dict[str, int]


class Stack(Identity):
    #: Every thread's stack (:func:`channel.dump_threads`).
    dump: str
    when: str
    reports: list[dict[str, Any]]
    warnings: list[WarningRecord]
    #: The flight records, JSON text (:func:`frrecords.own_records`; "" when the recorder is off).
    records: str
    #: This rank's wall clock (ns) when it began the test: its records after it are the test's.
    since_ns: int


class Fatal(Identity):
    #: How the rank's session ended (:func:`stacks.interruption_message`).
    message: str
    when: str
    reports: list[dict[str, Any]]
    warnings: list[WarningRecord]


class GaveUp(TypedDict):
    #: Wall-clock time (ns) of rank 0's last heartbeat the rank saw move, and how long it
    #: waited (s).
    since_ns: int
    silent_s: int


class Alive(Identity):
    """A rank's sign of life (its watchdog, every second), and the test and phase it is in
    (index -1: between tests)."""

    beat: int
    when: str
    #: Its process as rank 0 can recognise it (:func:`liveness.proc_identity`).
    proc: str


class Abort(TypedDict):
    reason: str


class Records(TypedDict):
    #: The flight records, JSON text (:func:`frrecords.own_records`; "" when the recorder is off).
    records: str
    #: The rank's wall clock (ns) when it began the test: its records after it are the test's.
    since_ns: int


class Still(Identity):
    """A rank's word about itself while test ``index`` runs (:mod:`deadwatch`)."""

    #: It stands still now (False: it moved again since it last said so).
    still: bool
    #: Its flight records, JSON text, when it last stood still ("" when the recorder is off).
    records: str
    #: Its wall clock (ns) when it began the test: its records after it are the test's.
    since_ns: int
    #: The ``torch.distributed`` call its main thread is inside (:func:`stacks.collective_entered`;
    #: "" when none) and where it is blocked (:func:`stacks.where_blocked`).
    inside: str
    where: str


class SubResult(Identity):
    """A sub-world's test as its rank 0 gathered it (:mod:`subrun`); ranks are the sub-world's."""

    #: Sub-world rank (as a string: JSON) -> its serialized reports.
    reports: dict[str, list[dict[str, Any]]]
    warnings: dict[str, list[WarningRecord]]
    #: Why the launched world cannot go on after it (a rank left stuck...), or "".
    ended: str
    #: Whether every member's process group survived the test, in step.
    healthy: bool


class Counts(TypedDict):
    #: Group (in words) -> (collectives issued, the last one's op); None: flight recorder off.
    counts: dict[str, tuple[int, str]] | None


# -- reading what left the store ---------------------------------------------------------------


class MessageError(ValueError):
    """A payload that is not what its kind says (a protocol bug, or another version on a rank)."""

    def __init__(self, kind: str, field: str, found: object, wanted: str) -> None:
        self.kind = kind
        self.field = field
        shown = "missing" if found is _MISSING else f"{found!r:.80} ({type(found).__name__})"
        super().__init__(f"the {kind} payload's {field!r} is {shown}, not {wanted}")


_MISSING = object()


def _wanted(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _parse(kind: str, field: str, value: object, hint: Any) -> Any:
    """``value`` as ``hint`` says (JSON lists become tuples), or :class:`MessageError`."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        for arg in args:
            try:
                return _parse(kind, field, value, arg)
            except MessageError:
                continue
    elif origin is Literal:
        if value in args:
            return value
    elif isinstance(hint, type) and hasattr(hint, "__total__"):  # a nested TypedDict
        if isinstance(value, dict):
            return _fields(kind, field + ".", value, hint)
    elif origin is list and isinstance(value, list):
        return [_parse(kind, f"{field}[{i}]", v, args[0]) for i, v in enumerate(value)]
    elif origin is tuple and isinstance(value, list | tuple) and len(value) == len(args):
        pairs = enumerate(zip(value, args, strict=True))
        return tuple(_parse(kind, f"{field}[{i}]", v, a) for i, (v, a) in pairs)
    elif origin is dict and isinstance(value, dict):
        return {
            _parse(kind, f"{field} key", k, args[0]): _parse(kind, f"{field}[{k!r}]", v, args[1])
            for k, v in value.items()
        }
    elif hint in (str, int, bool, type(None)) and type(value) is hint:  # True is no int here
        return value
    raise MessageError(kind, field, value, _wanted(hint))


_hints = functools.cache(get_type_hints)


def _fields(kind: str, prefix: str, raw: dict[str, Any], typed: type) -> dict[str, Any]:
    hints = _hints(typed)
    for name in raw:
        if name not in hints:
            raise MessageError(kind, prefix + str(name), raw[name], "absent (no such key)")
    return {
        name: _parse(kind, prefix + name, raw.get(name, _MISSING), hint)
        for name, hint in hints.items()
    }


T = TypeVar("T")


def _reader(typed: type[T]) -> Callable[[object], T]:
    def read(raw: object) -> T:
        kind = typed.__name__
        if not isinstance(raw, dict):
            raise MessageError(kind, "", raw, "a mapping")
        return _fields(kind, "", raw, typed)  # type: ignore[return-value]

    read.__doc__ = f"A :class:`{typed.__name__}` payload, checked key by key."
    return read


def read_exit(raw: object) -> int:
    """Rank 0's exit code (``exit``: a plain int)."""
    return int(_parse("exit", "value", raw, int))


def read_run(raw: object) -> str:
    """The run id (``run``: a plain str)."""
    return str(_parse("run", "value", raw, str))


read_collected = _reader(Collected)
read_plan = _reader(PlanData)
read_verdict = _reader(Verdict)
read_early = _reader(Early)
read_peer_report = _reader(PeerReport)
read_stack = _reader(Stack)
read_fatal = _reader(Fatal)
read_alive = _reader(Alive)
read_gave_up = _reader(GaveUp)
read_abort = _reader(Abort)
read_records = _reader(Records)
read_still = _reader(Still)
read_counts = _reader(Counts)
read_identity = _reader(Identity)
read_sub_result = _reader(SubResult)
