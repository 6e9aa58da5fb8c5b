"""Fixtures shared by all tests (helpers to import live in helpers.py)."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def script(tmp_path):
    """Write a script into tmp_path: `script("train.py", source)` -> its path."""

    def write(name: str, source: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        return path

    return write
