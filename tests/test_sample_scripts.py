"""The bundled sample scripts (sample_scripts/) against what a correct diagnostician reports.

Each script is run as a user would run it: `python -m nandoctor run --json r.json SCRIPT`, with the
working directory a scratch copy of sample_scripts/. The expected answers live in
sample_scripts/expectations.yaml.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SAMPLES = Path(__file__).resolve().parent.parent / "sample_scripts"
EXPECTATIONS: dict[str, dict] = yaml.safe_load((SAMPLES / "expectations.yaml").read_text())
TIMEOUT_S = 120

ALL = sorted(EXPECTATIONS)
BROKEN = [name for name in ALL if EXPECTATIONS[name]["kind"] == "broken"]
HEALTHY = [name for name in ALL if EXPECTATIONS[name]["kind"] == "healthy"]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A scratch copy of sample_scripts/, so scripts write nothing into the repository."""
    dest = tmp_path / "sample_scripts"
    shutil.copytree(SAMPLES, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def run_nandoctor(script: str, cwd: Path) -> tuple[subprocess.CompletedProcess, dict | None]:
    report_path = cwd.parent / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "nandoctor", "run", "--json", str(report_path), script],
        cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    return proc, report


def describe(proc: subprocess.CompletedProcess, report: dict | None) -> str:
    root = (report or {}).get("root") or {}
    brief = {
        "exit": proc.returncode,
        "status": (report or {}).get("status"),
        "cause": ((report or {}).get("cause") or {}).get("id"),
        "root.phase": root.get("phase"),
        "root.op": root.get("op"),
        "root.location": root.get("location"),
    }
    return f"{json.dumps(brief, indent=1)}\n--- stdout/stderr tail ---\n{(proc.stdout + proc.stderr)[-3000:]}"


def test_every_script_has_an_expectation():
    scripts = sorted(p.name for p in SAMPLES.glob("*.py"))
    assert scripts == ALL


@pytest.mark.parametrize("script", BROKEN)
def test_broken_script_is_diagnosed(script: str, workdir: Path):
    expect = EXPECTATIONS[script]
    proc, report = run_nandoctor(script, workdir)
    info = describe(proc, report)

    assert report is not None, f"no JSON report\n{info}"
    assert proc.returncode == 3, info
    assert report["status"] == "nonfinite", info
    assert report["event"] is not None, info

    root = report["root"]
    assert root is not None, info
    assert root["phase"] == expect["phase"], info
    assert re.search(expect["op"], root["op"]), f"op {root['op']!r} !~ {expect['op']!r}\n{info}"
    assert Path(root["location"]["file"]).name == script, info
    assert root["location"]["line"] == expect["line"], info
    assert report["cause"]["id"] == expect["cause"], info


@pytest.mark.parametrize("script", HEALTHY)
def test_healthy_script_is_clean(script: str, workdir: Path):
    proc, report = run_nandoctor(script, workdir)
    info = describe(proc, report)

    assert report is not None, f"no JSON report\n{info}"
    assert proc.returncode == 0, info
    assert report["status"] == "clean", info
    assert report["event"] is None, info
    assert report["root"] is None, info
    assert report["cause"] is None, info
    assert report["lineage"] == [], info


@pytest.mark.parametrize("script", ALL)
def test_script_runs_under_plain_python(script: str, workdir: Path):
    """The samples are ordinary training scripts: they run (and finish) without nandoctor."""
    proc = subprocess.run(
        [sys.executable, script], cwd=workdir, capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "nandoctor" not in output.lower(), output[-3000:]
    if EXPECTATIONS[script]["kind"] == "healthy":
        assert not re.search(r"\b(nan|inf)\b", proc.stdout), proc.stdout[-3000:]
