"""Hooks that users and other plugins implement to extend pytest-distrank.

Registered with ``pytest_addhooks`` in the controller and in every rank. Implement them in a
``conftest.py`` or a plugin, like any pytest hook. Where each is called is said below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest


@pytest.hookspec
def pytest_distrank_rank_setup(config: pytest.Config, rank: int, world_size: int) -> None:
    """Called in each rank process once its process group is up, before it runs any test.

    Runs in: every rank process, once per rank process (so once per pool, and again after a pool
    is replaced). Use it to seed RNGs, set ``torch`` flags or warm up caches per rank. An exception
    here fails the tests that the pool was started for, with this rank's traceback.
    """


@pytest.hookspec(firstresult=True)
def pytest_distrank_merge_reports(
    item: pytest.Item, reports: Mapping[int, Sequence[pytest.TestReport]]
) -> list[pytest.TestReport] | None:
    """Fold the per-rank reports of one test into the reports pytest sees.

    Runs in: the controller, once per distributed test. ``reports`` maps each rank to its phase
    reports in order (setup, call, teardown; a rank that stopped early has fewer, and a rank that
    crashed or was killed has a synthesized failed report). Return the list of reports to replay,
    one per phase that pytest should see, or None to use the built-in merge policy.
    """
