"""Checks at the training boundaries: the loss, the gradients, the optimizer's step.

These run where a non-finite value starts to matter, with nandoctor's own ops unchecked
(the detector calls them inside `internal()`). Each finds the record of the bad value (or
makes a bare one when no checked op made it) and hands it to `stop` with the reason.
"""
from __future__ import annotations

import math
import weakref
from typing import Callable

import torch

from nandoctor.detect.amp import ScalerTracker
from nandoctor.detect.device_flags import HostRead
from nandoctor.detect.hooks import optimizer_name
from nandoctor.detect.lineage import birth_of
from nandoctor.detect.mode import all_finite
from nandoctor.detect.recorder import Recorder
from nandoctor.detect.records import Record, next_order, stored_values
from nandoctor.detect.result import StopReason
from nandoctor.detect.state import TrainingState
from nandoctor.detect.update_bounds import UpdateBounds

Stop = Callable[..., None]  # stop(record, reason, needs_replay=False): raises NonFiniteFound


class BoundaryChecks:
    def __init__(self, state: TrainingState, recorder: Recorder, stop: Stop) -> None:
        self.state = state
        self.recorder = recorder
        self.stop = stop
        self._optimizers_checked: "weakref.WeakSet" = weakref.WeakSet()
        self.optimizers: "weakref.WeakSet" = weakref.WeakSet()  # every optimizer made in the run
        self._kept_losses: list[torch.Tensor] = []  # losses not read at backward() (see `loss`)
        self.update_bounds = UpdateBounds()  # when the parameters' pass after a step can be left out

    # -- backward ----------------------------------------------------------------------

    def loss(self, tensors, amp: ScalerTracker | None = None, keep: bool = False) -> int:
        """The loss reaches backward(): a non-finite loss stops the run here (a GradScaler's
        loss, `amp`: when it is non-finite several steps in a row, see amp.py). With `keep`
        (an optimizer's step will apply its gradients) a scalar loss is kept, on its device,
        and checked with the step instead (`kept_losses`), or dropped with the gradients it
        made (`drop_kept_losses`). Returns a mark: any non-finite value made in backward
        after it is a reason to look at the gradients."""
        for t in tensors[:1] if amp is not None else tensors:
            if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()) or t.is_meta:
                continue
            if keep and t.numel() == 1:
                self._kept_losses.append(t.detach().reshape(()))
                continue
            if t.numel() == 1:  # the usual scalar loss: one read gives the value and the check
                value = float(t.detach().item())
                self.state.note_loss(value)
                finite = math.isfinite(value)
            else:
                finite = all_finite(t)
            if amp is not None and not amp.loss_seen(finite):
                continue  # the scaler skips this step
            if not finite:
                record = self.recorder.existing_or_bare(t, "loss", "forward")
                if amp is not None:
                    birth_of(record).facts.amp = amp.facts()
                self.stop(record, StopReason.LOSS)
        return next_order()

    def drop_kept_losses(self) -> None:
        """The gradients of the kept losses are being thrown away (`zero_grad()`): those
        losses are not applied, so they no longer matter."""
        self._kept_losses.clear()

    def take_kept_losses(self, transfer: HostRead) -> Callable[[list], None]:
        """Queue the losses kept since the last step on `transfer` (read with the step's
        other numbers); the function returned notes them in the history, and a non-finite
        one stops the run (before the update: the step's boundary)."""
        kept, self._kept_losses = self._kept_losses, []
        places = [transfer.add(t) for t in kept]

        def check(host: list) -> None:
            for t, place in zip(kept, places):
                value = float(host[place][0])
                self.state.note_loss(value)
                if not math.isfinite(value):
                    self.stop(self.recorder.existing_or_bare(t, "loss", "forward"), StopReason.LOSS)

        return check

    def gradients_after_backward(self, roots, mark: int, check: bool = True) -> None:
        """A leaf's gradient still non-finite after backward() stops the run. Only walked when
        this backward made a non-finite value somewhere (rare): most are masked inside
        autograd formulas and never reach a gradient."""
        if check and self.recorder.last_backward_order >= mark:
            for leaf in _leaves(roots):
                grad = leaf.grad
                if grad is not None and grad.is_floating_point() and self._trained(leaf) \
                        and not bool(torch.isfinite(stored_values(grad)).all()):
                    record = self.recorder.existing_or_bare(grad, "", "backward")
                    self._name_parameter(record, leaf)
                    self.stop(record, StopReason.GRADIENT_AFTER_BACKWARD)
        self.recorder.sites.new_generation()
        self.recorder.new_generation()

    def _trained(self, leaf: torch.Tensor) -> bool:
        """Is `leaf` something training updates from its .grad? A parameter, or any leaf
        while no optimizer is in the run (a hand-written update). An input that requires
        grad to differentiate through it (positions for forces, an image for a saliency
        map) holds a gradient like any other value: a non-finite one matters where it is
        used, and a double backward often leaves one there that nothing reads."""
        if not self.state.optimizer_seen or isinstance(leaf, torch.nn.Parameter) \
                or self.recorder.modules.parameter_name(leaf) is not None:
            return True
        return any(p is leaf for opt in (*self.optimizers, *self._optimizers_checked) for p in _parameters(opt))

    def returned_gradients(self, outputs) -> None:
        """torch.autograd.grad returned: its results are gradients the script holds."""
        for g in outputs or ():
            if isinstance(g, torch.Tensor) and not all_finite(g):
                self.stop(self.recorder.existing_or_bare(g, "", "backward"), StopReason.GRADIENT_RETURNED)
        self.recorder.sites.new_generation()

    # -- the optimizer step ------------------------------------------------------------

    def take_gradients(self, optimizer, transfer: HostRead) -> Callable[[list], None]:
        """Queue the norm of the gradients the step will apply on `transfer`; the function
        returned keeps it in the history, stops the run on a non-finite one, and (once per
        optimizer) checks the parameters."""
        grads = [stored_values(g) for group in optimizer.param_groups for p in group["params"]
                 if (g := p.grad) is not None and not g.is_meta]
        place = transfer.add(_float32_norm(grads)) if grads else None

        def check(host: list) -> None:
            total = 0.0
            if place is not None:
                total = float(host[place][0])
                if not math.isfinite(total):
                    total = _float64_norm(grads)  # rare: tell a float32 norm that overflowed from a bad gradient
                clipped_from = self.state.norm_before_clipping()
                self.state.pending_grad_norm = total if clipped_from is None else clipped_from
                if not math.isfinite(total):
                    self._stop_on_bad_gradient(optimizer)
            self.update_bounds.gradients_applied(optimizer, total)
            if optimizer not in self._optimizers_checked:
                # Once per optimizer: parameters that were non-finite before training (every
                # later change to them is an op the detector checks, or this step's own check).
                self._optimizers_checked.add(optimizer)
                self._check_parameters(optimizer)

        return check

    def after_step(self, optimizer) -> None:
        """One reduction over the parameters the step may have changed. A non-finite one
        stops the run; a seeded replay that checks each op of the step then finds the op."""
        params = [p for g in optimizer.param_groups for p in g["params"] if p.is_floating_point() and not p.is_meta]
        if not params or all_finite_sum(params):
            return
        for p in params:
            if not bool(torch.isfinite(p).all()) and not self._holds_only_its_constants(p):
                record = self.recorder.bare("", p, "optimizer")
                record.facts.parameter = self.recorder.parameter_ref(p, optimizer)
                record.facts.optimizer = optimizer_name(optimizer)
                self.stop(record, StopReason.UPDATE, needs_replay=True)

    def _check_parameters(self, optimizer) -> None:
        for p in _parameters(optimizer):
            if p.is_floating_point() and not p.is_meta and not bool(torch.isfinite(p).all()) \
                    and not self._holds_only_its_constants(p):
                record = self.recorder.existing_or_bare(p, "", "init" if not self.state.step else "optimizer")
                record.facts.parameter = record.facts.parameter or self.recorder.parameter_ref(p, optimizer)
                record.facts.parameter_before_step = True
                self.stop(record, StopReason.PARAMETER_BEFORE_STEP)

    def _holds_only_its_constants(self, p: torch.Tensor) -> bool:
        """Are `p`'s non-finite values only infinities written into it on purpose (a CRF's
        forbidden transitions, `self.trans[O, I] = float("-inf")` as the model is built),
        no more of them than were written? Their gradient is 0 (logsumexp, softmax), so
        Adam without decay and plain SGD leave them as they are; any NaN, or an Inf no
        record covers, is the step's."""
        records = self.recorder.records.all_of(p)
        if not records or not all(r.intended and r.output is not None and not r.output.nan for r in records):
            return False
        written = sum(r.output.posinf + r.output.neginf for r in records)
        return not bool(torch.isnan(p).any()) and int(torch.isinf(p).sum()) <= written

    def _stop_on_bad_gradient(self, optimizer) -> None:
        for p in _parameters(optimizer):
            if p.grad is not None and not bool(torch.isfinite(stored_values(p.grad)).all()):
                record = self.recorder.existing_or_bare(p.grad, "", "backward")
                record.facts.parameter = record.facts.parameter or self.recorder.parameter_ref(p, optimizer)
                self.stop(record, StopReason.GRADIENT_BEFORE_STEP)

    def _name_parameter(self, record: Record, leaf: torch.Tensor) -> None:
        if record.facts.parameter is None and self.recorder.modules.parameter_name(leaf) is not None:
            record.facts.parameter = self.recorder.parameter_ref(leaf)


