"""Run modes: which observer watches the script, and what happens with what it found.

A mode is a class: `observer()` builds the `Observer` (detect/observer.py) that watches
the run, and `conclude()` turns the first report into the final one (for example by a
seeded replay that localises the op). Adding a mode is adding a class here and naming it
in `MODES` (or, like `ReplayMode`, choosing it in `select`).

- `trace`: every op checked (`Detector`); a finding that needs values only a per-op check
  keeps (a device flag, an update inside `optimizer.step()`) is replayed.
- `watch`: step boundaries only (`StepWatcher`); every finding is replayed under trace.
- the replay itself: trace with the first run's random state, every op read at once, and
  the optimizer's and backward's ops checked one by one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from nandoctor import replay
from nandoctor.config import Config
from nandoctor.console import note_line
from nandoctor.detect.detector import Detector
from nandoctor.detect.observer import Observer
from nandoctor.detect.provenance import SourceLocator
from nandoctor.detect.result import Detection, Site, SiteFacts, WatchFinding
from nandoctor.detect.watch import StepWatcher
from nandoctor.diagnose import replay as replay_words
from nandoctor.distributed import REPLAY_TIMEOUT_S
from nandoctor.errors import ExitCode
from nandoctor.report.model import RunReport


@dataclass
class RunRequest:
    target: str
    args: list[str]
    as_module: bool
    config: Config
    config_path: str | None = None
    replay_rng: replay.RngState | None = None  # set in a replay: the RNG state to start from
    stdin: replay.StdinStart | None = None  # the first run's standard input, for its replay
    # Under torch.distributed: `distributed_replay(steps, run)` runs this rank's part in the
    # ranks' one replay, `run(environ)` with a fresh rendezvous, or with None when the ranks
    # could not agree on one (see distributed.py).
    distributed_replay: Callable[[int, Callable[[dict | None], replay.ReplayOutcome]], replay.ReplayOutcome] | None = None


class RunMode:
    name = ""

    def settings(self, request: RunRequest) -> dict[str, Any]:
        return dict(request.config.run)

    def observer(self, request: RunRequest, locator: SourceLocator) -> Observer:
        raise NotImplementedError

    def conclude(self, request: RunRequest, report: RunReport, found, rng: replay.RngState) -> RunReport:
        """The final report, from the first run's `report` and its observer's finding."""
        return report


class TraceMode(RunMode):
    """Every op; inside `optimizer.step()` the result is checked once, and a failure there
    (or one seen by a device flag, which keeps no values) is localised by a replay."""

    name = "trace"

    def observer(self, request: RunRequest, locator: SourceLocator) -> Observer:
        return Detector(self.settings(request), locator)

    def conclude(self, request, report, found: Detection | None, rng) -> RunReport:
        if found is None or not found.needs_replay:
            return report
        root = found.root
        written = root.facts.written_by_optimizer or root.phase == "optimizer"
        weights_clean = False if written else None  # a stop after optimizer.step(): weights already changed
        replayed, outcome = _localise(request, rng, report, replay_words.subject(found), report.step or 0,
                                      weights_clean)
        if outcome.interrupted:
            return _interrupted(report)
        return replayed if replayed is not None else _kept_on_miss(report)


class WatchMode(RunMode):
    """Step boundaries only; a finding is localised by a replay under trace."""

    name = "watch"

    def observer(self, request: RunRequest, locator: SourceLocator) -> Observer:
        return StepWatcher(self.settings(request), locator)

    def conclude(self, request, report, found: WatchFinding | None, rng) -> RunReport:
        if found is None:
            return report
        replayed, outcome = _localise(request, rng, report, found.what, found.step, found.weights_clean)
        if replayed is None and found.what == "refused":
            return _error_stands(report, outcome)
        return replayed if replayed is not None else _not_reproduced(found, report, outcome, request.stdin)


class ReplayMode(TraceMode):
    """The replay process: trace, started from the first run's random state, every op's
    check read at once, the optimizer's ops checked one by one and torch.compile'd code run
    eagerly, op by op; never replays itself."""

    def settings(self, request: RunRequest) -> dict[str, Any]:
        return dict(request.config.run, check_optimizer_ops=True, device_flags="never", eager_compiled=True,
                    backward_by_node=False, module_regions=False)

    def conclude(self, request, report, found, rng) -> RunReport:
        return report


MODES: dict[str, RunMode] = {mode.name: mode for mode in (TraceMode(), WatchMode())}


def select(request: RunRequest) -> RunMode:
    if request.replay_rng is not None:
        return ReplayMode()
    return MODES[request.config.run["mode"]]


def _localise(request: RunRequest, rng, first: RunReport, what: str, step: int,
              weights_clean: bool | None) -> tuple[RunReport | None, replay.ReplayOutcome]:
    """Replay up to the failing step: (the replay's report if it reproduced, the outcome)."""
    if first.distributed is None or first.distributed.writes_run_report:
        note_line(replay_words.started(first.mode, what, step, weights_clean))  # (once, not once per rank)
    if request.distributed_replay is not None:
        outcome = request.distributed_replay(step + 1, replay_run(request, rng, step + 1))
    else:
        outcome = replay.replay(request.target, request.args, request.as_module, request.config_path, rng, step + 1,
                                stdin=request.stdin)
    return reproduced(outcome, first, what, step, weights_clean), outcome


def replay_run(request: RunRequest, rng, steps: int) -> Callable[[dict | None], replay.ReplayOutcome]:
    """A distributed rank's replay of `steps` steps, given the environment of the ranks'
    fresh rendezvous (None: they could not agree on one)."""
    def run(environ: dict | None) -> replay.ReplayOutcome:
        if environ is None:
            return replay.ReplayOutcome(None, "the ranks could not agree on a rendezvous for the replay")
        return replay.replay(request.target, request.args, request.as_module, request.config_path, rng, steps,
                             environ=environ, timeout_s=REPLAY_TIMEOUT_S, stdin=request.stdin)
    return run


def reproduced(outcome: replay.ReplayOutcome, first: RunReport, what: str, step: int,
                weights_clean: bool | None) -> RunReport | None:
    """The replay's report, marked as reproduced; None when the failure did not come back."""
    replayed = outcome.report
    if replayed is None or replayed.status != "nonfinite":
        return None
    replayed.mode = first.mode
    replayed.reproduced = True
    replayed.weights_clean = weights_clean
    replayed.notes.insert(0, replay_words.reproduced(first.mode, what, step))
    return replayed


def _kept_on_miss(report: RunReport) -> RunReport:
    """Trace mode's own report, when its replay ran clean: what the first run saw stands."""
    report.reproduced = False
    root = report.root
    if root.facts.device_flag is None:
        report.notes.append(replay_words.not_localised())
        return report
    report.notes.append(replay_words.flag_only())
    report.cause = replay_words.nonreproducible_flag(root, report.step)
    return report


def _interrupted(report: RunReport) -> RunReport:
    """Ctrl-C during the replay: the first run's finding is the report, said to be
    unlocalised, and the run ends as an interrupted one does."""
    report.exit_code = int(ExitCode.INTERRUPTED)
    report.reproduced = None  # (neither reproduced nor not: it did not get there)
    report.notes.append(replay_words.replay_interrupted())
    return report


def _error_stands(report: RunReport, outcome: replay.ReplayOutcome) -> RunReport:
    """Watch mode's report when the script died of an op's refusal of its values and the
    replay found no NaN or Inf behind it: the script's own error (as python exits on it)."""
    if outcome.interrupted:
        report.exit_code = int(ExitCode.INTERRUPTED)
        report.notes.append(replay_words.replay_interrupted())
    else:
        report.exit_code = 1
        report.notes.append(replay_words.refusal_not_nonfinite())
    return report


def _not_reproduced(found: WatchFinding, report: RunReport, outcome: replay.ReplayOutcome,
                    stdin: replay.StdinStart | None) -> RunReport:
    """Watch mode's report when the replay did not find the failure again (or was
    interrupted, or died of the script's own error, before it could)."""
    site = Site(op="", phase=found.phase, location=found.location,
                facts=SiteFacts(loss=found.loss, grad_norm=found.grad_norm))
    report.status, report.exit_code = "nonfinite", int(ExitCode.FOUND)
    report.event = report.root = site
    report.lineage = [site]
    report.reason = replay_words.watch_stop_reason(found)
    report.reproduced = False
    report.weights_clean = found.weights_clean
    if outcome.interrupted:
        report.cause = replay_words.unlocalised_watch(found)
        return _interrupted(report)
    replayed = outcome.report
    if replayed is not None and replayed.status == "script_error" and replayed.error:
        report.reproduced = None  # (neither reproduced nor not: it did not get there)
        report.cause = replay_words.replay_died(found, replayed.error, stdin.kind if stdin and stdin.lost else None)
        return report
    report.cause = replay_words.nonreproducible_watch(found, replayed is not None and replayed.status == "clean")
    if replayed is None and outcome.stderr.strip():
        report.notes.append(replay_words.replay_failed(outcome.stderr.strip().splitlines()[-1]))
    return report
