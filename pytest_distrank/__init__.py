"""pytest-distrank: multi-rank torch.distributed tests as plain pytest tests.

Imported in the controller and in every rank process. Re-exports only; the plugin itself is the
``distrank`` pytest11 entry point (:mod:`pytest_distrank.plugin`).
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