def global_norm(tensors: list[torch.Tensor]) -> float:
    """The 2-norm over all `tensors`: non-finite iff some element is. One reduction per
    tensor in their own dtype, combined in float32; only if that overflows is it
    recomputed in float64, so a finite float32 gradient never reads as Inf."""
    total = float(_float32_norm(tensors).item())
    return total if math.isfinite(total) else _float64_norm(tensors)


def _float32_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm over all `tensors`, 0-d float32 on their device (no read)."""
    norms = torch._foreach_norm(tensors)
    stacked = torch.stack(norms)
    if stacked.dtype != torch.float32:  # (float32 norms need no cast: a call per tensor saved)
        stacked = torch.stack([n.float() for n in norms])
    return torch.linalg.vector_norm(stacked)


def _float64_norm(tensors: list[torch.Tensor]) -> float:
    """The 2-norm in float64, where the squares of finite float32 values cannot overflow.
    (A float64 norm takes real values: a complex tensor's norm is its magnitudes'.)"""
    real = [t.abs() if t.is_complex() else t for t in tensors]
    return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(real, 2, dtype=torch.float64))).item())


def all_finite_sum(tensors: list[torch.Tensor]) -> bool:
    """Cheap and one-sided, like the hot path's check: True proves every element of every
    tensor finite. A sum reads each element once and is half the cost of a norm (no
    squares); False may be a sum of large finite values that overflowed."""
    with torch.no_grad():
        if all(t.is_cpu for t in tensors):
            # A read per tensor is no sync on the CPU, and fewer calls than a stack: on a
            # 4 ms step this took 42 µs where stacking the sums took 75 µs.
            return math.isfinite(sum(t.sum().item() for t in tensors))
        sums = [t.sum() for t in tensors]
        if len({(s.device, s.dtype) for s in sums}) > 1:  # (model parallel, mixed precision)
            return all(math.isfinite(float(s.item())) for s in sums)
        return math.isfinite(float(torch.stack(sums).sum().item()))


def _parameters(optimizer):
    for group in optimizer.param_groups:
        yield from group["params"]


def _leaves(roots):
    """The leaf tensors (parameters, inputs with requires_grad) reachable from `roots`."""
    stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    # Keyed by id but holding the node itself: a graph node's Python object lives only while
    # referenced, so a freed one's id can come back for another node (seen on torch 2.9: a
    # parameter's AccumulateGrad got the id of the node walked just before, and was skipped).
    seen: dict[int, object] = {}
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        variable = getattr(node, "variable", None)
        if variable is not None:
            yield variable
        stack.extend(fn for fn, _ in node.next_functions)
