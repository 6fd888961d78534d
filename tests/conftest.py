"""The test tiers, by folder: ``unit`` (``tests/unit``, ``tests/functional``: no process, no
broker), ``integration`` (``tests/integration``: the real broker, the real ClickHouse engine,
real vLLM on CPU) and ``e2e`` (``tests/e2e``: whole stacks, dashboards, scenarios). Each test is
marked with its tier, so ``pytest -m unit`` selects the same tests as ``make test-unit``."""

from __future__ import annotations

from pathlib import Path

import pytest

_TIERS = {"unit": "unit", "functional": "unit", "integration": "integration", "e2e": "e2e"}
_ROOT = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(item.path).resolve().relative_to(_ROOT).parts[0]
        item.add_marker(getattr(pytest.mark, _TIERS[folder]))
