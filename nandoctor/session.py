"""One `nandoctor run`: prepare the script, run it under the detector, build the report.

The pipeline, each stage in its own place:
  runner (execute faithfully) -> detect (stop at the first non-finite value)
  -> diagnose (name the cause) -> RunReport (plain data) -> renderers (terminal, JSON, CI).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from nandoctor.config import Config
from nandoctor.detect.detector import Detector, NonFiniteFound, StepLimitReached
from nandoctor.detect.provenance import SourceLocator
from nandoctor.diagnose import diagnose
from nandoctor.errors import ExitCode
from nandoctor.report.model import RunReport
from nandoctor.runner import ScriptOutcome, ScriptRunner


@dataclass
class RunRequest:
    target: str
    args: list[str]
    as_module: bool
    config: Config


def prepare(request: RunRequest) -> ScriptRunner:
    """Find and compile the script; raises UsageError (exit 2) when it cannot run at all."""
    runner = ScriptRunner(request.target, request.args, as_module=request.as_module)
    runner.prepare()
    return runner


def run_traced(request: RunRequest, runner: ScriptRunner) -> RunReport:
    """Run the script under the per-op detector and report what happened."""
    locator = SourceLocator(main_file=runner.main_module.__file__, main_display=runner.display_path)
    detector = Detector(request.config.run, locator)
    stopped_by = None
    outcome: ScriptOutcome | None
    try:
        with detector:
            outcome = runner.run(passthrough=(NonFiniteFound, StepLimitReached))
    except NonFiniteFound:
        outcome = None
    except StepLimitReached:
        outcome, stopped_by = ScriptOutcome(0), "max_steps"
    finally:
        _flush_user_streams()
    report = build_report(runner, detector, outcome, mode="trace")
    report.stopped_by = stopped_by
    return report


def build_report(runner: ScriptRunner, detector: Detector, outcome: ScriptOutcome | None, mode: str) -> RunReport:
    step = detector.step if detector.optimizer_seen else None
    history = detector.history_report()
    if detector.detection is not None:
        found = detector.detection
        report = RunReport(
            status="nonfinite", exit_code=int(ExitCode.FOUND), script=runner.display_path, step=step,
            event=found.event, root=found.root, lineage=found.lineage, mode=mode, history=history,
        )
        report.cause = diagnose(report)
        return report
    assert outcome is not None
    if outcome.exception is not None:
        exc = outcome.exception
        return RunReport(
            status="script_error", exit_code=outcome.exit_code, script=runner.display_path, step=step,
            mode=mode, history=history, error={"type": type(exc).__name__, "message": str(exc)},
        )
    return RunReport(status="clean", exit_code=outcome.exit_code, script=runner.display_path, step=step,
                     mode=mode, history=history)


def _flush_user_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
