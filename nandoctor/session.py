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
from nandoctor.detect.watch import StepWatcher, WatchFinding
from nandoctor import replay
from nandoctor.replay import RngState
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
    config_path: str | None = None
    replay_rng: str | None = None  # set in a watch-mode replay: the RNG state to start from


def prepare(request: RunRequest) -> ScriptRunner:
    """Find and compile the script; raises UsageError (exit 2) when it cannot run at all."""
    runner = ScriptRunner(request.target, request.args, as_module=request.as_module)
    runner.prepare()
    return runner


def run(request: RunRequest, runner: ScriptRunner) -> RunReport:
    """Run the script in the requested mode and report what happened."""
    if request.config.run["mode"] == "watch":
        return run_watched(request, runner)
    return run_traced(request, runner)


def run_traced(request: RunRequest, runner: ScriptRunner) -> RunReport:
    """Run the script under the per-op detector.

    Inside `optimizer.step()` ops are not checked one by one; the step's result is checked
    once. When that check fails, a seeded replay that does check them finds the op.
    """
    settings = dict(request.config.run)
    if request.replay_rng:
        RngState.load(request.replay_rng).restore()
        settings["check_optimizer_ops"] = True
        settings["device_flags"] = "never"  # the replay reads every op's check at once
    rng = RngState.capture()
    detector = Detector(settings, _locator(runner))
    report = _run_under(detector, runner, mode="trace")
    if report.root is not None and report.root.facts.get("needs_replay") and not request.replay_rng:
        finding = WatchFinding(_replay_subject(report), detector.step, report.root.location, None, None,
                               weights_clean=_weights_clean(report))
        return replay.localise(request.target, request.args, request.as_module, request.config_path,
                               finding, rng, report, keep_on_miss=True)
    return report


def _replay_subject(report: RunReport) -> str:
    """What the replay is looking for, in the words of its progress line."""
    root = report.root
    if "device_flag" in root.facts:
        return f"output of {root.op}"
    if root.facts.get("written_by_optimizer") or root.phase == "optimizer":
        return "parameter update"
    if root.op == "loss":
        return "loss"
    return "gradient" if root.phase == "backward" else "value"


def _weights_clean(report: RunReport) -> bool | None:
    """A stop before optimizer.step() leaves the weights as they were; after it, not."""
    root = report.root
    return False if root.facts.get("written_by_optimizer") or root.phase == "optimizer" else None


def run_watched(request: RunRequest, runner: ScriptRunner) -> RunReport:
    """Run the script under the step-boundary watcher; localise a finding by replay."""
    watcher = StepWatcher(request.config.run, _locator(runner))
    rng = RngState.capture()
    report = _run_under(watcher, runner, mode="watch")
    if watcher.finding is None:
        return report
    return replay.localise(request.target, request.args, request.as_module, request.config_path,
                           watcher.finding, rng, report)


def _locator(runner: ScriptRunner) -> SourceLocator:
    return SourceLocator(main_file=runner.main_module.__file__, main_display=runner.display_path)


def _run_under(observer, runner: ScriptRunner, mode: str) -> RunReport:
    stopped_by = None
    outcome: ScriptOutcome | None
    try:
        with observer:
            outcome = runner.run(passthrough=(NonFiniteFound, StepLimitReached))
            observer.finish()
    except NonFiniteFound:
        outcome = ScriptOutcome(int(ExitCode.FOUND))
    except StepLimitReached:
        outcome, stopped_by = ScriptOutcome(0), "max_steps"
    finally:
        _flush_user_streams()
    report = build_report(runner, observer, outcome, mode=mode)
    report.stopped_by = stopped_by
    return report


def build_report(runner: ScriptRunner, detector, outcome: ScriptOutcome, mode: str) -> RunReport:
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
