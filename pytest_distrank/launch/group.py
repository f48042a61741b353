"""Launcher mode, one rank's process group: kept, re-created, and checked after each test.

Runs in every rank of a launched world, in the main thread only (the watchdog never touches the
group). The default process group is initialised over the control store's ``data`` connection,
in a key space of its own per initialisation: once before the first distributed test, again when
a test asks for another backend, and again on every rank when a test left any rank's group
destroyed or replaced, or out of step (rank 0's verdict carries a generation number that says
so). The fixtures read ``config.stash[RANK_CONTEXT]``, exactly as in pool mode's ranks.

After a test every rank sends its groups' sequence numbers with its reports; when they disagree,
rank 0 asks every rank for its collective counts from the flight recorder (``count/<test>``),
which the other ranks answer while they wait for anything else (:meth:`GroupKeeper.wait`), and
fails the test on the ranks that issued collectives their peers did not.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest
from pytest import TestReport

from .. import _compat
from .. import fixtures as fixtures_module
from ..outcome.checks import sequences_in_step, unmatched
from ..outcome.reports import unmatched_report
from ..rank.context import RANK_CONTEXT, RankContext
from ..rank.groupstate import collective_counts, flight_mark, flight_records
from ..rank.ownedgroups import twin_of_world
from . import keys
from .channel import ChannelError
from .current import Current
from .report import FRESH_GROUP
from .session import RankSession
from .subworld import World

#: Where a test runs (:meth:`GroupKeeper.ensure`): a sub-world, or for the launched world's tests
#: the index of the latest sub-world test before it (None: none).
Where = World | int | None

#: Bound on the other ranks' answers when rank 0 asks for their collective counts.
COUNT_WAIT = 10.0


#: What ``init_process_group("gloo")`` (``env://``) in a test reads to find its world's store.
MASTER_ENV = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")


def sub_world_master(store: Any, rank: int) -> dict[str, str]:
    """A sub-world's own ``MASTER_ADDR``/``MASTER_PORT`` for a test that re-initialises the
    default group from the environment: a free port on its rank 0's host, which the rank 0 of
    that ``env://`` init serves (not torchrun's agent store, which two sub-worlds would share:
    their keys would meet). Its rank 0 picks it and tells its members through ``store``."""
    if rank == 0:
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        store.set("master", f"{socket.gethostname()} {port}")
    host, port = bytes(store.get("master")).decode().split()
    addr = "127.0.0.1" if host == socket.gethostname() else host
    return {"MASTER_ADDR": addr, "MASTER_PORT": port, "TORCHELASTIC_USE_AGENT_STORE": "False"}


class GroupKeeper:
    """The rank's default process group and what is known about its step (main thread only)."""

    def __init__(self, rank_session: RankSession) -> None:
        self.rs = rank_session
        #: The group's context, as the fixtures see it (None before the first distributed test).
        self.ctx: RankContext | None = None
        #: The generation rank 0's verdicts ask for; a new one re-creates the group everywhere.
        self.gen = 0
        #: How many times this rank initialised a group (each in a key space of its own).
        self.inits = 0
        self.key: tuple[str, int, str] | None = None
        #: The flight recorder's last record when this rank's group was created.
        self.flight_mark = -1
        #: Rank 0: the groups' sequence numbers per rank after the last test found in step.
        self.sequence_base: dict[int, dict[str, int]] = {}
        #: Ranks other than 0: the last distributed test this rank ran (rank 0 may ask about it),
        #: and this rank's wall clock (ns) when it began it.
        self.last_index = -1
        self.last_started_ns = 0
        #: Its rank in that test's world (a sub-world's rank: the keys of the answers name it).
        self.last_rank = rank_session.rank
        #: Rank 0: what the distrank summary says besides the numbers (a group re-created...).
        self.notes: list[str] = []
        #: Called before this keeper destroys a group a harness class made (:mod:`harness`).
        self.end_harness: Callable[[], None] = lambda: None
        #: After a harness class's test: why this rank's class group is not to be trusted ("").
        self.harness_problem: Callable[[], str] = lambda: ""
        #: The test runs without the keeper's group and makes its own (``init_process_group=
        #: False``, DeepSpeed's harness): a group it leaves up is destroyed before the next test
        #: (:meth:`after_test`), not a problem.
        self.own = False
        #: The launcher's rendezvous variables, which a sub-world's tests see replaced.
        self.launched_env = {k: os.environ[k] for k in MASTER_ENV if k in os.environ}
        #: No sub-world's group, context or variables are up: the launched world's, or none yet.
        self.launched = True

    def without_group(
        self, backend: str, session: pytest.Session, index: int, world: World, group: str
    ) -> None:
        """For a test whose group is not the keeper's (``group``, :attr:`plan.Step.group`), on
        the sub-world ``world``: no group up (the test or its class makes its own); a context
        with the test's rank and world size.

        ``harness``: a ``MultiProcContinuousTest`` class's group stays up between its tests in
        one run of batches (same key), as the class's worker keeps it. ``own``
        (``init_process_group=False``) and ``deepspeed`` (the child's part of DeepSpeed's
        harness, which sets its own variables over these): ``RANK``, ``WORLD_SIZE`` and
        ``MASTER_ADDR``/``MASTER_PORT`` are the sub-world's, with a port of its own for every
        test, as a pool serves a store of its own for every test (two tests' ``env://`` keys
        never meet).
        """
        import torch.distributed as dist

        rank, size = world.members.index(self.rs.rank), world.size
        name = world.group_id() if group == "harness" else f"{world.group_id()}.t{index}"
        key = (f"{group}:{backend}", self.gen, name)
        if self.key == key and self.healthy():
            return
        self.end_harness()
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        old = self.ctx
        self.own, self.launched = group != "harness", False
        if self.own:
            master = sub_world_master(self.rs.channel.pg_store(f"own.{name}"), rank)
            self._environ(rank, size, master)
        store = self.rs.channel.user_store
        self.ctx = RankContext(rank, size, self.rs.launch.local_rank, backend, store, None)
        self.rs.config.stash[RANK_CONTEXT] = self.ctx
        self.flight_mark = flight_mark()
        self.key = key
        if old is not None:
            self._reset_group_fixtures(session, (old.rank, old.world_size) != (rank, size))

    def _environ(self, rank: int, size: int, master: dict[str, str]) -> None:
        """Code under test that reads the environment sees its world: ``RANK``, ``WORLD_SIZE``,
        and ``master`` (:data:`MASTER_ENV`: ``env://`` finds its own world's store); LOCAL_RANK
        stays the node-local GPU (DeviceMesh picks its device from it)."""
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(size)
        for name in MASTER_ENV:
            if name in master:
                os.environ[name] = master[name]
            else:
                os.environ.pop(name, None)

    def leave_sub_world(self) -> None:
        """Launched rank 0, before a test it runs alone (no ``world_size`` marker): the test sees
        what it would see first in its file, whatever ran before it: no default group of a
        sub-world's (the plugin's, one a test made and left up, a harness class's), no rank
        context, and the launcher's ``RANK``, ``WORLD_SIZE`` and :data:`MASTER_ENV`, as the
        launched world's tests get them back (:meth:`ensure`). The other members of that
        sub-world keep theirs until their next test, whose group is another (a run of batches
        that share a group is never split by a test of rank 0 alone: :func:`subworld.schedule`),
        so every member replaces it there, as rank 0 creates its own."""
        import torch.distributed as dist

        if self.launched:
            return
        self.end_harness()
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        self._environ(self.rs.rank, self.rs.world_size, self.launched_env)
        with contextlib.suppress(KeyError):
            del self.rs.config.stash[RANK_CONTEXT]
        self.key, self.own, self.launched = None, False, True

    def after_test(self, failed: bool) -> None:
        """After a test that made its own group (:attr:`own`) and failed on this rank: destroy
        the group it left up now, as a pool's rank does: that is what errors out a peer left
        waiting in a collective this rank will never enter (DeepSpeed's harness relies on it:
        its ``_dist_destroy`` barrier after the test). A test that passed leaves its group to
        the next test's set-up, when every member is past this test."""
        import torch.distributed as dist

        if self.own and failed and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()

    def healthy(self) -> bool:
        """Is the default group still the one this rank initialised?"""
        import torch.distributed as dist

        ctx = self.ctx
        if ctx is not None and ctx.pg is None:
            # A harness class leaves no group up; a group an "own" test left is the next
            # test's to destroy (every member is past this test then), as a pool destroys it.
            return self.own or not dist.is_initialized()
        return ctx is not None and dist.is_initialized() and dist.group.WORLD is ctx.pg

    def ensure(
        self,
        backend: str,
        session: pytest.Session,
        index: int,
        world: Where = None,
        group: str = "plugin",
    ) -> None:
        """Initialise the default group for test ``index``: of the launched world, or of the
        sub-world ``world`` (its members' ranks and size); unless it is up already.

        ``world`` for a sub-world's test; for the launched world's, the latest sub-world test
        before it (its group replaced the world's on some ranks: every rank re-creates it).
        Every group gets a key space of its own in the store, named after the test that creates
        it (every member creates it in the same test) and the sub-world's id from rank 0's plan.
        A test whose ``group`` is not the plugin's makes its own (:meth:`without_group`).
        """
        import torch.distributed as dist

        if group != "plugin" and isinstance(world, World):
            self.without_group(backend, session, index, world, group)
            return
        rs = self.rs
        if isinstance(world, World):
            rank, size, name = world.members.index(rs.rank), world.size, world.group_id()
        else:
            rank, size, name = rs.rank, rs.world_size, f"pg.after{-1 if world is None else world}"
        key = (backend, self.gen, name)
        if self.key == key and self.healthy():
            return
        old = self.ctx
        self.end_harness()
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        device_id = None
        local_rank = rs.launch.local_rank
        if "nccl" in backend:
            import torch

            torch.cuda.set_device(local_rank)
            device_id = torch.device("cuda", local_rank)
        self.inits += 1
        self.key = None
        store = rs.channel.pg_store(f"{name}.t{index}")
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=size, device_id=device_id
        )
        twin_of_world()  # every rank is here: a rank that skips a check is named at once
        master = sub_world_master(store, rank) if isinstance(world, World) else self.launched_env
        self._environ(rank, size, master)
        self.own, self.launched = False, not isinstance(world, World)
        self.ctx = RankContext(
            rank, size, local_rank, backend, rs.channel.user_store, dist.group.WORLD
        )
        self.flight_mark = flight_mark()
        rs.config.stash[RANK_CONTEXT] = self.ctx
        if old is not None:
            moved = (old.rank, old.world_size) != (rank, size)
            self._reset_group_fixtures(session, moved)
        rs.config.hook.pytest_distrank_rank_setup(config=rs.config, rank=rank, world_size=size)
        self.key = key

    def _reset_group_fixtures(self, session: pytest.Session, moved: bool) -> None:
        """The session-scoped ``pg``, ``backend`` and ``device`` hold the old group (and, when
        the rank ``moved`` to another world, ``rank`` and ``world_size`` its old place): finish
        them (and the user's fixtures that depend on them), so that the next test gets the new
        one."""
        names = ("pg", "backend", "device", *(("rank", "world_size") if moved else ()))
        for name in names:
            for fixturedef in _compat.session_fixturedefs(session, name):
                if getattr(fixturedef.func, "__module__", None) != fixtures_module.__name__:
                    continue
                try:
                    _compat.finish_fixture(fixturedef, session)
                except BaseException:
                    self.rs.log(
                        f"pytest-distrank: {self.rs.launch.label()}: error tearing down fixtures "
                        f"that depend on {name!r} after the process group was replaced:\n"
                        + traceback.format_exc()
                    )

    # -- ranks other than 0: waiting, and answering rank 0 meanwhile -----------------------------

    def wait(self, wanted: list[str]) -> str:
        """Ranks other than 0: the first of ``wanted`` keys to exist (no deadline: rank 0's
        heartbeat bounds it), answering meanwhile rank 0's requests about this rank's last test:
        its collective counts (:meth:`check_collectives`) and, when the test left peers stuck,
        its flight records (:func:`frrecords.peer_records`)."""
        channel = self.rs.channel
        sent_records = False
        while True:
            index = self.last_index
            asked = [keys.count_request(index)] if index >= 0 else []
            if index >= 0 and not sent_records:
                asked.append(keys.records_request(index))
            found = channel.wait_any([*wanted, *asked], None, watch_rank0=True)
            assert found is not None  # no deadline: it returns a key or raises
            if found not in asked:
                return found
            if found == keys.records_request(index):
                raw = flight_records()
                data: keys.Records = {
                    "records": raw.decode("utf-8") if raw else "",
                    "since_ns": self.last_started_ns,
                }
                channel.put(keys.records(index, self.last_rank), data)
                sent_records = True
                continue
            answer: keys.Counts = {"counts": collective_counts(self.flight_mark)}
            channel.put(keys.counts(index, self.last_rank), answer)
            self.last_index = -1

    # -- rank 0: the verdict on a test, and are the groups in step after it? -------------------

    def publish_verdict(self, index: int, ended: str | None, session: pytest.Session) -> None:
        """Rank 0: go on, stop (``-x``, ``--maxfail``) or abort (``ended``: a rank was left stuck
        or stopped serving) after test ``index``, with the group generation the next test runs
        in; the other ranks wait for it (:meth:`wait`)."""
        verdict: keys.Verdict
        if ended is not None:
            verdict = {"action": "abort", "reason": ended, "gen": self.gen}
        elif session.shouldfail or session.shouldstop:
            reason = str(session.shouldfail or session.shouldstop)
            verdict = {"action": "stop", "reason": reason, "gen": self.gen}
        else:
            verdict = {"action": "continue", "reason": "", "gen": self.gen}
        channel = self.rs.channel
        try:
            if verdict["action"] != "continue" and not channel.has(keys.STOPPED):
                channel.put(keys.STOPPED, verdict)
            channel.put(keys.verdict(index), verdict)
        except ChannelError as exc:
            self.rs.lost(exc)

    def check_collectives(self, cur: Current, per_rank: dict[int, list[TestReport]]) -> bool:
        """Rank 0, after a test that every rank finished with its group intact: did the members of
        each group issue the same collectives? Returns False when the group must be created anew.

        As in pool mode (:mod:`outcome.checks`): sequence numbers first (sent with every rank's last
        reports), the flight recorder only when they differ (a second round through the control
        store, :func:`count_collectives`); the rank with more collectives fails the test.
        """
        if sequences_in_step(cur.sequences, self.sequence_base):
            self.sequence_base = dict(cur.sequences)
            return True
        item = cur.item
        counts = self.count_collectives(cur.index, COUNT_WAIT)
        if counts is None:
            self.notes.append(
                f"process group created anew after {item.nodeid}: the sequence numbers of a group "
                "differ between ranks (point-to-point ops, or a collective only some ranks issued) "
                "and the flight recorder could not tell which (TORCH_FR_BUFFER_SIZE=0?)"
            )
            return False
        found = unmatched(counts)
        for rank, _, crash in found:
            ws, now = self.rs.world_size, time.time()
            report = unmatched_report(item.nodeid, item.location, rank, ws, crash, FRESH_GROUP, now)
            per_rank.setdefault(rank, []).append(report)
        if found:
            return False
        self.sequence_base = dict(cur.sequences)
        return True

    def count_collectives(
        self, index: int, wait: float
    ) -> dict[int, dict[str, tuple[int, str]]] | None:
        """Rank 0: every rank's collectives per group after test ``index``, from the flight
        recorder; None when a rank's recorder is off or a rank did not answer within ``wait``
        seconds."""
        channel = self.rs.channel
        own = collective_counts(self.flight_mark)
        if own is None:
            return None
        counts: dict[int, dict[str, tuple[int, str]]] = {0: own}
        try:
            channel.put(keys.count_request(index), 1)
            end = time.monotonic() + wait
            for rank in range(1, self.rs.world_size):
                key = keys.counts(index, rank)
                if channel.wait_any([key], end) is None:
                    return None
                answer = channel.take(key, keys.read_counts)["counts"]
                if answer is None:
                    return None
                counts[rank] = answer
        except ChannelError:
            return None
        return counts
