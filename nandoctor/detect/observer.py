"""The observer protocol: what watches a running script, and what the training hooks call.

An observer is a context manager around the script. `TrainingHooks` (hooks.py) calls it
at the points where training shows itself; each method's default does nothing, so an
observer implements only the boundaries it checks. When it finds a non-finite value it
raises `NonFiniteFound` into the script and keeps what it found for `finding()`.

Implemented by `Detector` (trace mode: every op, see detector.py) and `StepWatcher` (watch
mode: step boundaries only, see watch.py); the session picks one per run mode.
"""
from __future__ import annotations

import linecache
import math
import re
import types
from typing import Any, Callable

import torch

from nandoctor.detect.amp import ScalerTracker
from nandoctor.detect.result import Detection, Discarded, History, WatchFinding
from nandoctor.detect.state import TrainingState
from nandoctor.errors import error_message


class NonFiniteFound(BaseException):
    """Raised into the script to stop it at the first non-finite value (a BaseException, so a
    script's `except Exception` cannot swallow it)."""


class PeerStopped(BaseException):
    """Raised into the script when another rank of a distributed run found a non-finite
    value: this rank stops at its next step boundary instead of training on."""


class StepLimitReached(BaseException):
    """Raised into the script after `max_steps` optimizer steps (a clean, deliberate stop)."""


