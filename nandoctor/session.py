"""One `nandoctor run`: prepare the script, run it under the mode's observer, build the report.

The pipeline, each stage in its own place:
  runner (execute faithfully) -> detect (an observer stops at the first non-finite value and
  hands over typed data) -> diagnose (`build_report`: the cause and every word) -> RunReport
  (plain data) -> renderers (terminal, JSON, CI). What a mode adds (a replay) is in modes.py.
"""
from __future__ import annotations

import dataclasses
import sys

from nandoctor import modes, replay
from nandoctor.detect.observer import NonFiniteFound, Observer, PeerStopped, StepLimitReached
from nandoctor.detect.result import Detection, WatchFinding
from nandoctor.distributed import RankReport, RankRun
from nandoctor.detect.provenance import SourceLocator
from nandoctor.diagnose import build_report
from nandoctor.diagnose import ranks as rank_words
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
    if request.replay_rng is None:  # (a replay never replays itself)
        request.stdin = replay.StdinStart.capture()
    locator = SourceLocator(main_file=runner.main_module.__file__, main_display=runner.display_path)
    observer = mode.observer(request, locator)
    ranks = RankRun.from_env() if request.replay_rng is None else None  # a replay runs on its own
    if ranks is not None:
        # A rank the culprit stops joins the culprit's replay, to the culprit's step.
        ranks.join_replay = lambda steps: modes.replay_run(request, rng, steps)
    report = _run_under(observer, runner, mode.name, ranks)
    if ranks is None:
        return mode.conclude(request, report, observer.finding(), rng)
    request.distributed_replay = ranks.replay_once
    final = mode.conclude(request, report, observer.finding(), rng)
    if final is not report:  # the replay's report: this rank's place in the run stays
        final.distributed = report.distributed
        final.notes += [n for n in report.notes if n not in final.notes]
    if report.distributed.stopped_by_peer:
        ranks.join_the_replay()  # (at once when its listener has run or is running it)
    elif report.distributed.is_culprit and not ranks.replayed:
        ranks.no_replay()
    if ranks.replayed and report.distributed.culprit_rank is not None and mode.name == "watch":
        final = _settled_by_the_replay(ranks, report, final, observer.finding())
    return final


def _settled_by_the_replay(ranks: RankRun, first: RunReport, final: RunReport, found) -> RunReport:
    """Watch mode sees values only at step boundaries: gradients once DDP has averaged them
    (no rank's own, and whichever rank claimed first is the culprit so far), a loss that a
    collective made NaN on every rank (every rank's own, so far). Every rank's replay, op
    by op, tells whose own values went non-finite: those are `ranks_nonfinite`, the culprit
    stays the culprit if among them, else the lowest of them is, and its replay's report is
    the run's."""
    outcome = ranks.replay_result
    replayed = outcome.report if outcome is not None else None
    own = replayed is not None and replayed.status == "nonfinite" and replayed.root is not None \
        and _made_here(replayed.root, op_by_op=True)
    said = ranks.channel.tell_replay(own)
    owners = sorted(rank for rank, was_own in said.items() if was_own)
    if not owners:
        return final
    me = first.distributed.rank
    culprit = first.distributed.culprit_rank if first.distributed.culprit_rank in owners else owners[0]
    if me == culprit and final is first and replayed is not None:  # (it was stopped by a peer: its replay is the answer)
        final = modes.reproduced(outcome, first, found.what if isinstance(found, WatchFinding) else "value",
                                 first.step or 0, None) or final
    final.distributed = dataclasses.replace(first.distributed, culprit_rank=culprit, ranks_nonfinite=owners,
                                            stopped_by_peer=me != culprit)
    final.notes = [n for n in final.notes if n not in first.notes] + rank_words.notes(final.distributed, final.error)
    return final


