"""Helpers shared by the data-check tests: check one file, pick problems by check."""
from __future__ import annotations

import pytest

from checking import problems_of


@pytest.fixture
def check():
    return problems_of
