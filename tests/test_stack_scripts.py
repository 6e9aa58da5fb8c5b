"""The training-stack scripts (sample_scripts/stacks/): Lightning, Hugging Face Trainer,
Keras 3, closures, GradScaler, DataLoader workers, torch.func and torch.compile, run as a
user would run them, against sample_scripts/stacks/expectations.yaml.

Each broken script is diagnosed in trace mode and in watch mode (which stops before the
bad update and replays to the same root); each healthy one exits 0 with its stdout (the
stack's own output, the final loss) byte-identical to plain python. A stack whose package
is not installed is skipped with the reason (`pip install -e '.[stacks]'` installs them).
These take minutes, so they are marked `stacks` and run by `pytest -m stacks` (CI runs both).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

STACKS = Path(__file__).resolve().parent.parent / "sample_scripts" / "stacks"
EXPECTATIONS: dict[str, dict] = yaml.safe_load((STACKS / "expectations.yaml").read_text())
BROKEN = sorted(n for n, e in EXPECTATIONS.items() if e["kind"] == "broken")
HEALTHY = sorted(n for n, e in EXPECTATIONS.items() if e["kind"] == "healthy")
TIMEOUT_S = 420
# The packages a script needs beyond torch, by the stack its name starts with.
NEEDS = {"lightning": ("lightning",), "hf": ("transformers", "accelerate"), "keras": ("keras",)}

pytestmark = pytest.mark.stacks


def _needs(script: str) -> tuple[str, ...]:
    stack = script.removeprefix("healthy_").split("_", 1)[0]
    return NEEDS.get(stack, ())


def _skip_without_stack(script: str) -> None:
    missing = [m for m in _needs(script) if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (pip install -e '.[stacks]')")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("stacks") / "stacks"
    shutil.copytree(STACKS, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, KERAS_BACKEND="torch", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    env.pop("GITHUB_ACTIONS", None)
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S,
                          stdin=subprocess.DEVNULL, env=env)


def _nandoctor(script: str, cwd: Path, *options: str) -> tuple[subprocess.CompletedProcess, dict]:
    report = cwd.parent / f"{script}.{'-'.join(options) or 'trace'}.json"
    proc = _run([sys.executable, "-m", "nandoctor", "run", "--json", str(report), *options, script], cwd)
    assert report.exists(), proc.stderr[-3000:]
    return proc, json.loads(report.read_text())


def _check_diagnosis(script: str, proc, report: dict) -> None:
    expected = EXPECTATIONS[script]
    root = report.get("root") or {}
    where = root.get("location") or {}
    brief = {"exit": proc.returncode, "cause": (report.get("cause") or {}).get("id"), "phase": root.get("phase"),
             "op": root.get("op"), "file": where.get("file"), "line": where.get("line")}
    context = f"{json.dumps(brief)}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 3, context
    assert report["cause"]["id"] == expected["cause"], context
    assert root["phase"] == expected["phase"], context
    assert re.search(expected["op"], root["op"]), context
    assert (Path(where["file"]).name, where["line"]) == (script, expected["line"]), context


@pytest.mark.parametrize("script", BROKEN)
def test_broken_stack_script_is_diagnosed_in_trace_mode(script, workdir):
    _skip_without_stack(script)
    _check_diagnosis(script, *_nandoctor(script, workdir))


@pytest.mark.parametrize("script", BROKEN)
def test_broken_stack_script_in_watch_mode_replays_to_the_root(script, workdir):
    _skip_without_stack(script)
    proc, report = _nandoctor(script, workdir, "--mode", "watch")
    _check_diagnosis(script, proc, report)
    # A non-finite loss stops its step before the update. Not so a NaN gradient under a
    # finite loss (it shows in the next step's loss, which the update made NaN), nor an
    # update the optimizer itself makes NaN from finite gradients (seen once it is made).
    if EXPECTATIONS[script]["phase"] not in ("backward", "optimizer"):
        assert report.get("weights_clean") is not False, "watch mode let the bad update through"


@pytest.mark.parametrize("script", HEALTHY)
def test_healthy_stack_script_is_clean_and_its_output_unchanged(script, workdir):
    _skip_without_stack(script)
    plain = _run([sys.executable, script], workdir)
    assert plain.returncode == 0, plain.stderr[-3000:]
    proc, report = _nandoctor(script, workdir)
    assert (proc.returncode, report["status"]) == (0, "clean"), proc.stderr[-3000:]
    assert proc.stdout == plain.stdout  # the final loss / parameters it prints, bit for bit
