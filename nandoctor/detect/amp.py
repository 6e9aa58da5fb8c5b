"""Mixed precision with a `torch.amp.GradScaler`: what the scaler does on purpose is not a
finding, what it cannot fix is.

The scaler multiplies the loss by a large scale before `backward()`, so float16 gradients
do not underflow; when the scaled gradients overflow it skips that step
(`optimizer.step()` is not called) and halves the scale. That probing is expected: a
healthy run skips a few steps, mostly at the start. So, for a backward from a scaled loss:

- the loss checked at `backward()` is the loss before scaling; a non-finite one makes the
  scaler skip that step, which is harmless once (a batch that overflows float16 now and
  then), so it is a finding only when it is non-finite `LOSSES_IN_A_ROW` steps in a row
  (a float16 overflow in forward the data always causes, a `log(0)`): training has stopped;
- gradients that are non-finite when backward returns are the scaler's to check, not a stop;
- a step the scaler skips is counted, and when it skips at a scale of 1 or less the
  gradients are non-finite even unscaled: no loss scale can fix that (`amp_scale_collapse`);
- a value the script computes from a scaled backward's gradients (the gradient norm it
  logs, `clip_grad_norm_`'s result printed) is as much the scaler's: reading it back is
  not a stop, since the step it belongs to is skipped.
"""
from __future__ import annotations

import collections
import weakref

import torch

from nandoctor.detect.records import lineage_of
from nandoctor.detect.result import AmpScaling

# At or below this scale a skipped step means the unscaled gradients are non-finite.
COLLAPSED_SCALE = 1.0
# Scaled backwards in a row whose loss is non-finite before the run stops.
LOSSES_IN_A_ROW = 3
# The latest scaled backwards whose values `from_scaled_gradients` recognises.
WINDOWS_KEPT = 16


class ScalerTracker:
    """The scaled loss of the backward to come, and the steps scalers skipped."""

    def __init__(self) -> None:
        self._scaled: "weakref.ref | None" = None
        self._loss: torch.Tensor | None = None
        self.skipped = 0  # steps skipped in the whole run
        self.skipped_in_a_row = 0
        self.scaler_steps = 0  # scaler.step() calls
        self.nonfinite_losses_in_a_row = 0
        # [first, end) record orders from each scaled backward to the next backward
        self._windows: collections.deque[list] = collections.deque(maxlen=WINDOWS_KEPT)

    def backward_began(self, mark: int, scaled: bool) -> None:
        """A backward began at record order `mark`, from a scaled loss or not."""
        if self._windows and self._windows[-1][1] is None:
            self._windows[-1][1] = mark
        if scaled:
            self._windows.append([mark, None])

    def from_scaled_gradients(self, record) -> bool:
        """Was `record` computed from what a scaled backward made (a gradient, or a norm of
        the gradients the script logs)?"""
        return bool(self._windows) and any(r.phase == "backward" and self._in_a_window(r.order)
                                           for r in lineage_of(record))

    def _in_a_window(self, order: int) -> bool:
        return any(first < order and (end is None or order < end) for first, end in self._windows)

    def scaled(self, loss: torch.Tensor, scaled: torch.Tensor) -> None:
        """scaler.scale(loss) returned `scaled`."""
        self._scaled = weakref.ref(scaled)
        self._loss = loss.detach()

    def unscaled(self, roots: list) -> tuple[list, bool]:
        """The roots of a backward with the scaled loss replaced by the loss itself, and
        whether it was scaled."""
        scaled = self._scaled() if self._scaled is not None else None
        if scaled is None or not roots or roots[0] is not scaled:
            return roots, False
        loss, self._scaled, self._loss = self._loss, None, None
        return [loss, *roots[1:]], True

    def loss_seen(self, finite: bool) -> bool:
        """The loss of a scaled backward was checked: True when a non-finite one is now a
        finding (`LOSSES_IN_A_ROW` in a row), False while the scaler may still skip it."""
        self.nonfinite_losses_in_a_row = 0 if finite else self.nonfinite_losses_in_a_row + 1
        return self.nonfinite_losses_in_a_row >= LOSSES_IN_A_ROW

    def stepped(self, skipped: bool) -> None:
        self.scaler_steps += 1
        if skipped:
            self.skipped += 1
            self.skipped_in_a_row += 1
        else:
            self.skipped_in_a_row = 0

    def collapsed(self, scaler) -> AmpScaling | None:
        """After a skipped step: the facts, when the scale can no longer help (one read)."""
        scale = float(scaler.get_scale())
        if scale > COLLAPSED_SCALE:
            return None
        return self.facts(scale)

    def facts(self, scale: float | None = None) -> AmpScaling:
        return AmpScaling(scale, self.skipped_in_a_row, self.skipped, self.scaler_steps,
                          self.nonfinite_losses_in_a_row)
