"""Fixtures shared by all tests (helpers to import live in helpers.py)."""
from __future__ import annotations

import os
from pathlib import Path

# One intra-op thread for torch, in the test processes and every process they start (it is
# inherited). The suite runs tests side by side (pytest-xdist, and the public-case scorer
# runs two cases at a time) on machines with few cores: with a thread per core in each
# process, OpenMP's threads spin waiting for each other's cores, and a sample script
# measured 2.9 s of CPU with one thread and 21 s with two under that load. Nothing here
# depends on the thread count (nandoctor's hooks run on the calling thread). Set before
# any test module imports torch; an explicit OMP_NUM_THREADS is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from helpers import session_lock  # noqa: E402


def pytest_collection_modifyitems(items):
    """The public cases first. pytest-xdist hands each worker a first batch of consecutive
    tests, so one worker gets all of them and runs the scorer (once for the session, see
    helpers.once_per_session) while the others run other tests, instead of waiting for it."""
    items.sort(key=lambda item: not item.nodeid.startswith("tests/test_public_cases.py"))


@pytest.fixture(autouse=True)
def _one_torchrun_at_a_time(request, tmp_path_factory):
    """Tests marked `distributed` launch torchrun, whose ranks meet on its default port
    (127.0.0.1:29500): under pytest-xdist they take turns, one worker at a time."""
    if request.node.get_closest_marker("distributed") is None:
        yield
        return
    with session_lock(tmp_path_factory, "torchrun_port"):
        yield


@pytest.fixture
def script(tmp_path):
    """Write a script into tmp_path: `script("train.py", source)` -> its path."""

    def write(name: str, source: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        return path

    return write