class Observer:
    """Base of every observer; see the module docstring."""

    # DataLoader hooks are installed only for observers that check batches; hooks where
    # values leave torch (.tolist(), .numpy(), printing, torch.save) or enter it
    # (torch.from_numpy, torch.as_tensor, torch.load) only for those that follow values.
    watches_data: bool = False
    watches_values: bool = False
    # Set when the observer localised the op itself (the report is built from it); an
    # observer that only sees boundaries leaves it None and says what it saw in finding().
    detection: Detection | None = None

    def __init__(self, run_settings) -> None:
        self.state = TrainingState(int(run_settings.get("history", 64)))
        self.max_steps = int(run_settings.get("max_steps", 0) or 0)
        self.amp = ScalerTracker()
        self.peer_claim = None  # set (from the peers' thread) when another rank claimed the run

    # -- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> "Observer":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def finish(self) -> None:
        """The script ended without a stop: check whatever is still pending."""

    def peer_claimed(self, claim) -> None:
        """Another rank found a non-finite value (called from a background thread)."""
        self.peer_claim = claim

    def check_peers(self) -> None:
        """At a step boundary: stop here if another rank has found a non-finite value.

        When the culprit's value went non-finite in a forward pass this rank has not run yet
        (it heard the claim a moment before reaching that step, as ranks in step with each
        other do), it first runs that forward, so that its report says whether its own
        values went non-finite there too: a bug every rank hits is told from one rank's bad
        batch. It runs no further than that step's backward(), whose collectives the culprit
        never joins. The culprit has run every collective of its forward, so this rank's
        forward finds its peers there."""
        claim = self.peer_claim
        if claim is None:
            return
        ran = self.state.forwards_run
        if claim.phase == "forward" and claim.step is not None and ran is not None and ran <= claim.step:
            return
        raise PeerStopped(f"rank {claim.rank} found a non-finite value")

    # -- the boundaries (called by TrainingHooks) ------------------------------------------

    def before_backward(self, roots: list, plain: bool = False) -> int:
        """The loss reaches backward() / autograd.grad; returns a mark for after_*. `plain`:
        a backward() that builds no graph, outside torch.func (see detect/nodes.py)."""
        return 0

    def backward_failed(self) -> None:
        """backward() raised (after before_backward): no after_backward comes."""

    def python_in_backward(self, fn):
        """`fn`, a function the script gives autograd to call inside backward (a tensor's
        hook), as it is to be registered."""
        return fn

    def after_backward(self, roots: list, mark: int) -> None:
        """backward() returned: the leaves' .grad are what the script keeps."""

    def after_grad(self, outputs: Any, mark: int) -> None:
        """torch.autograd.grad returned `outputs`."""

    def optimizer_created(self, optimizer) -> None:
        self.state.optimizer_created()

    def closure_started(self, optimizer) -> None:
        """optimizer.step(closure) calls the closure: forward and backward run inside the
        step (LBFGS, Lightning's automatic optimization). When it returns, the step is
        about to apply its gradients: `before_optimizer_step` follows."""

    def stepping(self, optimizer, step: Callable[[], Any]) -> Any:
        """optimizer.step() is called: `step()` runs it, its own hooks included (the
        boundaries around the update: before_optimizer_step, after_optimizer_step).
        Returns what it returns."""
        return step()

    def clearing_gradients(self, optimizer, clear: Callable[[], Any]) -> Any:
        """optimizer.zero_grad(): `clear()` sets its gradients to None or to zeros, which
        makes nothing non-finite. Returns what it returns."""
        return clear()

    def gradients_clipped(self, total_norm) -> None:
        """clip_grad_norm_ measured `total_norm` (a tensor) before clipping the gradients:
        the norm the history keeps, since the gradients the step sees are clipped."""
        self.state.clipped_from = total_norm

    def loss_scaled(self, loss, scaled) -> None:
        """A GradScaler scaled `loss` into `scaled` for the backward to come (see amp.py)."""
        self.amp.scaled(loss, scaled)

    def scaler_stepped(self, scaler, optimizer, skipped: bool) -> None:
        """scaler.step(optimizer) returned; `skipped`: it did not call optimizer.step()."""
        self.amp.stepped(skipped)

    def before_optimizer_step(self, optimizer) -> None:
        """optimizer.step() is about to apply the gradients (for a step with a closure: the
        closure returned them)."""

    def after_optimizer_step(self, optimizer) -> None:
        """optimizer.step() returned: one more step completed."""
        self.state.step_finished()
        self.check_peers()
        if self.max_steps and self.state.step >= self.max_steps:
            raise StepLimitReached()

    def data_started(self) -> None:
        """A DataLoader starts producing a batch (only when `watches_data`)."""

    def data_finished(self) -> None:
        """...and is done (also when it raised)."""

    def check_batch(self, batch, batch_number: int, indices, dataset=None, collate=None, stream=None) -> None:
        """A batch came out of a DataLoader (only when `watches_data`): its number, the
        dataset indices of its samples, the dataset and the function that collated them,
        and for an IterableDataset its place in the stream (`batches.StreamPosition`)."""

    def value_read(self, t, value: float | None = None) -> None:
        """The script reads a tensor's values back (only when `watches_values`)."""

    def values_received(self, collective: str, received, sent: list) -> None:
        """A collective of torch.distributed (its name) wrote what the ranks sent into
        `received` (a tensor or a list of them); `sent` holds its other arguments, this
        rank's own share among them (all_gather's input)."""

    def value_entered(self, t, op: str) -> None:
        """A tensor entered torch from outside (numpy, a file) (only when `watches_values`)."""

    def metric_followed(self, metric) -> None:
        """Training follows `metric`: `ReduceLROnPlateau.step(metric)` sets the learning
        rate by it, Lightning's `EarlyStopping` ends training by it."""

    def state_exported(self, module, state) -> None:
        """`module.state_dict()` returned `state` (its outermost call: a checkpoint, an EMA
        copy, weights to deploy): the parameters and buffers the script takes out of it."""

    def saving(self, obj) -> None:
        """torch.save is about to write `obj` (only when `watches_values`)."""

    def loaded(self, obj) -> None:
        """torch.load returned `obj` (only when `watches_values`)."""

    def across_examples(self, values: list) -> list:
        """Of `(value, example dim)` pairs a torch.func transform hands a boundary, the values
        to check there. Under vmap a value holds one entry per example (per-example losses and
        gradients, as DP-SGD computes them): one whose non-finite entries lie in some examples
        only is the script's to drop (`torch.isfinite(g).all(1)`, then `where`). Kept, they
        spread into the update and from it into every example's next loss, and are found
        there, rooted where they were made."""
        with self.own_work():
            return [t for t, examples in values if examples is None or not _in_some_examples_only(t, examples)]

    def own_work(self):
        """A context for nandoctor's own ops on the script's tensors."""
        return torch.no_grad()

    def transform_seen(self, what: str) -> None:
        """A torch.func transform ran `what` (backward, grad): the boundary checks get the
        plain values under functorch's wrappers."""
        self.state.transforms.add(what)

    def compiled_call(self, fn, name: str, args, kwargs, eager=None):
        """Call `fn`, a function or module `name` compiled with torch.compile (see compiled.py);
        `eager` is the same code without Dynamo."""
        return fn(*args, **kwargs)

    def runtime_code(self) -> list:
        """Code objects that run inside the user's (maybe compiled) code on every op and
        that Dynamo must never compile (see compiled.py)."""
        return []

    # -- what it found ------------------------------------------------------------------

    def discarded(self) -> list[Discarded]:
        """Non-finite values that were made and never mattered (a clean run reports them)."""
        return []

    def raised_over(self, error: BaseException) -> Detection | WatchFinding | None:
        """The script raised `error` over a non-finite value it found itself (`if
        torch.isnan(loss): raise ...`): what the observer makes of it, as if it had stopped
        the run there; None when it has nothing or the error is about something else."""
        return None

    def finding(self) -> Detection | WatchFinding | None:
        """What made the observer stop the run (for the run mode to conclude from); None
        when it did not stop it."""
        return self.detection

    def history(self) -> History:
        return self.state.history.as_report()


