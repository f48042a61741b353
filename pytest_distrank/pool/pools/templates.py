"""Rank templates: fresh ranks forked in milliseconds instead of started from nothing (#40).

Runs in the controller (pool mode), for :class:`~poolset.PoolSet`. A pool of fresh ranks (an
isolated test, a class that asks for fresh ranks, a replay, a harness test's fresh retry) used
to cost a whole pytest start in every rank. Here the first such pool of a kind (its key without
the isolation number) starts a *template* per rank: a rank process that configures pytest,
loads no conftest.py and imports no test module, sends Ready at its session's start, and then
only forks (pool/worker/template.py). Every fresh pool of that kind is forked from them: each
new rank costs a fork, its conftests, its collection and its process group's start.

:class:`ForkedRank` is the controller's handle of such a rank (it is the template's child, not the
fork server's): the template reaps it and writes its exit status into a pipe whose read end is
the handle's sentinel, as multiprocessing's fork server does for the processes it forks.

Templates are used only where a fork is the same as a start: the fork server's start method, no
coverage measurement (a rank's coverage starts before its pytest session), no debugger
settings, no simulated world, no GPU (a template must not have touched CUDA), and
``--distrank-fresh-ranks=fork``, the default (``start``: every fresh rank starts from nothing).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
from collections.abc import Callable, Sequence
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any

from ..onetest.ranks import Rank
from ..protocol import STATUS_BYTES, Fork, Forked, RankConfig
from .poolkey import PoolKey

#: How a pool asks a template for one of its ranks (:func:`fork_from`): the answer, when taken.
AskFork = Callable[[RankConfig, Connection], Callable[[], "ForkedRank"]]
#: How long a template gets to answer a fork request.
FORK_WAIT = 30.0
#: Kinds of pool whose templates are kept at once (the oldest is stopped beyond that).
KEEP = 2


class ForkedRank:
    """A rank forked from a template, as the pool handles its processes (``pid``, ``sentinel``,
    ``exitcode``, ``join``, ``is_alive``, ``close``)."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self.sentinel = status_fd
        self._exitcode: int | None = None

    @property
    def exitcode(self) -> int | None:
        if self._exitcode is None and self.sentinel >= 0:
            self.join(0)
        return self._exitcode

    def join(self, timeout: float | None = None) -> None:
        if self._exitcode is not None or self.sentinel < 0:
            return
        ready, _, _ = select.select([self.sentinel], [], [], timeout)
        if ready:
            data = os.read(self.sentinel, STATUS_BYTES)
            # No status: the template died first (its children then died by their parent-death
            # signal, unreaped by it): a kill.
            self._exitcode = int.from_bytes(data, "little", signed=True) if data else -9

    def is_alive(self) -> bool:
        return self.exitcode is None

    def close(self) -> None:
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1


def kind_of(key: PoolKey) -> PoolKey:
    """What makes two fresh pools forkable from the same templates: their key without its
    isolation number (a template collects nothing: each fork collects its own pool's files)."""
    return dataclasses.replace(key, isolated=0)


class TemplateError(Exception):
    """A template could not fork (it died, or did not answer in time); says which."""


def fork_from(pool: Any) -> AskFork:
    """The pool's way to start a rank: ask the template pool ``pool``'s rank to fork it, and
    return how to take the answer (which raises :class:`TemplateError`). A pool asks all its
    templates first, then takes their answers: its ranks fork at once, not one after the other."""

    def ask(cfg: RankConfig, conn: Connection) -> Callable[[], ForkedRank]:
        template = pool.ranks[cfg.rank]
        status_r, status_w = os.pipe()
        try:
            template.conn.send(Fork(cfg))
            reduction.send_handle(template.conn, conn.fileno(), template.pid)
            reduction.send_handle(template.conn, status_w, template.pid)
            failed: BaseException | None = None
        except OSError as exc:
            failed = exc
        finally:
            os.close(status_w)

        def take() -> ForkedRank:
            answer: object = failed
            if failed is None:
                try:
                    answer = template.conn.recv() if template.conn.poll(FORK_WAIT) else None
                except (OSError, EOFError) as exc:
                    answer = exc
            if not isinstance(answer, Forked) or answer.pid <= 0:
                os.close(status_r)
                why = answer.why if isinstance(answer, Forked) else f"no answer ({answer!r})"
                raise TemplateError(f"the template of rank {cfg.rank} did not fork it: {why}")
            return ForkedRank(answer.pid, status_r)

        return take

    return ask


def fork_all(configs: Sequence[RankConfig], context: Any, ask: AskFork, ranks: list[Rank]) -> None:
    """Fork a pool's ranks: ask every rank's template first, then take the answers, so that
    the ranks fork together, not one after the other. Every answer asked for is taken, even
    when asking the next failed (a template's next answer would be stale); a rank that did not
    fork raises (TemplateError) once the others' answers are in: those that did are in
    ``ranks``, for the pool's kill."""
    asked = []
    try:
        for cfg in configs:
            parent_conn, child_conn = context.Pipe(duplex=True)
            try:
                asked.append((cfg, parent_conn, ask(cfg, child_conn)))
            finally:
                child_conn.close()
    finally:
        failure = _take_all(asked, ranks)
    if failure is not None:
        raise failure


def _take_all(
    asked: list[tuple[RankConfig, Any, Callable[[], ForkedRank]]], ranks: list[Rank]
) -> BaseException | None:
    failure: BaseException | None = None
    for cfg, parent_conn, take in asked:
        try:
            process = take()
        except BaseException as exc:
            failure = failure or exc
            parent_conn.close()
            continue
        ranks.append(Rank(cfg.rank, process, parent_conn, cfg.log_path, process.pid))
    return failure


class Templates:
    """The session's templates, by kind of pool; each kind is a pool that serves no test."""

    def __init__(self) -> None:
        self.live: dict[PoolKey, Any] = {}
        #: Kinds whose templates could not fork, and why: their fresh ranks start from nothing.
        self.refused: dict[PoolKey, str] = {}

    def get(self, kind: PoolKey) -> Any | None:
        pool = self.live.get(kind)
        if pool is not None and any(r.process.exitcode is not None for r in pool.ranks):
            self.drop(kind)  # a template died: the next pool of its kind makes new ones
            return None
        return pool

    def add(self, kind: PoolKey, pool: Any) -> list[Any]:
        """Keep ``pool`` for ``kind``; return the templates to stop (the oldest beyond KEEP)."""
        self.live[kind] = pool
        old = list(self.live)[:-KEEP]
        return [self.live.pop(k) for k in old]

    def drop(self, kind: PoolKey) -> None:
        pool = self.live.pop(kind, None)
        if pool is not None:
            pool.kill()

    def take_all(self) -> list[Any]:
        pools = list(self.live.values())
        self.live.clear()
        return pools

    def kill_all(self) -> None:
        for pool in self.take_all():
            with contextlib.suppress(Exception):
                pool.kill()
