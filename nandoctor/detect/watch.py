"""Watch mode: check only at step boundaries, cheap enough to leave on for a whole run.

Per optimizer step it reads the loss seen at `backward()`, kept on its device, in one host
sync before `optimizer.step()`: a non-finite loss stops the run before the update, so the
weights are still clean. The gradients are not read by default: one pass over them costs
about as much as the rest of watch mode together (2% of a small model's step), and a
non-finite gradient under a finite loss shows in the next step's loss, since the update
carries it into the weights. Localising the op is the replay's job (see `replay.py`): the
script runs again, seeded the same, under the per-op detector, which finds the same op
either way. The gradients' norm is read with the loss (one reduction each, the same sync)
where the one-step delay would cost more than the pass:
- `run.watch_gradients = true`: the user wants the run stopped before any bad update;
- ranks train together (torch.distributed): every rank must stop at the same step, and
  only the averaged gradients are the same on every rank;
- the step saw no loss (gradients written by hand): there is nothing else to read.
A norm `clip_grad_norm_` already measured is read in every case: it costs nothing.

Without an optimizer (a hand-written update loop) the loss is checked at `backward()`.
"""
from __future__ import annotations

import math
import weakref
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from nandoctor.detect.boundaries import global_norm
from nandoctor.detect.hooks import TrainingHooks
from nandoctor.detect.observer import (NonFiniteFound, Observer, finite_metric, raised_at, ranks_train_together,
                                      refuses_values, speaks_of_nonfinite)
from nandoctor.detect.provenance import SourceLocator
from nandoctor.detect.records import stored_values
from nandoctor.detect.result import WatchFinding


