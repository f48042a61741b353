"""Is a pool fit for its next test? The checks after each test, and what their failures say.

Runs where a test's outcome is decided: in the controller (pool mode) and in rank 0 of a launched
world (launcher mode, :mod:`launch.gather` and :mod:`launch.group`). Pure logic over what ranks
sent: no processes, no torch. A pool whose ranks disagree (a collective only some ranks issued,
reports from a process the test forked) is replaced, and the test that left it so fails with the
reason, so that the next, innocent test never inherits the damage.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from .merge import ranks_words
from .records import Reports, RunTest

#: Per rank: group (in words) -> sequence number, as in ``Reports.sequence``.
Sequences = Mapping[int, Mapping[str, int]]


def sequences_in_step(after: Sequences, base: Sequences) -> bool:
    """Did each group's sequence number grow by the same amount on each of its members?

    Sequence numbers count collectives and point-to-point ops; they are compared as increments
    since the last test found in step, because a warm pool's groups outlive tests. A group
    created during the test starts from 0.
    """
    deltas: dict[str, set[int]] = {}
    for rank, groups in after.items():
        before = base.get(rank, {})
        for group, seq in groups.items():
            deltas.setdefault(group, set()).add(seq - before.get(group, 0))
    return all(len(values) <= 1 for values in deltas.values())


def unmatched(counts: Mapping[int, Mapping[str, tuple[int, str]]]) -> list[tuple[int, str, str]]:
    """``(rank, group, crash line)`` for each rank that issued more collectives on a group than
    its peers; :func:`reports.unmatched_report` writes each one's failure."""
    by_group: dict[str, dict[int, tuple[int, str]]] = {}
    for rank, groups in counts.items():
        for group, count in groups.items():
            by_group.setdefault(group, {})[rank] = count
    out = []
    for group, by_rank in by_group.items():
        low = min(n for n, _ in by_rank.values())
        for rank, (n, op) in sorted(by_rank.items()):
            if n == low:
                continue
            more = n - low
            word = "collective" if more == 1 else "collectives"
            crash = (
                f"issued {more} more {word} than its peers on {group}: "
                f"an unmatched collective (its last: {op or 'unknown'})"
            )
            out.append((rank, group, crash))
    return out


def is_own(pid: int, message: Reports, test: RunTest) -> bool:
    """Reports of this very test, from the rank process itself (not a fork of it)."""
    return message.pid == pid and message.index == test.index and message.nodeid == test.nodeid


def foreign_crash(pid: int, sender: int, index: int, nodeid: str, running: int) -> str:
    """The crash line for reports of test #``index`` (``nodeid``) sent by pid ``sender`` to a
    rank whose pid is ``pid``, while test #``running`` runs."""
    if sender != pid:
        return f"sent reports from pid {sender}, not its own ({pid}): a process forked by the test?"
    return f"sent reports for test #{index} ({nodeid}) while test #{running} was running"


def forked_crash(pids: Sequence[int]) -> str:
    """The crash line for a test that left forks ``pids`` of the rank running its own code."""
    listed = ", ".join(str(p) for p in pids)
    return (
        f"forked pid {listed} which still ran the rank's own code when the test ended: "
        "it returns into pytest and runs the rest of the test again"
    )


#: Ends the words of what a rank named and did not restore (rank/processstate.py).
NOT_RESTORED = " (not restored)"


def leftover_lines(
    nodeid: str, per_rank: Mapping[int, Sequence[str]], subject: str = ""
) -> list[str]:
    """The summary lines of what a test left behind in its warm ranks (rank/leftovers.py), one
    per set of ranks that left the same: ``leftovers: FILE::test_c left X set and the default
    dtype float64 on ranks 0, 1 (restored)``. Daemon threads are named, not restored.
    ``subject``: who left it, if not the test."""
    by_words: dict[str, list[int]] = {}
    per_rank = merged_ports(per_rank)
    for rank in sorted(per_rank):
        for words in per_rank[rank]:
            by_words.setdefault(words, []).append(rank)
    by_ranks: dict[tuple[int, ...], list[str]] = {}
    for words, ranks in by_words.items():
        by_ranks.setdefault(tuple(ranks), []).append(words)
    lines = []
    for same, all_words in by_ranks.items():
        on = ranks_words(same)
        still = [w for w in all_words if w.endswith((" still running", NOT_RESTORED))]
        restored = [w for w in all_words if w not in still]
        parts = [f"{and_words(restored)} on {on} (restored)"] if restored else []
        parts += [f"{and_words(still)} on {on}"] if still else []
        lines.append(f"leftovers: {subject or nodeid} left {'; '.join(parts)}")
    return lines


