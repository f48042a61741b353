"""Unit: sockets several ranks left listening are named once with each rank's ports
(outcome/checks.py ``merged_ports``, used by ``leftover_lines``)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence

from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.outcome.checks import leftover_lines, merged_ports

NOT_RESTORED = " (not restored)"
HINT = " (a process group destroyed after the test listens until freed: ...)"


def test_one_socket_on_every_rank_is_one_line() -> None:
    """PyTorch's DTensor tests: every rank keeps a group listening, each on its own port."""
    left = {
        r: (f"a socket listening on 127.0.0.1:{35389 + 2 * r}{NOT_RESTORED}",) for r in range(4)
    }
    assert leftover_lines("t.py::test_d", left) == [
        "leftovers: t.py::test_d left a socket listening on 127.0.0.1:35389 (rank 0), :35391 "
        "(rank 1), :35393 (rank 2), :35395 (rank 3) (not restored) on ranks 0-3"
    ]


def test_a_socket_on_one_rank_keeps_its_words() -> None:
    left = {0: (f"a socket listening on 127.0.0.1:1234{NOT_RESTORED}", "X set")}
    assert leftover_lines("t.py::t", left) == [
        "leftovers: t.py::t left X set on rank 0 (restored); a socket listening on "
        "127.0.0.1:1234 (not restored) on rank 0"
    ]


def test_ipv6_and_several_ports_of_one_rank() -> None:
    left = {
        0: (f"a socket listening on port 5 (IPv6){NOT_RESTORED}",),
        1: (
            f"a socket listening on port 7 (IPv6){NOT_RESTORED}",
            f"a socket listening on port 8 (IPv6){NOT_RESTORED}",
        ),
    }
    assert leftover_lines("t.py::t", left) == [
        "leftovers: t.py::t left a socket listening on port 5 (rank 0), 7 and 8 (rank 1) (IPv6) "
        "(not restored) on ranks 0, 1"
    ]


def test_other_words_around_a_socket_keep_them_apart() -> None:
    """A hint on one rank's socket and not on the other's: two lines, nothing merged wrongly."""
    left = {
        0: (f"a socket listening on 127.0.0.1:1{HINT}{NOT_RESTORED}",),
        1: (f"a socket listening on 127.0.0.1:2{NOT_RESTORED}",),
    }
    assert merged_ports(left) == left


HOSTS = st.sampled_from(["127.0.0.1:", "0.0.0.0:", ""])  # "": IPv6, whose words have no host
TAILS = st.sampled_from([NOT_RESTORED, HINT + NOT_RESTORED])
OTHER = st.sampled_from(["X set", "grad mode off", "daemon thread 't' still running"])


def _socket(host: str, port: int, tail: str) -> str:
    return (
        f"a socket listening on {host}{port}{tail}"
        if host
        else (f"a socket listening on port {port} (IPv6){tail}")
    )


SOCKETS = st.builds(_socket, HOSTS, st.integers(1, 65535), TAILS)
PER_RANK = st.dictionaries(
    st.integers(0, 7), st.lists(st.one_of(SOCKETS, OTHER), max_size=4), max_size=8
)
#: A socket's words, merged (``PORT [and PORT] (rank R), ...``) or one rank's (``HOST:PORT``).
_MERGED = re.compile(r"(a socket listening on (?:port )?)(?:([^\s:]+):)?\d.*\(rank \d+\)(.*)$")
_EACH = re.compile(r":?(\d+(?: and :?\d+)*) \(rank (\d+)\)")
_SINGLE = re.compile(r"(a socket listening on (?:port )?)(?:([^\s:]+):)?(\d+)(.*)$")
Socket = tuple[int, str, str, str, str]


def _sockets(per_rank: Mapping[int, Sequence[str]]) -> Counter[Socket]:
    """(rank, words before the host, host, port, words after) of every socket named."""
    found: Counter[Socket] = Counter()
    for rank, all_words in per_rank.items():
        for words in all_words:
            merged = _MERGED.match(words) if "(rank " in words else None
            if merged is not None:
                for ports, owner in _EACH.findall(words):
                    if int(owner) == rank:  # each rank holds the words; counted on its own
                        for port in re.findall(r"\d+", ports):
                            found[(rank, merged[1], merged[2] or "", port, merged[3])] += 1
            elif (one := _SINGLE.match(words)) is not None:
                found[(rank, one[1], one[2] or "", one[3], one[4])] += 1
    return found


@given(PER_RANK)
def test_merging_names_every_socket_once_and_keeps_every_other_word(
    per_rank: dict[int, list[str]],
) -> None:
    merged = merged_ports(per_rank)
    assert set(merged) == set(per_rank)
    for rank, words in per_rank.items():
        # Other words are untouched, on the same rank.
        others = Counter(w for w in words if not w.startswith("a socket listening"))
        assert Counter(w for w in merged[rank] if not w.startswith("a socket listening")) == others
    assert _sockets(merged) == _sockets(per_rank)
    # A merged socket's words are the same string on every rank they name: one line for them.
    for named in merged.values():
        for w in named:
            for _, owner in _EACH.findall(w):
                assert w in merged[int(owner)]
    assert len(leftover_lines("t.py::t", merged)) <= max(1, sum(len(w) for w in per_rank.values()))
