"""Everything said about a seeded replay: what it looks for, its progress line, its note,
and the `nonreproducible` cause when the failure did not come back."""
from __future__ import annotations

from nandoctor.detect.result import Detection, Site, WatchFinding
from nandoctor.diagnose.evidence import fmt
from nandoctor.report.model import Cause
from nandoctor.report.text import steps_done

_DETERMINISM_FIX = (
    "Make the run deterministic (`torch.manual_seed`, seeded DataLoader `generator` and `worker_init_fn`, "
    "`torch.use_deterministic_algorithms(True)`), then run again with `--mode trace`; if it still only "
    "happens on one machine, test that machine's GPU and memory."
)


def subject(detection: Detection) -> str:
    """What a trace-mode replay looks for, in the words of its progress line."""
    root = detection.root
    if root.facts.written_by_optimizer or root.phase == "optimizer":
        return "parameter update"
    if root.facts.device_flag is not None:
        return f"output of {root.op}"
    if root.op == "loss":
        return "loss"
    return "gradient" if root.phase == "backward" else "value"


# `step` below is always the number of optimizer steps completed, the report's `step`:
# every line says it the same way ("after 25 optimizer steps"), never as a 1-based "step 26".


# What watch mode finds in the weights themselves, outside a step's loss and gradients.
_WEIGHTS = ("parameters", "exported")


def started(mode: str, what: str, step: int, weights_clean: bool | None) -> str:
    if what == "refused":
        return (f"{mode} mode: the script died of an error an op raises over values a NaN fails, {steps_done(step)}; "
                "re-running the script under --mode trace to see whether a NaN or Inf was behind it...")
    value = "weights a state_dict() handed out" if what == "exported" else what
    return (f"{mode} mode: the {value} went non-finite {steps_done(step)}"
            + (" (the update was not applied)" if weights_clean and what not in _WEIGHTS else "")
            + (f"; re-running the script, checking {_replay_checks(what)}, to find the op..." if mode == "trace"
               else "; re-running the script under --mode trace to find the op..."))


def _replay_checks(what: str) -> str:
    """What trace's replay checks that its first run did not: the ops of the optimizer's
    step, or every op as it runs (a device flag's op, a compiled region's)."""
    return "each op inside optimizer.step()" if what == "parameter update" else "every op as it runs"


def reproduced(mode: str, what: str, step: int) -> str:
    seen = f"found {_seen(what, step)}" if what in _WEIGHTS else f"stopped on {_seen(what, step)}"
    return f"{mode} mode {seen}; a seeded replay checking every op found the op above."


def _seen(what: str, step: int) -> str:
    """What watch mode saw non-finite: the loss or gradient of a step, or, once the script
    ended, the parameters (or the error an op raised over a value)."""
    if what == "refused":
        return f"the script's error, {steps_done(step)}"
    if what == "parameters":
        return f"non-finite parameters at the end of the run, {steps_done(step)}"
    if what == "exported":
        return f"non-finite weights in a model no optimizer trains (an average), as a state_dict() handed them out {steps_done(step)}"
    return f"a non-finite {what} {steps_done(step)}"


def watch_stop_reason(finding: WatchFinding) -> str:
    if finding.what == "parameters":
        return "parameters are non-finite at the end of the run"
    if finding.what == "exported":
        return "a state_dict() handed out non-finite weights of a model no optimizer trains"
    return f"the {finding.what} is non-finite"


def refusal_not_nonfinite() -> str:
    return ("a seeded replay checking every op found no NaN or Inf behind the error: the values the op refused "
            "are finite, and out of its range (the script's own bug).")


def not_localised() -> str:
    return ("a seeded replay checking every op did not reproduce the failure, so the op inside the step is not "
            "known; nondeterminism or hardware may be involved.")


def flag_only() -> str:
    return "the op and line come from its device-side flag; its input values were not kept."


def replay_failed(last_line: str) -> str:
    return "the replay failed: " + last_line


def nonreproducible_flag(root: Site, step: int | None) -> Cause:
    """A device flag saw the op make NaN/Inf; the replay did not make it again."""
    value = "NaN" if root.facts.device_flag == "nan" else "Inf"
    where = f" at {root.location}" if root.location else ""
    return _nonreproducible(
        f"`{root.op}`{where} made {value} {steps_done(step or 0)}, as read from its device-side flag at the "
        "step boundary, but re-running the script from the start, with the same random seeds, checking every op "
        "at once, did not make it again.")


def nonreproducible_watch(finding: WatchFinding, replay_ran_clean: bool) -> Cause:
    """Watch mode saw a non-finite loss or gradient; the replay under trace did not."""
    how = "ran clean" if replay_ran_clean else "ended without a finding"
    seen = _seen(finding.what, finding.step)
    if finding.what not in _WEIGHTS:
        seen += f" (loss {fmt(finding.loss)}, gradient norm {fmt(finding.grad_norm)})"
    return _nonreproducible(
        f"Watch mode saw {seen}, but re-running the script from the start, with the same random "
        f"seeds, under the per-op detector {how} up to that step.")


def unlocalised_watch(finding: WatchFinding) -> Cause:
    """Watch mode saw a non-finite loss or gradient; the replay that finds the op was
    stopped (Ctrl-C) before it got there."""
    seen = _seen(finding.what, finding.step)
    return Cause(
        "unknown",
        "a non-finite value watch mode saw, not localised",
        f"Watch mode saw {seen}. The replay that finds the op (the script again, same seeds, under the per-op "
        "detector) was interrupted before it reached that step.",
        "Run again to let the replay finish, or run with `--mode trace`, which stops at the op itself.",
    )


_LOST_INPUT = {"pipe": "a pipe", "terminal": "the terminal", "file": "a file that cannot be opened again here"}


def replay_died(finding: WatchFinding, error: dict, lost_stdin: str | None) -> Cause:
    """Watch mode saw a non-finite loss or gradient; the replay that finds the op died of
    the script's own error before that step (`lost_stdin`: the first run's input, which the
    replay could not be given)."""
    died = f"`{error.get('type', 'Exception')}: {error.get('message', '')}`"
    why = (f" The first run read its standard input from {_LOST_INPUT.get(lost_stdin, lost_stdin)}, which cannot be "
           "read twice: the replay's input was empty." if lost_stdin else "")
    fix = ("Give the script its input as a file (`python -m nandoctor run ... < input.txt`: the replay reads it "
           "again) or as an argument; or run with `--mode trace`, which stops at the op in the first run."
           if lost_stdin else
           "Run with `--mode trace`, which stops at the op in the first run, without a replay. A script whose "
           "second run differs from its first (it resumes from a checkpoint it wrote) can read the environment "
           "variable `NANDOCTOR_REPLAY`, which is 1 in the replay.")
    return Cause(
        "unknown",
        "a non-finite value watch mode saw, not localised: its replay died first",
        f"Watch mode saw {_seen(finding.what, finding.step)}. The replay that finds the op (the script again, "
        f"same seeds, under the per-op detector) died of the script's own error before that step: {died}.{why}",
        fix,
    )


def replay_interrupted() -> str:
    return "the replay was interrupted (Ctrl-C) before it reached the failing step: the op is not localised."


def _nonreproducible(seen: str) -> Cause:
    return Cause(
        "nonreproducible",
        "a non-finite value that did not come back on replay",
        seen + " A failure that does not reproduce points at nondeterminism (data order or augmentation not "
        "seeded, nondeterministic GPU kernels, a race between workers, input the script reads that changed) or "
        "at hardware (a flaky GPU, memory errors).",
        _DETERMINISM_FIX,
    )
