"""Unit: rank templates without processes: the forked rank's handle reads its exit status from
the template's pipe, the set keeps at most KEEP kinds (pool/pools/templates.py), dropping a kind
whose template died; what a fork collects (pool/worker/template.py)."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.pool.pools.poolkey import PoolKey
from pytest_distrank.pool.pools.templates import KEEP, ForkedRank, Templates, kind_of
from pytest_distrank.pool.worker.template import collection_args


@pytest.mark.parametrize(("written", "code"), [(0, 0), (3, 3), (-11, -11), (None, -9)])
def test_a_forked_ranks_exit_status_comes_from_its_templates_pipe(
    written: int | None, code: int
) -> None:
    """The template writes the status when it reaps the rank; a pipe closed with nothing in it
    (the template died first, and the rank with it by its parent-death signal) reads as a kill."""
    read, write = os.pipe()
    rank = ForkedRank(4242, read)
    assert rank.exitcode is None and rank.is_alive()
    if written is not None:
        os.write(write, written.to_bytes(4, "little", signed=True))
    os.close(write)
    rank.join(1.0)
    assert rank.exitcode == code and not rank.is_alive()
    rank.close()
    assert rank.sentinel == -1 and rank.exitcode == code


def _pool(alive: bool = True) -> Any:
    killed: list[bool] = []
    process = SimpleNamespace(exitcode=None if alive else 1)
    return SimpleNamespace(
        ranks=[SimpleNamespace(process=process)], kill=lambda: killed.append(True), killed=killed
    )


def test_the_set_keeps_the_newest_kinds_and_drops_a_dead_template() -> None:
    templates = Templates()
    kinds = [PoolKey(2 + i, "gloo", True) for i in range(KEEP + 1)]
    pools = [_pool() for _ in kinds]
    assert templates.add(kinds[0], pools[0]) == []
    for kind, pool in zip(kinds[1:KEEP], pools[1:KEEP], strict=True):
        assert templates.add(kind, pool) == []
    assert templates.add(kinds[KEEP], pools[KEEP]) == [pools[0]]  # the oldest, to stop
    assert templates.get(kinds[0]) is None and templates.get(kinds[KEEP]) is pools[KEEP]
    dead = _pool(alive=False)
    templates.add(kinds[0], dead)
    assert templates.get(kinds[0]) is None and dead.killed == [True]
    assert kinds[0] not in templates.live


def test_fresh_pools_of_one_key_but_their_isolation_are_one_kind() -> None:
    """A template collects nothing: pools of any files share it; the isolation number is not
    part of the kind, the world size is."""
    first, second = PoolKey(2, "gloo", True, isolated=1), PoolKey(2, "gloo", True, isolated=7)
    assert kind_of(first) == kind_of(second) == PoolKey(2, "gloo", True)
    assert kind_of(PoolKey(3, "gloo", True, isolated=1)) != kind_of(first)


#: Node ids are relative to the rootdir (``../`` for a file beside it), never absolute.
_NAME = st.text(alphabet="abcdefgh_/.[", min_size=1, max_size=12).filter(lambda s: s[0] != "/")
_PARAM = st.text(alphabet="ab:-/[] ", max_size=8)


@given(
    st.lists(st.tuples(_NAME, _NAME, st.none() | _PARAM), min_size=1, max_size=4),
    st.sampled_from(["/root", "/a/b c"]),
)
def test_a_fork_collects_its_test_functions_by_node_id_without_parameters(
    parts: list[tuple[str, str, str | None]], rootdir: str
) -> None:
    """Each test function once, in order, joined to the rootdir (arguments are relative to the
    invocation folder), whatever its parameter id holds; its files when it has no node id."""
    nodeids = [f"{f}.py::C::{t}" + (f"[{p}]" if p is not None else "") for f, t, p in parts]
    files = sorted({f"{f}.py" for f, _, _ in parts})
    functions = [f"{rootdir}/{f}.py::C::{t.partition('[')[0]}" for f, t, _ in parts]
    assert collection_args(nodeids, files, rootdir) == list(dict.fromkeys(functions))
    assert collection_args([], files, rootdir) == files


def test_a_fork_collects_a_cross_size_producers_module_whole() -> None:
    """A cross-size fixture's producer item (``<module>::<fixture>[distrank-fixture]``) is made at
    collection from the module's tests that request it: its fork collects the module, not a
    test of that name (there is none: pytest would say "not found")."""
    nodeids = ["sub/test_made.py::made[distrank-fixture]", "sub/test_made.py::test_uses[ws2]"]
    assert collection_args(nodeids, ["sub/test_made.py"], "/project") == [
        "/project/sub/test_made.py",
        "/project/sub/test_made.py::test_uses",
    ]
