"""Localising a watch-mode detection: run the script again under the per-op detector.

Watch mode only knows *that* the loss or a gradient went non-finite at step N. As JAX's
`jax_debug_nans` and Megatron's rerun machinery do, nandoctor then re-runs — here the
whole script from the start, in a fresh process, with the random number generators in the
state the first run started from — under `--mode trace`, stopping after step N+1 at the
latest. The replay's report has the op, the line and the cause.

If the failure does not come back, that is itself the finding: the report says
`"reproduced": false`, pointing at nondeterminism (unseeded data order, nondeterministic
kernels, a race) or hardware.

Side effects: the replay runs the user's code again, so files the script writes
(checkpoints, logs) are written again up to step N+1, and its output is discarded. It
runs with `NANDOCTOR_REPLAY=1` in the environment, so a script can skip such work.
"""
from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nandoctor.console import note_line
from nandoctor.errors import ExitCode
from nandoctor.report.model import Cause, OpSite, RunReport

REPLAY_ENV = "NANDOCTOR_REPLAY"


@dataclass
class RngState:
    """The global random generators' states (python, numpy, torch CPU and CUDA)."""

    python: Any
    numpy: Any
    torch_cpu: Any
    torch_cuda: Any

    @classmethod
    def capture(cls) -> "RngState":
        import numpy as np
        import torch

        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        return cls(random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda)

    def restore(self) -> None:
        import numpy as np
        import torch

        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.set_rng_state(self.torch_cpu)
        if self.torch_cuda is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(self.torch_cuda)

    def save(self, path: Path) -> None:
        # nandoctor's own file, written and read by nandoctor only: pickle is safe here.
        with open(path, "wb") as f:
            pickle.dump(self, f)

    @staticmethod
    def load(path: str | Path) -> "RngState":
        with open(path, "rb") as f:
            return pickle.load(f)


def localise(target: str, args: list[str], as_module: bool, config_path: str | None, finding, rng: RngState,
             first_report: RunReport, keep_on_miss: bool = False) -> RunReport:
    """Replay under trace; return the replay's report marked as reproduced. When the
    failure does not come back: the first run's own report if `keep_on_miss`, else a
    non-reproducible report built from what the first run saw."""
    note_line(
        f"{first_report.mode} mode: the {finding.what} went non-finite at step {finding.step + 1}"
        + (" (the update was not applied)" if finding.weights_clean else "")
        + "; re-running the script under --mode trace to find the op..."
    )
    with tempfile.TemporaryDirectory(prefix="nandoctor-replay-") as tmp:
        rng_file, report_file = Path(tmp) / "rng.pkl", Path(tmp) / "replay.json"
        rng.save(rng_file)
        command = [sys.executable, "-m", "nandoctor", "run", "--mode", "trace", "--max-steps", str(finding.step + 1),
                   "--json", str(report_file), "--replay-rng", str(rng_file)]
        if config_path:
            command += ["--config", str(config_path)]
        command += (["-m", target] if as_module else [target]) + list(args)
        proc = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, env=dict(os.environ, **{REPLAY_ENV: "1"}))
        replayed = _read(report_file)
    if proc.returncode == ExitCode.INTERRUPTED:
        raise KeyboardInterrupt
    if replayed is not None and replayed.status == "nonfinite":
        replayed.mode = first_report.mode
        replayed.reproduced = True
        replayed.weights_clean = finding.weights_clean
        replayed.notes.insert(0, f"{first_report.mode} mode stopped at step {finding.step + 1} on a non-finite "
                                 f"{finding.what}; a seeded replay checking every op found the op above.")
        return replayed
    if keep_on_miss:
        return _kept_on_miss(first_report)
    return _not_reproduced(finding, first_report, replayed, proc.stderr)


def _read(path: Path) -> RunReport | None:
    try:
        return RunReport.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError):
        return None


def _kept_on_miss(report: RunReport) -> RunReport:
    """The first run's own report, when its replay ran clean: what the first run saw stands."""
    report.reproduced = False
    root = report.root
    if "device_flag" not in root.facts:
        report.notes.append("a seeded replay checking every op did not reproduce the failure, so the op "
                            "inside the step is not known; nondeterminism or hardware may be involved.")
        return report
    value = "NaN" if root.facts["device_flag"] == "nan" else "Inf"
    where = f" at {root.location}" if root.location else ""
    report.notes.append("the op and line come from its device-side flag; its input values were not kept.")
    report.cause = Cause(
        "nonreproducible",
        "a non-finite value that did not come back on replay",
        f"`{root.op}`{where} made {value} at step {(report.step or 0) + 1}, as read from its device-side flag "
        "at the step boundary, but re-running the script from the start, with the same random seeds, checking "
        "every op at once, did not make it again. A failure that does not reproduce points at nondeterminism "
        "(data order or augmentation not seeded, nondeterministic GPU kernels, a race between workers, input "
        "the script reads that changed) or at hardware (a flaky GPU, memory errors).",
        _DETERMINISM_FIX,
    )
    return report


_DETERMINISM_FIX = (
    "Make the run deterministic (`torch.manual_seed`, seeded DataLoader `generator` and `worker_init_fn`, "
    "`torch.use_deterministic_algorithms(True)`), then run again with `--mode trace`; if it still only "
    "happens on one machine, test that machine's GPU and memory."
)


def _not_reproduced(finding, watch_report: RunReport, replayed: RunReport | None, stderr: str) -> RunReport:
    site = OpSite(op="", phase="forward" if finding.what == "loss" else "backward", location=finding.location,
                  reason=f"the {finding.what} is non-finite", facts={"loss": finding.loss, "grad_norm": finding.grad_norm})
    how = "ran clean" if replayed is not None and replayed.status == "clean" else "ended without a finding"
    report = watch_report
    report.status, report.exit_code = "nonfinite", int(ExitCode.FOUND)
    report.event = report.root = site
    report.lineage = [site]
    report.reproduced = False
    report.weights_clean = finding.weights_clean
    report.cause = Cause(
        "nonreproducible",
        "a non-finite value that did not come back on replay",
        f"Watch mode saw a non-finite {finding.what} at step {finding.step + 1} (loss {finding.loss}, gradient norm "
        f"{finding.grad_norm}), but re-running the script from the start, with the same random seeds, under the "
        f"per-op detector {how} up to that step. A failure that does not reproduce points at nondeterminism "
        "(data order or augmentation not seeded, nondeterministic GPU kernels, a race between workers, "
        "input the script reads that changed) or at hardware (a flaky GPU, memory errors).",
        _DETERMINISM_FIX,
    )
    if replayed is None and stderr.strip():
        report.notes.append("the replay failed: " + stderr.strip().splitlines()[-1])
    return report
