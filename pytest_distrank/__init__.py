"""pytest-distrank: multi-rank torch.distributed tests as plain pytest tests.

Imported in the controller and in every rank process. Re-exports only; the plugin itself is the
``distrank`` pytest11 entry point (:mod:`pytest_distrank.plugin`).
"""

from __future__ import annotations

from .api.children import in_child
from .api.parity import (
    assert_close_across_ranks,
    assert_differs_across_ranks,
    assert_equal_across_ranks,
)
from .api.parityleaves import ParityUsageError
from .api.reference import assert_close_to_reference, rank_inputs, reference
from .planning.crossize import fixture
from .rank.ownedgroups import TwinMeetingError

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
    "in_child",
    "rank_inputs",
    "reference",
]
