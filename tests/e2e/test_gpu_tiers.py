"""End-to-end: GPU tiers (``--distrank-gpus``) list a CI runner's share of a suite.

``pytest --collect-only -q --distrank-gpus=TIER`` on a small suite (ordinary tests, gloo tests,
NCCL tests of world sizes 1, 2 and 4, ``requires_nccl``, ``requires_gpus``, a memory share, a
declared need and a DeepSpeed look-alike harness class), on this machine without GPUs: each
tier lists its tests and deselects the rest, the tiers 0, 1, 2 and >=3 partition the suite,
``--distrank-gpu-oversubscribe`` moves NCCL tests to one GPU, and bad values are usage errors
naming the option, the value and where it came from. Nothing starts a rank, so every session
runs in this process (``run_inprocess``).
"""

from __future__ import annotations

import pytest

from ..helpers import RunPytest

SUITE = """
import pytest


def test_plain():
    pass


@pytest.mark.world_size(2)
def test_gloo(rank):
    pass


@pytest.mark.world_size(1, 2, 4, backend="nccl")
def test_nccl(rank):
    pass


@pytest.mark.requires_nccl
@pytest.mark.world_size(2)
def test_requires_nccl(rank):
    pass


@pytest.mark.requires_gpus(1)
def test_one_gpu():
    pass


@pytest.mark.requires_gpus(3)
@pytest.mark.world_size(2)
def test_three_gpus_gloo(rank):
    pass


@pytest.mark.requires_gpus(1, memory="8GiB")
@pytest.mark.world_size(1, backend="nccl")
def test_memory_share(rank):
    pass


@pytest.mark.distrank_gpus(8)
def test_starts_its_own_gpu_processes():
    pass


class DistributedExec:  # a look-alike of DeepSpeed's harness (tests/e2e/test_deepspeed_suites.py)
    def _launch_daemonic_procs(self, num_procs, init_method): ...
    def _launch_non_daemonic_procs(self, num_procs, init_method): ...
    def _dist_run(self, local_rank, num_procs, master_port, init_method): ...
    def _launch_with_file_store(self, request, world_size): ...


class DistributedTest(DistributedExec):
    is_dist_test = True
    world_size = 2


class TestUndeclared(DistributedTest):
    def test_harness(self):
        pass


class TestDeclared(DistributedTest):
    distrank_gpus = 2

    def test_harness(self):
        pass
"""

#: What each tier lists (node ids after ``test_tiers.py::``).
TIERS = {
    "0": {"test_plain", "test_gloo", "TestUndeclared::test_harness"},
    "1": {"test_nccl[ws1]", "test_one_gpu", "test_memory_share"},
    "2": {"test_nccl[ws2]", "test_requires_nccl", "TestDeclared::test_harness"},
    ">=3": {"test_nccl[ws4]", "test_three_gpus_gloo", "test_starts_its_own_gpu_processes"},
}


def listed(result: pytest.RunResult) -> set[str]:
    """The node ids a ``--collect-only -q`` run lists, without the file's name."""
    prefix = "test_tiers.py::"
    return {line[len(prefix) :] for line in result.outlines if line.startswith(prefix)}


@pytest.mark.timeout(60)
def test_the_tiers_list_their_tests_and_partition_the_suite(
    pytester: pytest.Pytester, run_inprocess: RunPytest
) -> None:
    pytester.makepyfile(test_tiers=SUITE)
    everything = run_inprocess("--collect-only", "-q")
    assert everything.ret == 0
    suite = listed(everything)
    assert len(suite) == 12
    seen: list[str] = []
    for tier, expected in TIERS.items():
        result = run_inprocess("--collect-only", "-q", f"--distrank-gpus={tier}")
        assert result.ret == 0, result.outlines
        assert listed(result) == expected, tier
        seen += listed(result)
        result.stdout.fnmatch_lines(
            [
                f"distrank: GPU tier {tier} (--distrank-gpus={tier} (command line)): "
                f"{len(expected)} of 12 tests need *; {12 - len(expected)} deselected",
                f"{len(expected)}/12 tests collected ({12 - len(expected)} deselected) in *",
            ]
        )
        # Every tier says which harness tests it counted as needing no GPU.
        result.stdout.fnmatch_lines(
            ["distrank: 1 test of harness classes (TestUndeclared) declares no GPU need: *"]
        )
    assert sorted(seen) == sorted(suite), "each test in exactly one tier"