def _run_under(observer: Observer, runner: ScriptRunner, mode: str, ranks: RankRun | None = None) -> RunReport:
    stopped_by = None
    outcome: ScriptOutcome | None
    if ranks is not None:
        ranks.listen(observer.peer_claimed, lambda: observer.state.step_or_none, lambda: observer.state.forwards_run)
        ranks.script_running = True
    try:
        with observer:
            outcome = runner.run(passthrough=(NonFiniteFound, StepLimitReached, PeerStopped),
                                 explained=lambda exc: ranks is not None and ranks.script_failed())
            observer.finish()
    except NonFiniteFound:
        outcome = ScriptOutcome(int(ExitCode.FOUND))
    except StepLimitReached:
        outcome, stopped_by = ScriptOutcome(0), "max_steps"
    except PeerStopped:
        outcome = ScriptOutcome(int(ExitCode.FOUND))
    finally:
        if ranks is not None:
            ranks.script_running = False
        _flush_user_streams()
    died_of = outcome.exception or outcome.failed_exit
    if died_of is not None and observer.raised_over(died_of) is not None:
        outcome = ScriptOutcome(int(ExitCode.FOUND), died_of)  # it died of what it found
    distributed = _settle(ranks, observer, outcome) if ranks is not None else None
    if distributed is not None and distributed.stopped_by_peer:
        # Stopped by (or errored because of) the culprit: its report tells the finding.
        outcome, stopped_by = ScriptOutcome(int(ExitCode.FOUND)), f"rank {distributed.culprit_rank}"
    report = build_report(
        runner.display_path, exit_code=outcome.exit_code, mode=mode, detection=observer.detection,
        error=outcome.exception, step=observer.state.step_or_none, history=observer.history(),
        stopped_by=stopped_by, discarded=observer.discarded(),
        amp=observer.amp.facts() if observer.amp.scaler_steps else None,
    )
    if distributed is not None:
        report.distributed = distributed
        report.notes += rank_words.notes(distributed, report.error)
        if ranks.terminated and distributed.culprit_rank is None and report.status == "clean":
            report.status = "script_error"  # it did not finish: not a clean run
            report.error, notes = rank_words.terminated(distributed)
            report.notes += notes
        if distributed.stopped_by_peer:
            report.status, report.error = "nonfinite", None
            report.reason = rank_words.stopped_reason(distributed)
    return report


def _settle(ranks: RankRun, observer: Observer, outcome: ScriptOutcome) -> RankReport:
    """Agree with the other ranks on the culprit (see distributed.py)."""
    found = observer.finding()
    stopped = found is not None or outcome.exit_code != 0 or observer.peer_claim is not None
    failed = found is None and outcome.exit_code != 0 and observer.peer_claim is None
    return ranks.settle(own_nonfinite=_own_values(found), found=found is not None, stopped=stopped,
                        step=observer.state.step_or_none, phase=_phase(found), failed=failed)


def _phase(found) -> str | None:
    """The phase of its step where this rank's value went non-finite."""
    if isinstance(found, WatchFinding):
        return found.phase
    if isinstance(found, Detection):
        return found.root.phase
    return None


def _own_values(found) -> bool:
    """Did this rank's own values go non-finite (not gradients averaged from the others)?"""
    if isinstance(found, WatchFinding):
        return found.what != "gradient"  # a gradient is seen only after the all-reduce
    if isinstance(found, Detection):
        return _made_here(found.root, op_by_op=False)
    return False


def _made_here(root, op_by_op: bool) -> bool:
    """Was this root made by this rank itself, not brought from the others by a collective:
    what one wrote, or a value that appeared with no op that made it (no op at all; in a
    replay, which checks backward op by op, also a backward op's input, as DDP's averaged
    gradients arrive: a first run's module regions and node checks leave such inputs too)?"""
    if root.op.startswith(_COLLECTIVES) or root.facts.received_from_peers:
        return False
    arrived = root.facts.untracked_input and root.facts.batch is None and not root.facts.entered \
        and (not root.op or op_by_op and root.phase == "backward")
    return not arrived


_COLLECTIVES = ("c10d.", "_c10d_functional.", "c10d_functional.", "torch.distributed.")


def _flush_user_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
