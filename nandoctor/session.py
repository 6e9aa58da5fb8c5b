"""One `nandoctor run`: prepare the script, run it under the mode's observer, build the report.

The pipeline, each stage in its own place:
  runner (execute faithfully) -> detect (an observer stops at the first non-finite value and
  hands over typed data) -> diagnose (`build_report`: the cause and every word) -> RunReport
  (plain data) -> renderers (terminal, JSON, CI). What a mode adds (a replay) is in modes.py.
"""
from __future__ import annotations

import sys

from nandoctor import modes, replay
from nandoctor.detect.observer import NonFiniteFound, Observer, StepLimitReached
from nandoctor.detect.provenance import SourceLocator
from nandoctor.diagnose import build_report
from nandoctor.errors import ExitCode
from nandoctor.modes import RunRequest
from nandoctor.report.model import RunReport
from nandoctor.runner import ScriptOutcome, ScriptRunner

__all__ = ["RunRequest", "prepare", "run"]


def prepare(request: RunRequest) -> ScriptRunner:
    """Find and compile the script; raises UsageError (exit 2) when it cannot run at all.
    In a replay process, also takes the replay's random state from the environment."""
    request.replay_rng = request.replay_rng or replay.take_state_from_environment()
    runner = ScriptRunner(request.target, request.args, as_module=request.as_module)
    runner.prepare()
    return runner


def run(request: RunRequest, runner: ScriptRunner) -> RunReport:
    """Run the script in the requested mode and report what happened."""
    mode = modes.select(request)
    if request.replay_rng is not None:
        request.replay_rng.restore()
    rng = replay.RngState.capture()
    locator = SourceLocator(main_file=runner.main_module.__file__, main_display=runner.display_path)
    observer = mode.observer(request, locator)
    report = _run_under(observer, runner, mode.name)
    return mode.conclude(request, report, observer.finding(), rng)


def _run_under(observer: Observer, runner: ScriptRunner, mode: str) -> RunReport:
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
    return build_report(
        runner.display_path, exit_code=outcome.exit_code, mode=mode, detection=observer.detection,
        error=outcome.exception, step=observer.state.step_or_none, history=observer.history(),
        stopped_by=stopped_by, discarded=observer.discarded(),
        amp=observer.amp.facts() if observer.amp.scaler_steps else None,
    )


def _flush_user_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
