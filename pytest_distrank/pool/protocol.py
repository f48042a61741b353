"""Pool mode's typed messages between the controller and its rank processes.

Imported by both sides: the controller (the pytest process) and every pool rank. Standard library
only (and :mod:`records`, which is too): no torch, no pytest, so that a message can be built and
read anywhere. The records both modes share (:class:`~records.RunTest`,
:class:`~records.Reports`) travel inside these messages unchanged.

Messages travel over one duplex ``multiprocessing`` connection per rank, which does the framing
(length-prefixed pickles).

Phases a rank announces through the pool's shared phase array (two ints per rank: the phase and
the index of the test it belongs to), so that the controller can say what a rank was doing when it
crashed or hung without a message per phase. A phase is never evidence that a rank *finished* a
test (see :mod:`endgame`): only its reports for that test are.
"""

from __future__ import annotations

import dataclasses
import enum
import mmap
import os
from typing import Any

from ..outcome.records import Reports


class Phase(enum.IntEnum):
    """What a rank process is doing, as written into the pool's shared phase array."""

    STARTING = 0
    IDLE = 1
    SETUP = 2
    CALL = 3
    TEARDOWN = 4
    STOPPING = 5
    #: The rank took the test from its pipe; its setup has not begun.
    RECEIVED = 6
    #: The test's protocol returned; its last reports are being sent.
    FINISHED = 7

    @property
    def when(self) -> str:
        """The pytest phase name (``setup``/``call``/``teardown``) this phase reports under."""
        if self is Phase.CALL:
            return "call"
        if self in (Phase.TEARDOWN, Phase.FINISHED):
            return "teardown"
        return "setup"


