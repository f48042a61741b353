"""End-to-end checks behind the speed claims (no timing bounds: those live in bench/)."""

from __future__ import annotations

import json

import pytest

from ..helpers import RunPytest


def test_one_pool_start_serves_many_tests(
    pytester: pytest.Pytester, run_pytest: RunPytest, monkeypatch: pytest.MonkeyPatch
) -> None:
    stats_path = pytester.path / "stats.json"
    monkeypatch.setenv("DISTRANK_STATS_FILE", str(stats_path))
    pytester.makepyfile(
        """
        import pytest, torch, torch.distributed as dist

        @pytest.mark.world_size(2)
        @pytest.mark.parametrize("i", range(30))
        def test_sum(rank, pg, i):
            t = torch.tensor([float(i)])
            dist.all_reduce(t)
            assert t.item() == 2 * i
        """
    )
    run_pytest().assert_outcomes(passed=30)
    stats = json.loads(stats_path.read_text())
    assert stats["tests"] == 30
    assert [p["world_size"] for p in stats["pools"]] == [2]
    assert stats["replaced"] == []
    # CPU per test (bench_overhead.py's columns): the controller's per test, each rank's in all.
    assert len(stats["controller_cpu"]) == 30
    assert all(cpu > 0 for cpu in stats["controller_cpu"])
    assert [tests for _, tests in stats["rank_cpu"]] == [30, 30]
    assert all(cpu > 0 for cpu, _ in stats["rank_cpu"])
    assert len(stats["start_spread"]) == 30
    assert len(stats["ended"]) == 30
    assert all(spread >= 0 for spread in stats["start_spread"])


def test_ranks_collect_only_the_files_of_their_pool(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    for i in range(50):
        pytester.makepyfile(**{f"test_unrelated_{i}": f"def test_plain():\n    assert {i} >= 0\n"})
    # Every file a rank's collection looks at (pytest makes a collector for each file beside an
    # argument unless it is ignored).
    pytester.makeconftest(
        """
        import os

        def pytest_collect_file(file_path, parent):
            rank = os.environ.get("DISTRANK_RANK")
            if rank is not None:
                with open(f"looked-at-rank{rank}.txt", "a") as f:
                    f.write(file_path.name + "\\n")
        """
    )
    pytester.makepyfile(
        test_dist="""
        import pytest

        @pytest.mark.world_size(2)
        def test_one(rank):
            pass
        """
    )
    run_pytest().assert_outcomes(passed=51)
    rank_logs = sorted(pytester.path.rglob("pool1-rank*.pytest.log"))
    assert len(rank_logs) == 2
    for log in rank_logs:
        text = log.read_text()
        assert "collected 1 item" in text, text
        assert "test_unrelated" not in text
    for rank in (0, 1):
        looked_at = set((pytester.path / f"looked-at-rank{rank}.txt").read_text().split())
        assert looked_at <= {"test_dist.py", "conftest.py"}, sorted(looked_at)


def test_without_bytecode_ranks_share_the_rewritten_test_modules(
    pytester: pytest.Pytester, run_pytest: RunPytest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under PYTHONDONTWRITEBYTECODE pytest caches no rewritten module: the controller keeps its
    rewrite in the session's folder for the ranks (about 1 ms per test per rank saved), and
    nothing is written beside the test files."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    pytester.makepyfile(
        test_rewritten="""
        import pytest

        def test_plain():
            x = 2
            assert x == 3

        @pytest.mark.world_size(2)
        def test_dist(rank):
            x = rank + 10
            assert x == 10
        """
    )
    result = run_pytest("-rf")
    result.assert_outcomes(failed=2)
    # Both are rewritten asserts, with pytest's explanation of the values.
    result.stdout.fnmatch_lines(["E       assert 2 == 3", "E       assert 11 == 10"])
    kept = list(pytester.path.rglob("distrank-rewritten/**/test_rewritten.*pytest*.pyc"))
    assert len(kept) == 1, kept
    assert not list(pytester.path.glob("__pycache__")), "bytecode written beside the tests"
