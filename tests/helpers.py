"""Test helpers: run code under the detector in-process, or nandoctor in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from nandoctor.config import load_config

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Detected:
    detector: object
    stopped: bool

    @property
    def detection(self):
        return self.detector.detection


def detect(fn, **run_overrides) -> Detected:
    """Run `fn()` under a Detector with the default settings; report whether it stopped."""
    from nandoctor.detect.detector import Detector
    from nandoctor.detect.observer import NonFiniteFound

    settings = dict(load_config().run, **run_overrides)
    detector = Detector(settings)
    stopped = False
    try:
        with detector:
            fn()
    except NonFiniteFound:
        stopped = True
    return Detected(detector, stopped)


# A training script whose acos at exactly 1 gives an infinite gradient at its line 7.
ACOS_AT_ONE = """\
import torch
torch.manual_seed(0)
scale = torch.nn.Parameter(torch.tensor(1.0))
opt = torch.optim.SGD([scale], lr=0.1)
for step in range(5):
    opt.zero_grad()
    angle = torch.acos(torch.tensor([0.5, 1.0]) * (scale + 1e-3))
    angle.mean().backward()
    opt.step()
"""


def read_back(t):
    """What a script does with a value it keeps: read it (a NaN nobody reads never matters)."""
    return t.tolist()


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str
    report: dict | None


def run_nandoctor(args: list[str], cwd: Path, json_name: str | None = "report.json", env=None, timeout=180) -> CliResult:
    """`python -m nandoctor ARGS` as a user would run it; `--json` is added when json_name is set."""
    json_args = ["--json", str(cwd / json_name)] if json_name and args and args[0] == "run" else []
    cmd = [sys.executable, "-m", "nandoctor", args[0], *json_args, *args[1:]]
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("GITHUB_ACTIONS", None) if not (env and "GITHUB_ACTIONS" in env) else None
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=full_env)
    report = None
    if json_name and (cwd / json_name).exists():
        report = json.loads((cwd / json_name).read_text())
    return CliResult(proc.returncode, proc.stdout, proc.stderr, report)
