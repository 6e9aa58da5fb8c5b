"""The public cases in ../shared/cases, scored by the project's own scorer as CI would.

The scorer runs once per test session (all cases, two at a time), also under pytest-xdist
(see helpers.once_per_session); each case is then its own test. The scorer starts each
`python -m nandoctor run` through its `--nandoctor` option as a client of the test
process's fork server (see helpers.ForkServer.command), which has imported torch once.
Cases
that nandoctor still gets wrong are listed in KNOWN_MISSES with the issue that tracks
them, as strict expected failures: a listed case that starts passing fails this test
until it is taken off the list, and any other case that fails is a regression.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ATAN2_NAN_AT_ORIGIN, ATAN2_REASON, HEALTHY_ONLY_WITH_ATAN2_FIX

from helpers import nandoctor_server, once_per_session

SHARED = Path(__file__).resolve().parent.parent.parent / "shared"
SCORER = SHARED / "tools" / "score_cases.py"
CASES = sorted(p.parent.name for p in (SHARED / "cases").glob("*/expect.yaml"))

KNOWN_MISSES: dict[str, str] = {}  # case name -> the issue tracking it (none today)

pytestmark = pytest.mark.skipif(not SCORER.exists(), reason="../shared is not beside the checkout")


def score_all() -> dict[str, str]:
    nandoctor = shlex.join(nandoctor_server().command(["-m", "nandoctor"]))
    proc = subprocess.run(
        [sys.executable, str(SCORER), str(SHARED / "cases"), "--nandoctor", nandoctor],
        capture_output=True, text=True, timeout=1200,
    )
    return {"stdout": proc.stdout, "stderr": proc.stderr}


@pytest.fixture(scope="module")
def scores(tmp_path_factory) -> dict[str, str]:
    """Case name -> "" when it passed, else the scorer's account of what was wrong."""
    scored = once_per_session(tmp_path_factory, "public_cases", score_all)
    results = {}
    for line in scored["stdout"].splitlines():
        match = re.match(r"(ok|FAIL) +(\S+) \([^)]*\)(?:: (.*))?$", line)
        if match:
            results[match.group(2)] = "" if match.group(1) == "ok" else match.group(3)
    assert set(results) == set(CASES), scored["stdout"][-3000:] + scored["stderr"][-3000:]
    return results


@pytest.mark.parametrize("case", [
    pytest.param(name, marks=pytest.mark.xfail(reason=KNOWN_MISSES[name], strict=True))
    if name in KNOWN_MISSES else
    pytest.param(name, marks=pytest.mark.skipif(ATAN2_NAN_AT_ORIGIN, reason=ATAN2_REASON))
    if name in HEALTHY_ONLY_WITH_ATAN2_FIX else name
    for name in CASES
])
def test_the_public_case_gets_the_right_phase_op_line_and_cause(scores, case):
    assert scores[case] == "", scores[case]
