"""Injected faults, the pure part: the calls' arguments, op names, counting, the words.

Runs in rank processes of both modes (:mod:`rank.faults` uses it inside a test that arms a
fault). No torch, no processes: unit-tested without ranks (``tests/unit/test_faults_api.py``).

A fault is armed by a call every rank makes (``faults.kill(rank=2, at="all_reduce", nth=3)``):
each rank checks the arguments the same way, so a bad call fails the test on every rank, naming
the call and the value. The fault acts on its rank only, at the ``nth`` time that rank issues
the op on one process group, counted per group and per op from the ``faults`` fixture's setup
(the start of the test). Collectives are also numbered per group across ops, as the hang
verdicts number them (``#5 on the default group``), point-to-point ops left out.
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Any

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
#: The dispatch mode's class name: exempt from the dispatch-modes-left check (groupstate.py).
MODE_NAME = "FaultInjectionMode"


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
        if fault.signal == signal.SIGSTOP:
            raise FaultError(f"{where}: SIGSTOP stops a rank without ending it; use faults.hang.")
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


@dataclasses.dataclass
class Counts:
    """The ops one rank issued since the test started, per group: by op, and all collectives."""

    #: (group key, user op) -> how many.
    by_op: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    #: group key -> collectives issued (point-to-point ops left out).
    by_group: dict[str, int] = dataclasses.field(default_factory=dict)
    #: group key -> the group in words ("the default group").
    words: dict[str, str] = dataclasses.field(default_factory=dict)

    def note(self, group: str, op: str, words: str) -> tuple[int, int]:
        """One more ``op`` on ``group``: its count of that op, and its collective number."""
        nth = self.by_op.get((group, op), 0) + 1
        self.by_op[group, op] = nth
        self.words.setdefault(group, words)
        number = self.by_group.get(group, 0)
        if op not in P2P:
            number += 1
            self.by_group[group] = number
        return nth, number

    def issued(self, op: str) -> str:
        """``2 all_reduce (on the default group)``: how many times ``op`` was issued, per group."""
        found = [(self.words.get(g, g), n) for (g, o), n in self.by_op.items() if o == op]
        if not found:
            return f"0 {op}"
        return "; ".join(f"{n} {op} (on {words})" for words, n in found)


def fired_line(
    fault: Fault, rank: int, nth: int, number: int, group: str, seconds: float, when: str
) -> str:
    """``injected: SIGKILL to rank 2 at all_reduce #3 (the 3rd all_reduce, #5 on the default
    group), 0.41 s into call (faults.kill(...))``: the line in the test's report."""
    where = f"{fault.at} #{nth}"
    slot = f"#{number} on {group}" if fault.at not in P2P else f"on {group}"
    return (
        f"injected: {fault.action(rank)} at {where} (the {ordinal(nth)} {fault.at}, {slot}), "
        f"{seconds:.2f} s into {when} ({fault.call})"
    )


def never_fired(fault: Fault, rank: int, counts: Counts) -> str:
    """Why the test fails when a fault did not fire, and what to do next."""
    return (
        f"{fault.call} never fired: rank {rank} issued {counts.issued(fault.at)} "
        "since the test started. Make the test issue it, lower nth=, or pass optional=True "
        "when the fault may not be reached."
    )