@dataclasses.dataclass(frozen=True)
class RankConfig:
    """Everything a rank process needs to start; passed as the process target's argument."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    init_process_group: bool
    pool_id: int
    #: The pool's rendezvous: a FileStore in the controller's private folder (no port guessing).
    store_path: str
    #: What the rank's own pytest session parses, and sets after parsing (cmdline.py).
    cmdline: RankCommandLine
    env: dict[str, str]
    log_path: str
    nodeids: tuple[str, ...]
    #: pytest-cov is measuring the controller: the rank measures itself with these settings
    #: (``coverage.Coverage`` keyword arguments, plus ``topdir``) and saves a parallel data file.
    coverage: dict[str, Any] | None = None
    #: The pool's test files (absolute): the only files the rank's collection looks at.
    files: tuple[str, ...] = ()
    #: How the rank's debugger behaves (``--pdb``, ``--trace``, ``--distrank-debug-rank``).
    debug: DebugSettings | None = None
    #: The session's folder of assertion-rewritten test modules, when bytecode is not written
    #: (_compat.share_rewritten_modules): the controller rewrote them, the rank reads them.
    rewritten: str = ""
    #: A simulated world this one rank process plays (``@pytest.mark.simulate``): its mode, size,
    #: the rank it is (fake mode) and the ``device`` fixture's type; None for a real pool.
    simulated: tuple[str, int, int, str] | None = None
    #: The CUDA device (index within the pool's lease) the rank uses; -1 for none.
    cuda_device: int = -1
    #: "gloo" when the pool runs NCCL tests with gloo on shared GPUs (gpuplan.py), "nccl" for
    #: NCCL multi-rank, "" for one GPU per rank.
    gpu_share: str = ""
    #: Bytes of CUDA memory above its steady state that make the rank's pool unfit (0: never).
    cuda_growth: int = 0
    #: The rank's ``config.workerinput``, pytest-xdist's channel for plugins' values (JSON data;
    #: workerinput.py).
    workerinput: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The session seed each test's random state derives from (``--distrank-seed``; the
    #: controller picked it when the option says ``random``), or None: the state is left alone.
    seed: int | None = None
    #: ``--distrank-leftovers``: ``restore``, ``fail`` or ``off`` (rank/leftovers.py).
    leftovers: str = "restore"
    #: The ini lists of environment variables and thread names (fnmatch patterns) that are
    #: never leftovers: ``distrank_leftovers_ignore_env``, ``distrank_leftovers_ignore_threads``.
    leftovers_ignore: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    #: A rank template (pool/worker/template.py): at its session's start, before any conftest
    #: or collection, it sends Ready and forks the fresh ranks of later pools of its kind.
    template: bool = False
    #: What a template imports before it forks: the library modules (torch's distributed stack,
    #: PyTorch's test harness) its first pool's files import (pools/preloads.py).
    preload: tuple[str, ...] = ()
    #: A rank forked from a template: the file its pool's phase array lies in (else the array
    #: comes with the process's arguments).
    phases_path: str = ""


#: Bytes of one exit status in a rank template's status pipe (a signed int, little-endian).
STATUS_BYTES = 4


class PhaseFile:
    """A pool's phase array in a file that the controller and the ranks map (a pool of ranks
    forked from a template: multiprocessing's shared array travels only with a process's start).
    Indexed like the array it stands for: :func:`phase_slots`."""

    def __init__(self, path: str, slots: int = 0) -> None:
        if slots:  # the controller makes it, zeroed
            with open(path, "wb") as out:
                out.write(bytes(4 * slots))
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        self._view = memoryview(self._map).cast("i")

    def __getitem__(self, index: int) -> int:
        return int(self._view[index])

    def __setitem__(self, index: int, value: int) -> None:
        self._view[index] = value


@dataclasses.dataclass(frozen=True)
class Fork:
    """To a rank template: fork a fresh rank with ``cfg`` (its pipe to the controller and the
    write end of its exit-status pipe follow as file descriptors)."""

    cfg: RankConfig


@dataclasses.dataclass(frozen=True)
class Forked:
    """A rank template's answer to :class:`Fork`: the new rank's pid, or 0 and why it must not
    fork (the controller then starts the pool's ranks from nothing)."""

    pid: int
    why: str = ""


@dataclasses.dataclass(frozen=True)
class RankCommandLine:
    """A rank's pytest command line: the controller's own, parsed again by the rank, and what the
    rank owns, set where pytest reads it (built by ``cmdline.rank_command_line``, applied by
    ``workerinput.WorkerInput``)."""

    #: ``pytest.main``'s arguments: the controller's ``PYTEST_ADDOPTS`` and invocation arguments,
    #: with the rank's own options after them (before a ``--``).
    args: tuple[str, ...]
    #: The controller's invocation folder: the rank's pytest starts there, so that relative paths
    #: and ``@file`` arguments mean what they meant to the controller.
    invocation_dir: str
    #: ``config.option`` values set right after parsing, before any ``pytest_configure``.
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Option groups (``parser.getgroup`` names) whose every option is set back to its default,
    #: before the initial conftests load (pytest-cov starts measuring there) and after parsing.
    reset_groups: tuple[str, ...] = ()
    #: Plugins blocked right after parsing: their options parse, they do nothing.
    blocked_plugins: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class DebugSettings:
    """The controller's debugging options, as every rank of a pool needs them (rankpdb.py)."""

    #: ``--pdb``: a failing test opens the debugger in its (first) failing rank.
    post_mortem: bool = False
    #: ``--trace``: every test starts in the debugger on rank :attr:`trace_rank`.
    trace: bool = False
    #: The rank that ``--trace`` stops in: ``--distrank-debug-rank``, else 0.
    trace_rank: int = 0
    #: ``--distrank-debug-rank``: this rank's output is live and its stdin is the terminal.
    live_rank: int | None = None


# controller -> rank


@dataclasses.dataclass(frozen=True)
class CountCollectives:
    """Say how many collectives (not point-to-point ops) each group has issued.

    Sent only when the sequence numbers of a group differ between ranks after a test: either
    some ranks exchanged point-to-point messages, or one issued a collective its peers did not.
    """


@dataclasses.dataclass(frozen=True)
class Shutdown:
    """Tear down what is still set up, end the rank's pytest session and exit."""


@dataclasses.dataclass(frozen=True)
class DebugReply:
    """The answer to :class:`DebugOpen`: the terminal is the rank's (``ok``), or why not."""

    ok: bool
    why: str = ""


@dataclasses.dataclass(frozen=True)
class DebugLine:
    """One line the person typed, the answer to :class:`DebugRead` ("" at end of input)."""

    text: str


# rank -> controller


@dataclasses.dataclass(frozen=True)
class DebugOpen:
    """The rank wants the terminal: its debugger is at a prompt (``kind``: breakpoint,
    post_mortem, trace, input). It waits for :class:`DebugReply`; until its
    :class:`DebugClose` the controller serves this rank alone and the test's clocks stand
    still. A debugger that steps sends one pair per stop, so its peers get their turns (and
    their collectives can complete) while it runs."""

    rank: int
    kind: str
    #: What the controller prints before the debugger's own output (the failure, the place).
    header: str = ""


@dataclasses.dataclass(frozen=True)
class DebugOutput:
    """Text the rank's debugger wrote (the controller labels each line with the rank)."""

    rank: int
    text: str


@dataclasses.dataclass(frozen=True)
class DebugRead:
    """The rank's debugger waits for a line of input (answered by :class:`DebugLine`)."""

    rank: int


@dataclasses.dataclass(frozen=True)
class DebugClose:
    """The rank gives the terminal back: its debugger left the prompt (``done``: for good,
    not to step to the next line); ``quit``: the person asked to stop the session (``q``)."""

    rank: int
    quit: bool = False
    done: bool = True


@dataclasses.dataclass(frozen=True)
class Ready:
    """The rank collected its files and (if asked) initialised its process group."""

    rank: int
    pid: int
    missing: tuple[str, ...] = ()
    collect_errors: tuple[str, ...] = ()
    #: The rank's CPU seconds (``time.process_time``) when it became ready.
    cpu: float = 0.0


@dataclasses.dataclass(frozen=True)
class Collectives:
    """The answer to :class:`CountCollectives`, from PyTorch's flight recorder.

    ``counts``: group (in words) -> (collectives issued, the last one's op name); None when the
    flight recorder is off (``TORCH_FR_BUFFER_SIZE=0``) or unavailable.
    """

    rank: int
    pid: int
    counts: dict[str, tuple[int, str]] | None


@dataclasses.dataclass(frozen=True)
class RankNote:
    """What the controller must know during a test before the rank dies (outcome/expectations):
    the rank is meant to exit (``code``: ``-N`` a signal, ``N`` an exit code; None: it is not),
    why (``source``: the call or the harness's rule), and the line of an injected fault that
    fired ("" for none: rank/faults.py)."""

    rank: int
    #: The test it belongs to (RunTest.index).
    index: int
    code: int | None
    source: str
    injected: str = ""
    #: The phase the line belongs to in the rank's report ("setup", "call", "teardown").
    when: str = "call"
    #: The process that sent it (a process the test forked shares the rank's pipe).
    pid: int = 0


@dataclasses.dataclass(frozen=True)
class Fatal:
    """The rank cannot serve: its start-up failed or its pytest session ended early."""

    rank: int
    message: str


@dataclasses.dataclass(frozen=True)
class Stopped:
    """The rank tore down its remaining fixtures; ``errors`` holds their teardown failures."""

    rank: int
    errors: tuple[str, ...] = ()
    #: The rank's CPU seconds when its last test ended, and how many tests it served: with
    #: :attr:`Ready.cpu`, its CPU per test (the controller's stats; bench/ reads them).
    cpu: float = 0.0
    tests: int = 0


FromRank = (
    Ready | Reports | Collectives | Fatal | Stopped | RankNote
    | DebugOpen | DebugOutput | DebugRead | DebugClose
)  # fmt: skip
#: The messages of a debugger session (served by the controller's debugrelay.py).
DEBUG_MESSAGES = (DebugOpen, DebugOutput, DebugRead, DebugClose)


def phase_slots(rank: int) -> tuple[int, int]:
    """Indices of ``rank``'s phase and test index in the pool's shared phase array."""
    return 2 * rank, 2 * rank + 1


#: A rank's phases once its test's teardown is over.
DONE_PHASES = frozenset({Phase.FINISHED, Phase.IDLE, Phase.STOPPING})


def finished(phases: Any, rank: int, index: int) -> bool:
    """Whether ``rank`` finished test ``index``, read from the pool's shared phase array: its
    slots name that test in a phase after its teardown, or a later test (indices grow; a rank
    writes the index before the phase)."""
    phase_slot, index_slot = phase_slots(rank)
    at = phases[index_slot]
    return bool(at > index or (at == index and phases[phase_slot] in DONE_PHASES))