#: The words of a socket a rank left listening (rank/processstate.py ``socket_words``):
#: ``a socket listening on 127.0.0.1:35389`` or ``... on port 35389 (IPv6)``, then what follows.
_SOCKET = re.compile(
    r"(?P<head>a socket listening on (?:port )?)(?:(?P<host>[^\s:]+):)?(?P<port>\d+)"
    r"(?P<tail>(?: \(IPv6\))?(?: \(.*)?)$"
)


def merged_ports(per_rank: Mapping[int, Sequence[str]]) -> dict[int, Sequence[str]]:
    """``per_rank`` with the sockets that several ranks left listening on the same host, with
    the same words around them, named once for all of them with each rank's ports (every rank of
    a DTensor test leaves one, each on a port of its own: one line, not one per rank):
    ``a socket listening on 127.0.0.1:35389 (rank 0), :35391 (rank 1) (not restored)``."""
    parsed = {rank: [(words, _socket_key(words)) for words in all_words]
              for rank, all_words in per_rank.items()}  # fmt: skip
    ports: dict[tuple[str, str, str], dict[int, list[str]]] = {}
    for rank, entries in parsed.items():
        for _, (key, port) in entries:
            if key is not None:
                ports.setdefault(key, {}).setdefault(rank, []).append(port)
    shared = {key: by_rank for key, by_rank in ports.items() if len(by_rank) > 1}
    if not shared:
        return dict(per_rank)
    return {
        rank: [words for words, (key, _) in entries if key not in shared]
        + [_socket_words(key, by_rank) for key, by_rank in shared.items() if rank in by_rank]
        for rank, entries in parsed.items()
    }


def _socket_key(words: str) -> tuple[tuple[str, str, str] | None, str]:
    """((the words before the host, the host, the words after the port), the port) of a
    socket's words; (None, "") for other words."""
    found = _SOCKET.match(words)
    if found is None:
        return None, ""
    return (found["head"], found["host"] or "", found["tail"]), found["port"]


def _socket_words(key: tuple[str, str, str], by_rank: Mapping[int, list[str]]) -> str:
    head, host, tail = key
    colon = ":" if host else ""
    each = [
        " and ".join(f"{colon}{port}" for port in by_rank[rank]) + f" (rank {rank})"
        for rank in sorted(by_rank)
    ]
    return f"{head}{host}{', '.join(each)}{tail}"


def leftover_notes(
    nodeid: str,
    left: Mapping[int, Sequence[str]],
    between: Mapping[int, tuple[str, Sequence[str]]],
) -> list[str]:
    """The summary lines of a test's leftovers (:func:`leftover_lines`), after those of what
    changed in its ranks between their previous test and it, outside both (rank/between.py:
    ``leftovers: between FILE::test_b and FILE::test_c, code outside both tests (...) left
    ...``)."""
    by_previous: dict[str, dict[int, Sequence[str]]] = {}
    for rank, (previous, words) in between.items():
        by_previous.setdefault(previous, {})[rank] = words
    return [
        *(
            line
            for previous, words in by_previous.items()
            for line in leftover_lines(nodeid, words, BETWEEN_SUBJECT.format(previous, nodeid))
        ),
        *leftover_lines(nodeid, left),
    ]


#: Who left what changed between two tests (rank/between.py).
BETWEEN_SUBJECT = (
    "between {} and {}, code outside both tests (a fixture torn down there, a hook, a __del__)"
)


def and_words(words: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
