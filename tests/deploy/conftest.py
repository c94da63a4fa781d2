"""Fixtures of the deployment tests: helm (fetched once into .cache/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helm import helm_binary


@pytest.fixture(scope="session")
def helm() -> Path:
    return helm_binary()
