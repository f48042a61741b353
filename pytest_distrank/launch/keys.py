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
``stray/<test>`` (counter)         forks     how many forked processes said they left
``stray/<test>/<rank>``            forks     :class:`Identity` of a forked process
``count/<test>``                   0 main    rank 0 asks for collective counts after the test
``counts/<test>/<rank>``           N main    :class:`Counts`: the rank's collective counts
``records/<test>``                 0 main    rank 0 asks the ranks that finished a hung test
``records/<test>/<rank>``          N main    :class:`Records`: the rank's flight records
``still/<test>`` (counter)         N wdog    how many stillness payloads were written
``still/<test>/<rank>``            N wdog    :class:`Still`: the rank stands still (or moved)
``heartbeat`` (counter)            0 wdog    bumped every second while rank 0 lives
``exit``                           0         rank 0's exit code (an int)
``bye`` (counter)                  all       ranks that reached the end (they leave together)
=================================  ========  =================================================

Every payload a rank sends about a test carries its :class:`Identity` (pid at send time, test
index, node id): rank 0 credits it to no other test and no other process. Every payload (not the
counters) travels with a MAC over the run, its key, the test and rank the key names
(:func:`subject`) and the attempt (:mod:`auth`): a counter only says "go read", and what is read
must verify.
"""

from __future__ import annotations

import os
from typing import Any, Literal, TypedDict

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


def fatal(rank: int) -> str:
    return f"fatal/{rank}"


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


#: Keys whose one number is the rank that writes them (in the others it is the test index).
_RANK_KEYS = ("collect", "fatal")


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


class StepData(TypedDict):
    """One test's step (:class:`plan.Step` as a dict)."""

    kind: str
    reason: str
    backend: str


class PlanData(TypedDict):
    #: Why no test runs (the ranks collected different tests), or None.
    error: str | None
    steps: list[StepData]
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
    #: :data:`records.WarningRecord` lists (JSON makes tuples lists).
    warnings: list[Any]
    #: Group (in words) -> sequence number.
    sequence: dict[str, int]


class Stack(Identity):
    #: Every thread's stack (:func:`channel.dump_threads`).
    dump: str
    when: str
    reports: list[dict[str, Any]]
    warnings: list[Any]
    #: The flight records, JSON text (:func:`frrecords.own_records`; "" when the recorder is off).
    records: str
    #: This rank's wall clock (ns) when it began the test: its records after it are the test's.
    since_ns: int


class Fatal(Identity):
    #: How the rank's session ended (:func:`stacks.interruption_message`).
    message: str
    when: str
    reports: list[dict[str, Any]]
    warnings: list[Any]


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


class Counts(TypedDict):
    #: Group (in words) -> [collectives issued, the last one's op]; None: flight recorder off.
    counts: dict[str, Any] | None
