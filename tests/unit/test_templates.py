"""Unit: rank templates without processes: the forked rank's handle reads its exit status from
the template's pipe, the set keeps at most KEEP kinds (pool/pools/templates.py), dropping a kind
whose template died, a pool's ranks fork together; what a fork collects and makes items of
(pool/worker/forkcollect.py)."""

from __future__ import annotations

import os
import unittest
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_distrank.pool.pools.poolkey import PoolKey
from pytest_distrank.pool.pools.templates import (
    KEEP,
    ForkedRank,
    TemplateError,
    Templates,
    fork_all,
    kind_of,
)
from pytest_distrank.pool.worker.forkcollect import OnlyTheirTests, collection_args


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


_PART = st.text(alphabet="abcT_", min_size=1, max_size=5)
_ID = st.tuples(
    st.sampled_from(["a.py", "sub/b.py", "../c.py"]),
    st.lists(_PART, min_size=1, max_size=3),
    st.none() | _PARAM,
)


def _nodeid(path: str, names: list[str], param: str | None) -> str:
    return "::".join([path, *names]) + (f"[{param}]" if param is not None else "")


def _made(plugin: OnlyTheirTests, collector: str, name: str) -> bool:
    """Whether ``collector`` (a node id) goes on to make ``name``'s item (no result: [])."""
    answer = plugin.pytest_pycollect_makeitem(SimpleNamespace(nodeid=collector), name)  # type: ignore[arg-type]
    assert answer in (None, [])
    return answer is None


@given(st.lists(_ID, min_size=1, max_size=5), _ID)
def test_a_fork_makes_items_only_on_the_way_to_its_tests(
    ids: list[tuple[str, list[str], str | None]], other: tuple[str, list[str], str | None]
) -> None:
    """Every module and class on the way to one of the fork's tests collects that way's next
    name, and refuses a name on no test's way; a collector on no test's way is not filtered."""
    plugin = OnlyTheirTests([_nodeid(*i) for i in ids])
    ways = {tuple([path, *names]) for path, names, _ in ids}
    for path, names, _ in ids:
        way = [path, *names]
        assert all(_made(plugin, "::".join(way[:end]), way[end]) for end in range(1, len(way)))
    path, names, _ = other
    way = [path, *names]
    for end in range(1, len(way)):
        on_a_way = any(w[: end + 1] == tuple(way[: end + 1]) for w in ways)
        collector_on_a_way = any(w[:end] == tuple(way[:end]) for w in ways)
        expected = on_a_way or not collector_on_a_way
        assert _made(plugin, "::".join(way[:end]), way[end]) == expected


def test_a_cross_size_producers_module_makes_every_item() -> None:
    """A producer's items are made from the module's tests that request its fixture: nothing
    in its module is filtered; another module is."""
    ids = ["sub/test_made.py::made[distrank-fixture]", "sub/test_made.py::C::test_uses[ws2]"]
    plugin = OnlyTheirTests([*ids, "other.py::test_x"])
    assert _made(plugin, "sub/test_made.py", "D") and _made(plugin, "sub/test_made.py::C", "t")
    assert _made(plugin, "other.py", "test_x") and not _made(plugin, "other.py", "test_y")


class _Pipes:
    """A multiprocessing context's ``Pipe`` whose ends record their closing."""

    def __init__(self) -> None:
        self.ends: list[SimpleNamespace] = []

    def Pipe(self, duplex: bool) -> tuple[SimpleNamespace, SimpleNamespace]:
        pair = tuple(SimpleNamespace(closed=False) for _ in range(2))
        for end in pair:
            end.close = lambda end=end: setattr(end, "closed", True)
        self.ends.extend(pair)
        return pair  # type: ignore[return-value]


def test_a_pool_asks_every_template_before_it_takes_an_answer_and_keeps_what_forked() -> None:
    """The ranks fork together; a template that did not fork raises after the others' answers
    are in, and the ranks that did fork are the pool's (for its kill)."""
    events: list[str] = []

    def ask(cfg: Any, conn: Any) -> Any:
        events.append(f"ask {cfg.rank}")

        def take() -> Any:
            events.append(f"take {cfg.rank}")
            if cfg.rank == 1:
                raise TemplateError("the template of rank 1 did not fork it: gone")
            return SimpleNamespace(pid=100 + cfg.rank)

        return take

    configs = [SimpleNamespace(rank=r, log_path=f"r{r}.log") for r in range(3)]
    pipes, ranks = _Pipes(), []  # type: ignore[var-annotated]
    with pytest.raises(TemplateError, match="rank 1"):
        fork_all(configs, pipes, ask, ranks)  # type: ignore[arg-type]
    assert events == ["ask 0", "ask 1", "ask 2", "take 0", "take 1", "take 2"]
    assert [r.pid for r in ranks] == [100, 102]
    parents, children = pipes.ends[0::2], pipes.ends[1::2]
    assert all(c.closed for c in children), "the forks' ends went to the templates"
    assert [p.closed for p in parents] == [False, True, False]


class _Case(unittest.TestCase):
    __test__ = False  # a specimen for the loader, not a test of this file

    def test_a(self) -> None: ...

    def test_b(self) -> None: ...


class _CaseCollector(pytest.Class):
    """What collectstart reads of the class's collector, without a session."""

    nodeid = "t.py::_Case"
    obj = _Case


def test_a_forks_unittest_class_lists_the_methods_of_its_tests_only_while_it_collects() -> None:
    """pytest's unittest plugin makes an item and an instance for every method the loader
    lists: while the fork collects, a class on the way to its tests lists their methods only;
    another class lists all; afterwards the loader lists all again."""
    plugin = OnlyTheirTests(["t.py::_Case::test_b[x]"])
    plugin.pytest_collectstart(object.__new__(_CaseCollector))
    other = type("Other", (_Case,), {})
    collection = plugin.pytest_collection()
    next(collection)
    try:
        assert list(unittest.TestLoader().getTestCaseNames(_Case)) == ["test_b"]
        assert list(unittest.TestLoader().getTestCaseNames(other)) == ["test_a", "test_b"]
    finally:
        with pytest.raises(StopIteration):
            next(collection)
    assert list(unittest.TestLoader().getTestCaseNames(_Case)) == ["test_a", "test_b"]


def test_an_answer_asked_for_is_taken_when_asking_the_next_fails() -> None:
    """Out of descriptors at the second rank's pipe: the first template's answer is still taken
    (left in its pipe, it would answer the template's next fork request) and its rank kept."""
    taken: list[int] = []

    def ask(cfg: Any, conn: Any) -> Any:
        def take() -> Any:
            taken.append(cfg.rank)
            return SimpleNamespace(pid=100 + cfg.rank)

        return take

    pipes = _Pipes()
    pipe = pipes.Pipe
    pipes.Pipe = lambda duplex: pipe(duplex) if not pipes.ends else _raise(OSError(24, "EMFILE"))  # type: ignore[method-assign]
    configs = [SimpleNamespace(rank=r, log_path=f"r{r}.log") for r in range(3)]
    ranks: list[Any] = []
    with pytest.raises(OSError, match="EMFILE"):
        fork_all(configs, pipes, ask, ranks)  # type: ignore[arg-type]
    assert taken == [0] and [r.pid for r in ranks] == [100]


def _raise(exc: BaseException) -> Any:
    raise exc
