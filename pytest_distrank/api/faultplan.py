"""Injected faults, the pure part: the calls' arguments, op names, counting, the words.

Runs in rank processes of both modes (:mod:`api.faults` uses it inside a test that arms a
fault). No torch, no processes: unit-tested without ranks (``tests/unit/test_faults_api.py``,
``tests/unit/test_faults_counting.py``).

A fault is armed by a call every rank makes (``faults.kill(rank=2, at="all_reduce", nth=3)``):
each rank checks the arguments the same way, so a bad call fails the test on every rank, naming
the call and the value. The fault acts on its rank only, at the ``nth`` time that rank issues
the op on one process group, counted per group and per op from the ``faults`` fixture's setup
(the start of the test). Only the test's own calls count: the plugin's (the checks across
ranks' twin groups, everything inside ``reference()``) are never counted (:class:`Group`).
Collectives are also numbered per group across ops, as the hang verdicts number them
(``all_reduce #5 on the default group``), point-to-point ops left out, and groups are named as
the verdicts name them (``the group of ranks 2, 3``).
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Any

from ..outcome.collectives import group_of_ranks
from ..outcome.expectations import ExpectationError, parse_signal

#: The user's op names -> the dispatcher's op names (``c10d::`` from ``torch.distributed.*`` and
#: DDP, ``_c10d_functional::`` from functional collectives: DTensor, tensor parallel).
OPS: dict[str, tuple[str, ...]] = {
    "all_reduce": (
        "c10d::allreduce_",
        "_c10d_functional::all_reduce",
        "_c10d_functional::all_reduce_",
    ),
    "all_reduce_coalesced": (
        "c10d::allreduce_coalesced_",
        "_c10d_functional::all_reduce_coalesced",
        "_c10d_functional::all_reduce_coalesced_",
    ),
    "broadcast": (
        "c10d::broadcast_",
        "_c10d_functional::broadcast",
        "_c10d_functional::broadcast_",
    ),
    "barrier": ("c10d::barrier", "c10d::monitored_barrier_"),
    "all_gather": ("c10d::allgather_", "c10d::allgather_coalesced_"),
    "all_gather_into_tensor": (
        "c10d::_allgather_base_",
        "c10d::allgather_into_tensor_coalesced_",
        "_c10d_functional::all_gather_into_tensor",
        "_c10d_functional::all_gather_into_tensor_out",
        "_c10d_functional::all_gather_into_tensor_coalesced",
    ),
    "reduce_scatter": ("c10d::reduce_scatter_",),
    "reduce_scatter_tensor": (
        "c10d::_reduce_scatter_base_",
        "c10d::reduce_scatter_tensor_coalesced_",
        "_c10d_functional::reduce_scatter_tensor",
        "_c10d_functional::reduce_scatter_tensor_out",
        "_c10d_functional::reduce_scatter_tensor_coalesced",
    ),
    "all_to_all": ("c10d::alltoall_",),
    "all_to_all_single": ("c10d::alltoall_base_", "_c10d_functional::all_to_all_single"),
    "reduce": ("c10d::reduce_",),
    "gather": ("c10d::gather_",),
    "scatter": ("c10d::scatter_",),
    "send": ("c10d::send", "_c10d_functional::isend"),
    "recv": ("c10d::recv_", "c10d::recv_any_source_", "_c10d_functional::irecv"),
}
#: Dispatcher op name -> the user's name.
USER_NAME = {op: name for name, ops in OPS.items() for op in ops}
#: Ops the collective numbering (``#k on a group``) leaves out, as the flight recorder does.
P2P = frozenset({"send", "recv"})
#: The fault kinds and the calls that arm them.
KINDS = ("kill", "raise_in", "delay", "hang")


#: Signals whose default action does not end a process: a kill refuses them, and why.
NOT_ENDING: dict[int, str] = {
    **{
        int(getattr(signal, name)): "stops a process without ending it; use faults.hang"
        for name in ("SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU")
    },
    **{
        int(getattr(signal, name)): "is ignored by default: it does not end a process"
        for name in ("SIGCHLD", "SIGCONT", "SIGURG", "SIGWINCH")
    },
}


class FaultError(ExpectationError):
    """A fault call that cannot be honoured; the message names the call and the bad value."""


@dataclasses.dataclass
class Fault:
    """One armed fault."""

    kind: str
    rank: int
    #: The user's op name (a key of :data:`OPS`).
    at: str
    nth: int
    optional: bool = False
    #: ``kill``: the signal's number.
    signal: int = int(signal.SIGKILL)
    #: ``delay``: seconds.
    seconds: float = 0.0
    #: ``raise_in``: what to raise.
    exc: BaseException | None = None
    #: The call as written, for every message about it.
    call: str = ""
    fired: bool = False

    def action(self, rank: int) -> str:
        """``SIGKILL to rank 2``, ``RuntimeError raised on rank 1``, ``2 s delay of rank 0``."""
        if self.kind == "kill":
            return f"{signal.Signals(self.signal).name} to rank {rank}"
        if self.kind == "raise_in":
            return f"{type(self.exc).__name__} raised on rank {rank}"
        if self.kind == "delay":
            return f"{self.seconds:g} s delay of rank {rank}"
        return f"hang of rank {rank}"


def call_words(kind: str, kwargs: dict[str, Any]) -> str:
    """``faults.kill(rank=2, at='all_reduce', nth=3)``: the call as written."""
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if v is not None)
    return f"faults.{kind}({args})"


def make_fault(
    kind: str,
    world_size: int,
    *,
    rank: object,
    at: object,
    nth: object = 1,
    optional: object = False,
    signal_: object = "SIGKILL",
    seconds: object = 0.0,
    exc: object = None,
    call: str = "",
) -> Fault:
    """A fault from a call's arguments; :class:`FaultError` names the call and the bad value."""
    __tracebackhide__ = True
    where = call or call_words(kind, {"rank": rank, "at": at, "nth": nth})
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise FaultError(
            f"{where}: rank {rank!r} is not a rank of this test's world of {world_size} "
            f"(0 to {world_size - 1})."
        )
    if not isinstance(at, str) or at not in OPS:
        known = ", ".join(sorted(OPS))
        raise FaultError(f"{where}: unknown op {at!r}; at= takes one of {known}.")
    if isinstance(nth, bool) or not isinstance(nth, int) or nth < 1:
        raise FaultError(
            f"{where}: nth={nth!r} must be an integer >= 1 (nth=1: the first {at} the rank "
            "issues on a group)."
        )
    if not isinstance(optional, bool):
        raise FaultError(f"{where}: optional={optional!r} must be True or False.")
    fault = Fault(kind, rank, at, nth, optional, call=where)
    if kind == "kill":
        try:
            fault.signal = parse_signal(signal_, where)
        except ExpectationError as bad:
            raise FaultError(str(bad)) from None
        why = NOT_ENDING.get(fault.signal)
        if why is not None:
            raise FaultError(
                f"{where}: {signal.Signals(fault.signal).name} {why}. A kill ends the rank by "
                "its signal: take one that ends a process, such as SIGKILL (the default), "
                "SIGTERM, SIGINT, SIGABRT, SIGSEGV, SIGUSR1 or SIGUSR2."
            )
    elif kind == "delay":
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0:
            raise FaultError(f"{where}: seconds={seconds!r} must be a number of seconds >= 0.")
        fault.seconds = float(seconds)
    elif kind == "raise_in":
        if exc is None:
            exc = RuntimeError(f"injected by {where}")
        if isinstance(exc, type) and issubclass(exc, BaseException):
            exc = exc(f"injected by {where}")
        if not isinstance(exc, BaseException):
            raise FaultError(f"{where}: exc={exc!r} is not an exception to raise.")
        fault.exc = exc
    return fault