_NONFINITE_WORDS = re.compile(r"\b(nan|inf|infinity)\b|non-?finite|not finite|isfinite|isnan|isinf", re.IGNORECASE)


# What an op says when it refuses the values it was given, not their shape, dtype or device:
# BCE's "all elements of target should be between 0 and 1" (a NaN fails every comparison),
# cholesky's "not positive-definite", an eigensolver that does not converge.
_REFUSES_VALUES = re.compile(r"between -?[\d.]+ and -?[\d.]+|out of (the )?range|positive.definite|converge|"
                             r"singular|ill-conditioned|probabilit", re.IGNORECASE)


def _in_some_examples_only(t, examples: int) -> bool:
    if not isinstance(t, torch.Tensor) or not (t.is_floating_point() or t.is_complex()) or t.is_meta \
            or t.dim() == 0 or t.shape[examples] < 2:
        return False
    bad = ~torch.isfinite(t.detach()).movedim(examples, 0).reshape(t.shape[examples], -1)
    per_example = bad.any(1)
    return bool(per_example.any()) and not bool(per_example.all())


def ranks_train_together() -> bool:
    """Several ranks of torch.distributed train this model (each step all-reduces)."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def finite_metric(metric) -> bool:
    """Is a monitored metric, a tensor or a number, finite? (Anything else is the
    scheduler's to refuse.)"""
    if isinstance(metric, torch.Tensor):
        return not metric.is_floating_point() or metric.is_meta or bool(torch.isfinite(metric.detach()).all())
    try:
        return math.isfinite(float(metric))
    except (TypeError, ValueError):
        return True


def refuses_values(error: BaseException) -> bool:
    """Is `error` an op's refusal of its input values (which a NaN or Inf fails)?"""
    return isinstance(error, RuntimeError) and bool(_REFUSES_VALUES.search(error_message(error)))


def raised_at(error: BaseException) -> tuple[types.CodeType, int] | None:
    """(code, line) of the innermost frame the error went through: the `raise`, the
    `sys.exit(1)`, the failed `assert`."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return (tb.tb_frame.f_code, tb.tb_lineno) if tb is not None else None


def speaks_of_nonfinite(error: BaseException) -> bool:
    """Does the error's message, or the line that raised it, speak of NaN/Inf?
    (`RuntimeError: loss is nan`, a bare `assert torch.isfinite(loss)`.)"""
    if _NONFINITE_WORDS.search(error_message(error)):
        return True
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    return bool(_NONFINITE_WORDS.search(linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno)))
