"""pytest-distrank: multi-rank torch.distributed tests as plain pytest tests.

Imported in the controller and in every rank process. Re-exports only; the plugin itself is the
``distrank`` pytest11 entry point (:mod:`pytest_distrank.plugin`).
"""

from __future__ import annotations

from .planning.crossize import fixture
from .rank.ownedgroups import TwinMeetingError
from .rank.parity import (
    assert_close_across_ranks,
    assert_differs_across_ranks,
    assert_equal_across_ranks,
)
from .rank.parityleaves import ParityUsageError
from .rank.reference import assert_close_to_reference, rank_inputs, reference

__version__ = "0.1.0"

__all__ = [
    "ParityUsageError",
    "TwinMeetingError",
    "__version__",
    "assert_close_across_ranks",
    "assert_close_to_reference",
    "assert_differs_across_ranks",
    "assert_equal_across_ranks",
    "fixture",
    "rank_inputs",
    "reference",
]