def ordinal(n: int) -> str:
    """1 -> ``1st``, 2 -> ``2nd``, 11 -> ``11th``."""
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th') }"


@dataclasses.dataclass(frozen=True)
class Group:
    """The process group of one op, as the fault kit counts it."""

    #: Its name (the counting key: two groups of the same members are two groups).
    key: str
    #: Its members (global ranks), None where they are not known.
    members: tuple[int, ...] | None = None
    default: bool = False
    #: One of the plugin's own, never counted: a twin group of the checks across ranks, or any
    #: group while ``reference()`` runs (its one-rank world).
    plugin: bool = False

    def words(self) -> str:
        """``the default group``, ``the group of ranks 2, 3``: as the verdicts say."""
        if self.default:
            return "the default group"
        if self.members:
            return group_of_ranks(self.members)
        return f"group {self.key!r}"


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where one op of the test falls: its counts, and its group in words."""

    op: str
    #: The group in words.
    group: str
    #: This op's count on this group (what ``nth`` means).
    nth: int
    #: The group's collective number (``#5 on the default group``); 0 for point-to-point ops.
    number: int
    #: This op's count over every group.
    overall: int


@dataclasses.dataclass
class Counts:
    """The ops one rank issued since the test started, per group: by op, and all collectives."""

    #: (group key, user op) -> how many.
    by_op: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    #: group key -> collectives issued (point-to-point ops left out).
    by_group: dict[str, int] = dataclasses.field(default_factory=dict)
    #: user op -> how many, over every group.
    overall: dict[str, int] = dataclasses.field(default_factory=dict)
    #: group key -> the group (first seen).
    groups: dict[str, Group] = dataclasses.field(default_factory=dict)

    def note(self, group: Group, op: str) -> Slot | None:
        """One more ``op`` on ``group``: where it falls; None for the plugin's own ops."""
        if group.plugin:
            return None
        key = group.key
        self.groups.setdefault(key, group)
        nth = self.by_op[key, op] = self.by_op.get((key, op), 0) + 1
        overall = self.overall[op] = self.overall.get(op, 0) + 1
        number = 0
        if op not in P2P:
            number = self.by_group[key] = self.by_group.get(key, 0) + 1
        return Slot(op, self.words(key), nth, number, overall)

    def words(self, key: str) -> str:
        """The group in words; its name too where another group has the same members."""
        group = self.groups.get(key)
        if group is None:
            return f"group {key!r}"
        words = group.words()
        if any(g.words() == words for k, g in self.groups.items() if k != key):
            words += f" named {key!r}"
        return words

    def issued(self, op: str) -> str:
        """``2 all_reduce (on the default group)``: how many times ``op`` was issued, per group."""
        found = [(self.words(g), n) for (g, o), n in self.by_op.items() if o == op]
        if not found:
            return f"0 {op}"
        return "; ".join(f"{n} {op} (on {words})" for words, n in found)


