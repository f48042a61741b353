"""Unit, property: a rank's peers read from the pool's shared phase array whether it finished a
test (pool/protocol.py ``finished``, what ``rankgroup.meet_before_destroy`` waits on), over
generated lives of a pool: each rank writes its slots as the worker does (the index, then the
phase) through tests it receives in turn, in any interleaving of the ranks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.pool.protocol import Phase, finished, phase_slots

#: A rank's writes through one test, as pool/worker/main.py makes them (RECEIVED with the index).
LIFE = (Phase.RECEIVED, Phase.SETUP, Phase.CALL, Phase.TEARDOWN, Phase.FINISHED, Phase.IDLE)
#: From its teardown's end on, the test is finished on that rank.
FINISHED_AT = LIFE.index(Phase.FINISHED)


@given(
    st.integers(2, 4).flatmap(
        lambda ws: st.tuples(
            st.just(ws),
            st.integers(1, 3),
            st.lists(st.integers(0, ws - 1), min_size=0, max_size=60),
        )
    )
)
def test_a_rank_reads_finished_exactly_once_its_teardown_is_over(
    pool: tuple[int, int, list[int]],
) -> None:
    """Rule: for every test of a pool and every rank, ``finished`` reads False until that
    rank wrote FINISHED for that test, and True from then on (IDLE, a later test), whatever the
    other ranks do; before its first test (zeroed array, Ready's IDLE) no test reads finished."""
    world_size, tests, steps = pool
    phases = [0] * (2 * world_size)
    for rank in range(world_size):
        phases[phase_slots(rank)[0]] = int(Phase.IDLE)  # Ready
    progress = [(0, len(LIFE) - 1)] * world_size  # (test index, position in LIFE): idle
    first = 1  # the controller's first test index
    for rank in steps:
        index, at = progress[rank]
        if at == len(LIFE) - 1:  # idle: the next test comes (no test past the last)
            if index == first + tests - 1:
                continue
            # a test is sent only once every rank finished the one before
            if any(i < index or (i == index and a < FINISHED_AT) for i, a in progress):
                continue
            index, at = max(index + 1, first), 0
        else:
            at += 1
        progress[rank] = (index, at)
        phase_slot, index_slot = phase_slots(rank)
        if at == 0:
            phases[index_slot] = index  # the index first: the phase below is this test's
        phases[phase_slot] = int(LIFE[at])
        for peer, (peer_index, peer_at) in enumerate(progress):
            for test in range(first, first + tests):
                done = peer_index > test or (peer_index == test and peer_at >= FINISHED_AT)
                assert finished(phases, peer, test) == done, (peer, test, progress)


def test_a_rank_that_stops_after_a_test_finished_it() -> None:
    phases = [0] * 4
    phase_slot, index_slot = phase_slots(1)
    phases[index_slot], phases[phase_slot] = 5, int(Phase.STOPPING)
    assert finished(phases, 1, 5) and finished(phases, 1, 4) and not finished(phases, 1, 6)
    phases[phase_slot] = int(Phase.TEARDOWN)
    assert not finished(phases, 1, 5)