@pytest.mark.timeout(60)
def test_oversubscription_runs_nccl_tests_on_one_gpu(
    pytester: pytest.Pytester, run_inprocess: RunPytest
) -> None:
    pytester.makepyfile(test_tiers=SUITE)
    result = run_inprocess(
        "--collect-only", "-q", "--distrank-gpus=1", "--distrank-gpu-oversubscribe"
    )
    assert listed(result) == {
        "test_nccl[ws1]",
        "test_nccl[ws2]",
        "test_nccl[ws4]",
        "test_requires_nccl",
        "test_one_gpu",
        "test_memory_share",
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ["--distrank-gpus=many"],
            {},
            "*invalid value 'many' for --distrank-gpus *, from --distrank-gpus=many "
            "(command line):",
        ),
        (["--distrank-gpus="], {}, "*invalid value '' for --distrank-gpus *(command line):"),
        (
            ["-o", "distrank_gpus=3-1"],
            {},
            "*invalid value '3-1' for --distrank-gpus *, from distrank_gpus = 3-1 (from -o):",
        ),
        (
            [],
            {"DISTRANK_GPUS": ">=x"},
            "*invalid value '>=x' for --distrank-gpus *, from DISTRANK_GPUS=>=x (environment):",
        ),
    ],
    ids=["unknown", "empty", "empty-range-ini", "unknown-env"],
)
def test_a_bad_tier_is_a_usage_error(
    pytester: pytest.Pytester,
    run_inprocess: RunPytest,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
    message: str,
) -> None:
    pytester.makepyfile(test_tiers=SUITE)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = run_inprocess("--collect-only", "-q", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


#: A torchrun rank's environment (launch/env.py), for the launcher-mode refusal.
TORCHRUN = {
    "RANK": "0",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "0",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "0",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "tiers",
}


@pytest.mark.timeout(60)
def test_a_tier_under_a_launcher_is_a_usage_error(
    pytester: pytest.Pytester, run_inprocess: RunPytest, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_tiers=SUITE)
    for key, value in TORCHRUN.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("DISTRANK_GPUS", "1-2")
    result = run_inprocess("--collect-only", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "*pytest-distrank: --distrank-gpus '1-2' (from DISTRANK_GPUS=1-2 (environment)) "
            "picks the tests of a GPU tier, which launcher mode does not do: this pytest is one "
            "rank of a world that torchrun launched*"
        ]
    )


#: A conftest.py that declares a need (as one would for files it may not edit), and a plugin that
#: picks a shard as pytest-split does (registered at configure, its hook ``trylast``): it must see
#: the tier's tests only.
CONFTEST = """
import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if item.name == "test_plain":
            item.add_marker(pytest.mark.distrank_gpus(5))


class Shard:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        print("shard picked from:", " ".join(item.name for item in items))


def pytest_configure(config):
    config.pluginmanager.register(Shard(), "shard")
"""


@pytest.mark.timeout(60)
def test_a_conftest_declares_and_a_sharding_plugin_sees_the_tier_only(
    pytester: pytest.Pytester, run_inprocess: RunPytest
) -> None:
    pytester.makepyfile(test_tiers=SUITE)
    pytester.makeconftest(CONFTEST)
    result = run_inprocess("--collect-only", "-q", "--distrank-gpus=5")
    assert listed(result) == {"test_plain"}
    result.stdout.fnmatch_lines(["shard picked from: test_plain"])
