"""The public cases in ../shared/cases, scored by the project's own scorer as CI would."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parent.parent.parent / "shared"
SCORER = SHARED / "tools" / "score_cases.py"


@pytest.mark.skipif(not SCORER.exists(), reason="../shared is not beside the checkout")
def test_every_public_case_gets_the_right_phase_op_line_and_cause():
    proc = subprocess.run(
        [sys.executable, str(SCORER), str(SHARED / "cases"), "--nandoctor", f"{sys.executable} -m nandoctor"],
        capture_output=True, text=True, timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert proc.stdout.strip().splitlines()[-1].endswith(" passed, 0 failed")