class StepWatcher(Observer):
    """Watch mode's observer: the loss and the gradients at step boundaries, nothing per op.
    It does not install DataLoader hooks: a bad batch shows in the loss."""

    def __init__(self, run_settings, locator: SourceLocator | None = None) -> None:
        super().__init__(run_settings)
        self.locator = locator or SourceLocator()
        self.watch_finding: WatchFinding | None = None
        self._loss: torch.Tensor | None = None
        self._loss_where = None
        # Losses of earlier backward() calls in the step (gradient accumulation), with their
        # lines: a micro-batch's NaN loss is its rank's own, though only its gradients reach
        # the step (and, under DDP, every rank's after the all-reduce). Read in the step's sync.
        self._earlier: list[tuple[torch.Tensor, Any]] = []
        self._scaled_loss = False
        self._optimizers: "weakref.WeakSet" = weakref.WeakSet()
        self._every_gradient = bool(run_settings.get("watch_gradients", False))
        # Per parameter that held infinities before its optimizer's first step (a CRF's -inf
        # forbidden transitions): where they were and what they were (see `_weights_clean`).
        self._constants = WeakIdKeyDictionary()  # parameter -> (where, values)
        self._first_steps_seen: "weakref.WeakSet" = weakref.WeakSet()
        self._hooks = TrainingHooks(self)

    def __enter__(self) -> "StepWatcher":
        self._hooks.install()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.uninstall()

    def finding(self) -> WatchFinding | None:
        return self.watch_finding

    # -- the boundaries --------------------------------------------------------------

    def before_backward(self, roots, plain: bool = False) -> int:
        roots, self._scaled_loss = self.amp.unscaled(roots)  # a GradScaler's scaled loss: the loss itself
        loss = next((t for t in roots if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
        if loss is None or loss.is_meta:  # a meta tensor has no value to check
            return 0
        if self._loss is not None and self.state.optimizer_seen and not self._scaled_loss:
            self._earlier.append((self._loss, self._loss_where))
        if loss.dim() == 0:
            self._loss = loss.detach()
        else:
            self._loss = loss.detach().sum() if loss.numel() != 1 else loss.detach().view(())
        self._loss_where = self.locator.user_frame(2)
        if not self.state.optimizer_seen:  # no step boundary to batch the check with
            value = float(self._loss.item())
            if not math.isfinite(value):
                self._stop("loss", value, None, self._loss_where)
        return 0

    def optimizer_created(self, optimizer) -> None:
        # From here on the loss is checked with the gradients, in the step's one sync.
        super().optimizer_created(optimizer)
        self._optimizers.add(optimizer)

    def before_optimizer_step(self, optimizer) -> None:
        self.optimizer_created(optimizer)
        if optimizer not in self._first_steps_seen:
            self._first_steps_seen.add(optimizer)
            self._note_constants(optimizer)
        earlier, self._earlier = self._earlier, []
        grads = self._gradients_to_read(optimizer, loss_seen=self._loss is not None or bool(earlier))
        # (Both are 0-d and hold no graph: the loss kept detached, the norm clip measured.)
        head = [t if t.dim() == 0 else t.reshape(()) for t in (self._loss, self.state.clipped_from)
                if isinstance(t, torch.Tensor)]
        values = [t for t, _ in earlier] + head + (list(torch._foreach_norm(grads)) if grads else [])
        if not values:
            return
        # The one host sync of the step: the losses, the norm clip_grad_norm_ measured and
        # the gradients' norms where read (one reduction each) in one transfer, combined
        # here in float64 (where the squares of float32 norms cannot overflow).
        numbers = _as_floats(values)
        for (_, where), value in zip(earlier, numbers[:len(earlier)]):
            if not math.isfinite(value):
                self._stop("loss", value, None, where)
        del numbers[:len(earlier)]
        loss = numbers.pop(0) if self._loss is not None else None
        clipped_from = numbers.pop(0) if isinstance(self.state.clipped_from, torch.Tensor) else None
        grad_norm = math.sqrt(math.fsum(n * n for n in numbers)) if grads else None
        if grad_norm is not None and not math.isfinite(grad_norm):
            grad_norm = global_norm(grads)  # rare: tell a norm that overflowed float32 from a bad gradient
        self.state.pending_loss = loss
        self.state.pending_grad_norm = clipped_from if clipped_from is not None else grad_norm
        if loss is not None and self._scaled_loss:
            self.amp.loss_seen(math.isfinite(loss))  # (a non-finite one skips the step: not here)
        if loss is not None and not math.isfinite(loss):
            self._stop("loss", loss, grad_norm, self._loss_where)
        if grad_norm is not None and not math.isfinite(grad_norm):
            self._stop("gradient", loss, grad_norm, self.locator.user_frame(2))

    def _gradients_to_read(self, optimizer, loss_seen: bool) -> list[torch.Tensor]:
        """The gradients whose norm this step reads (see the module docstring): none when
        the step's loss tells enough."""
        if loss_seen and not self._every_gradient and not ranks_train_together():
            return []
        return [stored_values(g) for group in optimizer.param_groups for p in group["params"]
                if (g := p.grad) is not None and not g.is_meta]

    def scaler_stepped(self, scaler, optimizer, skipped: bool) -> None:
        """A step the scaler skipped ran no optimizer.step(), so no check: the loss is read
        here (the scaler already synced to decide), and a scale that collapsed stops it."""
        super().scaler_stepped(scaler, optimizer, skipped)
        if not skipped:
            return
        loss = float(self._loss.item()) if self._loss is not None else None
        self._loss = None
        self._earlier.clear()
        if loss is not None and self.amp.loss_seen(math.isfinite(loss)):
            self._stop("loss", loss, None, self._loss_where)
        if self.amp.collapsed(scaler) is not None:
            self._stop("gradient", loss, None, self.locator.user_frame(2))

    def after_optimizer_step(self, optimizer) -> None:
        self._loss = None
        super().after_optimizer_step(optimizer)

    def clearing_gradients(self, optimizer, clear):
        """The script throws away the gradients of the losses kept so far (a skipped step):
        those losses are discarded with them."""
        self._earlier.clear()
        self._loss = None
        return clear()

    def metric_followed(self, metric) -> None:
        """A non-finite metric training follows lowers the learning rate or ends training."""
        if not finite_metric(metric):
            self._stop("monitored metric", None, None, self.locator.user_frame(2))

    def state_exported(self, module, state) -> None:
        """The weights of a model no optimizer trains (an EMA or SWA average, written through
        detached aliases outside any step) are checked when the script takes them out: one
        pass over them. A trained model's are not: its gradients were checked at every step
        and its parameters are checked when the script ends."""
        trained = {id(p) for opt in self._optimizers for group in opt.param_groups for p in group["params"]}
        averaged = [p for p in module.parameters() if id(p) not in trained]
        if not _all_finite(averaged):
            self._stop("exported", None, None, self.locator.user_frame(2))

    def raised_over(self, error: BaseException) -> WatchFinding | None:
        """The script raised over a non-finite value it checked itself, between two of
        watch's boundaries: a finding for the replay under trace to localise (it raises
        there again, over the value trace saw made)."""
        if self.watch_finding is not None:
            return None
        # An op's refusal of its values (BCE's range check) may be over a NaN watch cannot
        # see: the replay looks; the script's own error stands if it finds none.
        guarded = speaks_of_nonfinite(error) or self.locator.tests_finiteness(raised_at(error))
        what = "loss" if guarded else "refused" if refuses_values(error) else None
        if what is None:
            return None
        self.watch_finding = WatchFinding(what, self.state.step, None, None, None, weights_clean=self._weights_clean())
        return self.watch_finding

    def finish(self) -> None:
        """The script ended with every loss and gradient finite; its weights may still not
        be. An optimizer can make NaN from finite gradients (Adam with eps=0 on rows that
        never get a gradient), and a loss that never looks at those rows stays finite. One
        exact check of the parameters, once per run, finds them before the user ships them."""
        if self._weights_clean() is False:
            self._stop("parameters", None, None, None)

    # -- stopping --------------------------------------------------------------------

    def _stop(self, what: str, loss, grad_norm, where) -> None:
        self.watch_finding = WatchFinding(what, self.state.step, self.locator.location(where), loss, grad_norm,
                                          weights_clean=self._weights_clean())
        raise NonFiniteFound(f"the {what} is non-finite")

    def _note_constants(self, optimizer) -> None:
        """Once per optimizer, before its first step: the infinities its parameters were
        built with (one pass over them)."""
        params = [p for g in optimizer.param_groups for p in g["params"]]
        if _all_finite(params):
            return
        for p in params:
            if p.is_floating_point() and not p.is_meta and not bool(torch.isnan(p).any()):
                where = torch.isinf(p.detach())
                if bool(where.any()):
                    self._constants[p] = (where, p.detach()[where].clone())

    def _weights_clean(self) -> bool | None:
        """Are the parameters finite now? (On the rare path only: one exact check.)

        No update was applied from the bad gradient, but a non-finite loss can come from
        weights an earlier step corrupted (an optimizer with eps=0 and finite gradients).
        None when no optimizer was seen, so there is nothing to vouch for.
        """
        params = [p for opt in self._optimizers for g in opt.param_groups for p in g["params"]]
        if not params:
            return None
        return all(_all_finite([p]) or self._holds_only_its_constants(p) for p in params)

    def _holds_only_its_constants(self, p: torch.Tensor) -> bool:
        """Are `p`'s non-finite values the infinities it held before training, where they
        were (a constant of the model that training never touched)?"""
        kept = self._constants.get(p)
        if kept is None:
            return False
        where, values = kept
        now = p.detach()
        return bool(torch.equal(~torch.isfinite(now), where)) and bool(torch.equal(now[where], values))


def _all_finite(params) -> bool:
    """Every element of every floating-point parameter finite (exact; meta ones hold none)."""
    return all(bool(torch.isfinite(p).all()) for p in params if p.is_floating_point() and not p.is_meta)


def _as_floats(values: list[torch.Tensor]) -> list[float]:
    """0-d tensors read back as float32 numbers. On the CPU, where a read is no sync, each
    is read on its own (seven: 1.2 µs against 2.8 µs stacked, hot). On an accelerator they
    come back in one transfer; float32 on one device (the usual case) stacks as it is: a
    cast and a device test per value cost more than the norms of a small model's gradients."""
    if all(v.is_cpu for v in values):
        return [(v if v.dtype == torch.float32 else v.float()).item() for v in values]
    try:
        stacked = torch.stack(values)
    except RuntimeError:  # (on several devices)
        stacked = None
    if stacked is None or stacked.dtype != torch.float32:
        device = values[0].device
        stacked = torch.stack([v.float() if v.device == device else v.float().to(device) for v in values])
    return stacked.tolist()
