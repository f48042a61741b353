"""Unit tests of launch/widefix.py: which sub-world tests do not run because a fixture wider
than a test uses the process group (its teardown's collective would deadlock across sub-worlds).

The refusal judges what runs, so it gets properties over random runs: every sub-world test that
could meet such a fixture is refused, and nothing else is.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.launch.widefix import SESSION_WIDE, WIDE, refusals

SCOPES = st.sampled_from(WIDE)
tests = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(1, 3)),  # world size on a sub-world, or not one
        st.dictionaries(st.sampled_from(["fa", "fb", "fc"]), SCOPES, max_size=2),
        st.sampled_from(["m1.py", "m2.py", "m3.py"]),
    ),
    max_size=8,
)


def test_a_module_fixture_on_the_group_keeps_its_modules_sub_world_tests_out() -> None:
    """Hostile pass (B): a module fixture whose teardown runs dist.barrier(), used by a size-2
    test, then a size-4 test: the teardown ran in another group on some ranks (deadlock)."""
    got = refusals([2, None, 2], [{"modfix": "module"}, {}, {}], ["b.py", "b.py", "c.py"], 4)
    assert list(got) == [0]
    assert got[0].startswith("fixture modfix (wider than a test, used in b.py) requests")
    assert "world size 2 in a launched world of 4" in got[0] and "pool mode" in got[0]


def test_a_session_fixture_on_the_group_keeps_every_sub_world_test_out() -> None:
    """Hostile pass (K): a session fixture with pg and a barrier in its teardown, a size-4 test
    that uses it, then a size-2 test that does not: ranks 2, 3 tore it down alone."""
    got = refusals([None, 2], [{"sess": "session"}, {}], ["k.py", "other.py"], 4)
    assert list(got) == [1] and "fixture sess (wider than a test, used in this run)" in got[1]


@given(tests, st.integers(2, 8))
def test_exactly_the_sub_world_tests_that_could_meet_a_wide_fixture_are_refused(
    run: list[tuple[int | None, dict[str, str], str]], ws: int
) -> None:
    sizes = [size for size, _, _ in run]
    wide = [got for _, got, _ in run]
    modules = [module for _, _, module in run]
    got = refusals(sizes, wide, modules, ws)
    whole = any(scope in SESSION_WIDE for w in wide for scope in w.values())
    for i, (size, _, module) in enumerate(run):
        local = any(
            scope not in SESSION_WIDE for w, m in zip(wide, modules, strict=True) if m == module
            for scope in w.values()
        )  # fmt: skip
        assert (i in got) == (size is not None and (whole or local)), (i, run)
        if i in got:
            assert f"world size {size} in a launched world of {ws}" in got[i]
