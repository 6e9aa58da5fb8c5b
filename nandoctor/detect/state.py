"""Where training is: the phase an op runs in, the optimizer step count, the history.

Shared by every observer (trace and watch): the training hooks move it along, the hot path
asks for the phase only on the rare path.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nandoctor.detect.result import History


@dataclass
class StepHistory:
    """The last `size` steps' loss and gradient norm (bounded: a long run does not grow it)."""

    size: int
    steps: list[int] = field(default_factory=list)
    loss: list[float | None] = field(default_factory=list)
    grad_norm: list[float | None] = field(default_factory=list)

    def add(self, step: int, loss: float | None, grad_norm: float | None) -> None:
        self.steps.append(step)
        self.loss.append(loss)
        self.grad_norm.append(grad_norm)
        if len(self.steps) > self.size:
            del self.steps[0], self.loss[0], self.grad_norm[0]

    def drop_last(self, count: int) -> None:
        if count:
            del self.steps[-count:], self.loss[-count:], self.grad_norm[-count:]

    def as_report(self) -> History:
        return History(list(self.steps), list(self.loss), list(self.grad_norm))


class TrainingState:
    """Step count, phase flags and the loss / gradient norm of the step in progress."""

    def __init__(self, history_size: int) -> None:
        self.step = 0  # optimizer steps completed
        self.optimizer_seen = False
        self.training_started = False
        self.in_optimizer = False
        self.backward_started = False  # the step in progress reached backward() (its forward ran)
        self.data_depth = 0  # > 0 while a DataLoader produces a batch
        self.history = StepHistory(history_size)
        self.pending_loss: float | None = None
        self.pending_grad_norm: float | None = None
        self.clipped_from = None  # the norm clip_grad_norm_ measured this step, a tensor
        self.transforms: set[str] = set()  # torch.func transforms ran backward/grad (not checked there)
        self.transform_depth = 0  # > 0 inside a function torch.func differentiates or maps
        self.backwards_without_optimizer = 0  # backward() calls while no optimizer exists
        self._entries_without_step = 0
        self.script_grad: bool | None = None  # the script's grad mode while nandoctor's own ops run

    def grad_enabled(self) -> bool:
        """The script's grad mode (nandoctor's own work runs with it off: see
        `Detector.internal`)."""
        return torch.is_grad_enabled() if self.script_grad is None else self.script_grad

    @property
    def step_or_none(self) -> int | None:
        """The step count for a report: None while no optimizer exists (no steps to count)."""
        return self.step if self.optimizer_seen else None

    @property
    def forwards_run(self) -> int | None:
        """How many steps' forward passes this rank has run: the steps completed, and the
        step in progress once its backward started. None while no optimizer exists."""
        if not self.optimizer_seen:
            return None
        return self.step + (1 if self.backward_started else 0)

    def phase(self, node, args, module: str | None, building=lambda: False,
              preparing_data=lambda: False, loading: bool = False, model_ran=lambda: True,
              in_training_loop=lambda: True) -> str:
        """The phase of an op. Before training (a batch drawn, a backward run, or, once an
        optimizer exists, a module run or a loop that trains entered: a Trainer that builds
        its optimizer in `__init__` and prepares its data after, before any loop, is still
        preparing data), an op inside a module's forward or one that builds an autograd
        graph is forward; one that sets up the model — inside a module's `__init__`,
        touching a parameter, loading a state dict (`building()`) — is init; anything else
        prepares data (normalising a dataset up front, building targets)."""
        if node is not None:
            return "backward"
        if self.in_optimizer:
            return "optimizer"
        if loading:
            return "init"  # load_state_dict sets the model up, also when a run resumes mid-script
        builds_graph = _builds_graph(args, self.grad_enabled())
        if self.data_depth or (module is None and not builds_graph and preparing_data()):
            return "data"  # (a Dataset built mid-run, after the optimizer, prepares data too)
        if module is None and not self.transform_depth and not builds_graph and not (
                self.training_started or (self.optimizer_seen and (model_ran() or in_training_loop()))):
            return "init" if _touches_parameter(args) or building() else "data"
        return "forward"

    def optimizer_created(self) -> None:
        self.optimizer_seen = True

    def note_loss(self, value: float) -> None:
        """The first loss of a step is the one its history keeps. With no optimizer (an
        update loop written by hand: `w -= lr * w.grad`), each backward is a step of the
        history, so a loss that grows step after step shows there too."""
        if not self.optimizer_seen:
            self.backwards_without_optimizer += 1
            self.history.add(self.backwards_without_optimizer, value, None)
            self._entries_without_step += 1  # (taken back should an optimizer step follow after all)
        if self.pending_loss is None:
            self.pending_loss = value

    def step_finished(self) -> None:
        # An optimizer made before nandoctor started is seen at its first step: the
        # backward passes before it are that step's, not steps of their own.
        self.history.drop_last(self._entries_without_step)
        self._entries_without_step = 0
        self.step += 1
        self.backward_started = False
        self.history.add(self.step, self.pending_loss, self.pending_grad_norm)
        self.pending_loss = self.pending_grad_norm = self.clipped_from = None

    def norm_before_clipping(self) -> float | None:
        """The gradient norm clip_grad_norm_ measured this step, if it ran (one read)."""
        total = self.clipped_from
        return None if total is None else float(total)


def _touches_parameter(args) -> bool:
    return any(isinstance(a, torch.nn.Parameter) or isinstance(getattr(a, "_base", None), torch.nn.Parameter)
               for a in args)


def _builds_graph(args, grad_enabled: bool) -> bool:
    if not grad_enabled:
        return False
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