@dataclasses.dataclass
class Plan:
    """One rank's armed faults and its counts: which fault is due at each op."""

    armed: list[Fault] = dataclasses.field(default_factory=list)
    counts: Counts = dataclasses.field(default_factory=Counts)

    def see(self, op: str, group: Group) -> tuple[Slot | None, list[Fault]]:
        """The rank is about to run ``op`` on ``group``: where it falls, and the faults that
        fire now (marked fired): those at ``op`` whose ``nth`` it is on that group."""
        slot = self.counts.note(group, op)
        if slot is None:
            return None, []
        due = [f for f in self.armed if not f.fired and f.at == op and f.nth == slot.nth]
        for fault in due:
            fault.fired = True
        return slot, due

    def missed(self) -> list[Fault]:
        """Armed faults that never fired and are not optional."""
        return [f for f in self.armed if not f.fired and not f.optional]


def fired_line(fault: Fault, rank: int, slot: Slot, seconds: float, when: str) -> str:
    """``injected: SIGKILL to rank 2 at all_reduce #5 on the default group (its 3rd
    all_reduce), 0.41 s into call (faults.kill(...))``: the line in the test's report. ``#5``
    numbers the group's collectives, as the verdicts do; where the rank issued the op on other
    groups too, its count over every group follows (``its 2nd all_reduce there, its 3rd in
    all``)."""
    op = slot.op
    where = f"{op} #{slot.number} on {slot.group}" if slot.number else f"{op} on {slot.group}"
    count = f"its {ordinal(slot.nth)} {op}"
    if slot.overall != slot.nth:
        count += f" there, its {ordinal(slot.overall)} in all"
    return (
        f"injected: {fault.action(rank)} at {where} ({count}), {seconds:.2f} s into {when} "
        f"({fault.call})"
    )


def never_fired(fault: Fault, rank: int, counts: Counts) -> str:
    """Why the test fails when a fault did not fire, and what to do next."""
    return (
        f"{fault.call} never fired: rank {rank} issued {counts.issued(fault.at)} "
        "since the test started. Make the test issue it, lower nth=, or pass optional=True "
        "when the fault may not be reached."
    )
