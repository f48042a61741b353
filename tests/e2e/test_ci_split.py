"""End-to-end: pytest-split shards a suite of distributed tests by their stored durations.

pytest-split (``--store-durations``, then ``--splits N --group k``) sums each test's setup, call
and teardown durations. A pool's start is charged to the setup of the first test it serves
(pool/ownreports.charge_pool_start), so the stored durations add up to a shard's wall time, and
junit's ``time`` agrees with them. Its default algorithm keeps collection order, so each shard
runs whole stretches of one world size: pools stay together.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from ..helpers import RunPytest

pytest.importorskip("pytest_split")

#: 16 tests of world sizes 1 to 3 (four pools), one of them slow.
SUITE = """
import time, pytest, torch, torch.distributed as dist

@pytest.mark.parametrize("i", range(4))
@pytest.mark.world_size(1)
def test_one(rank, i):
    pass

@pytest.mark.parametrize("i", range(6))
@pytest.mark.world_size(2)
def test_two(rank, pg, i):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2

@pytest.mark.world_size(2)
def test_two_slow(rank):
    time.sleep(0.5)

@pytest.mark.parametrize("i", range(5))
@pytest.mark.world_size(3)
def test_three(rank, i):
    pass
"""
FIRST_OF_POOL = ("test_one[0]", "test_two[0]", "test_three[0]")


def test_stored_durations_charge_the_pool_start_to_its_first_test(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = run_pytest("--store-durations", "--durations-path=durations.json", "--junitxml=j.xml")
    result.assert_outcomes(passed=16)
    stored = {
        k.split("::")[-1]: v
        for k, v in json.loads((pytester.path / "durations.json").read_text()).items()
    }
    assert len(stored) == 16
    for first in FIRST_OF_POOL:
        name = first.split("[")[0]
        later = [v for k, v in stored.items() if k.startswith(f"{name}[") and k != first]
        # A pool start (a fork and a rendezvous: a tenth of a second and up) against a test of
        # milliseconds on a warm pool.
        assert stored[first] > 0.1 and stored[first] > 3 * max(later), (first, stored)
    junit = {
        c.get("name"): float(c.get("time", "0"))
        for c in ET.parse(pytester.path / "j.xml").getroot().iter("testcase")
    }
    for name, seconds in stored.items():
        assert abs(junit[name] - seconds) < 0.01, (name, junit[name], seconds)


def test_two_shards_partition_the_suite_and_keep_pools_together(
    pytester: pytest.Pytester, run_pytest: RunPytest
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    ids = [f"test_suite.py::test_one[{i}]" for i in range(4)]
    ids += [f"test_suite.py::test_two[{i}]" for i in range(6)] + ["test_suite.py::test_two_slow"]
    ids += [f"test_suite.py::test_three[{i}]" for i in range(5)]
    durations = {nodeid: 0.01 for nodeid in ids}
    durations.update({ids[0]: 0.6, ids[4]: 0.7, ids[10]: 0.55, ids[11]: 0.8})
    (pytester.path / "durations.json").write_text(json.dumps(durations))
    shards = []
    for group in (1, 2):
        result = run_pytest(
            "--splits=2",
            f"--group={group}",
            "--durations-path=durations.json",
            "-v",
            "-p",
            "no:randomly",
        )
        ran = [
            line.split(" ")[0]
            for line in result.outlines
            if line.endswith("]") and " PASSED " in line
        ]
        assert result.ret == 0, result.stdout.str()
        shards.append(ran)
    first, second = shards
    assert not set(first) & set(second)
    assert sorted(first + second) == sorted(ids)
    # Collection order is kept: a shard is one stretch of the suite.
    assert first + second == ids
