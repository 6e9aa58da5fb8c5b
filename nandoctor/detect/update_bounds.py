"""When an optimizer's update provably leaves finite parameters finite.

After each step trace mode reads every parameter the step may have changed (one pass over
memory, `BoundaryChecks.after_step`): on small models 2-7% of a step, where the parameters
have just gone through the optimizer's own passes and are out of the cache. For torch's
SGD, Adam and AdamW the update has a bound that the step's checks already know, and
below a quarter of the spacing of the format's largest numbers (2**102 ≈ 5e30 in float32)
it cannot make a finite parameter non-finite: `p - d` rounds to a finite number for any
finite `p` when `|d|` is under half that spacing. The pass is then left out.

The bounds, per optimizer, on every element of its state:
- read from the state once, when nandoctor first sees the optimizer step (zeros for a
  fresh one; a loaded or resumed state is read) and again after `load_state_dict`;
- grown by `G`, the norm of the gradients each step applies, read before it
  (`take_gradients`), which bounds every element of every gradient;
- SGD: the gradient it applies is at most `D = G + wd * P` (weight decay adds `wd * p`; `P`
  bounds every |p|: read once where a group decays, then grown by each update's bound); a
  momentum buffer becomes `mu * buf + (1 - dampening) * g`: `M = max(M, mu * M +
  max(1, |1 - dampening|) * D)` bounds it whether or not a parameter had a gradient. The
  update is at most `lr * (D + mu * M)` with Nesterov, `lr * M` with momentum, `lr * D`
  without;
- Adam and AdamW: `exp_avg` is a convex mix of itself and the gradient (at most
  `A = max(A, G)`), `exp_avg_sq` of itself and the square (`V = max(V, G**2)`), and the
  denominator is at least `eps`: the update is at most `lr * A / eps / (1 - beta1)`.
  `eps = 0` is not proven (0/0 on a row that never had a gradient); AdamW's decay scales
  `p` by `1 - lr * wd`.

Every other case reads the parameters as before: Adam's L2 weight decay (its `wd * p` goes
through the squares: not bounded here), another optimizer class or a subclass (its
step is someone's code), hooks on the step (a post-hook may write the parameters), new
parameters, float16 (a quarter of its top spacing is 8), complex or sparse values, state or
hyperparameters off the CPU, capturable or differentiable steps, a step after a compiled
call (its code may have written a parameter where no op was seen), or a bound past the
threshold (a learning rate blowing the weights up: exactly where the update may be the
first value to overflow, so the pass runs there).

The parameters were finite before the step: checked when the optimizer's first step began,
and every later write to them is an op the detector checks or a step's own (proven, or
read after it). `P` assumes the writes between steps do not make a weight larger than it
was by orders of magnitude (a checked op's value is finite, not bounded): a weight written
past 1e30 by hand is the one case where an SGD update with weight decay could overflow
unread, and the op that uses it then finds it.
"""
from __future__ import annotations

import math
import weakref

import torch
from torch.optim import SGD, Adam, AdamW
from torch.optim import optimizer as _optimizer_module

# What the bound must stay under in each format: a quarter of the spacing of its largest
# numbers (half the half-ulp: a margin for rounding in the bound's own arithmetic).
_THRESHOLD = {dtype: torch.finfo(dtype).max * torch.finfo(dtype).eps / 8
              for dtype in (torch.float32, torch.float64, torch.bfloat16)}
_PROVEN_CLASSES = (SGD, Adam, AdamW)


class _Grown:
    """One optimizer's bounds: on every element of its state, grown with each step."""

    __slots__ = ("state", "params", "average", "squares", "weights", "weights_read", "verdict", "unseen_writes")

    def __init__(self, optimizer, average: float, squares: float, weights: float | None, unseen_writes: int) -> None:
        self.state = optimizer.state  # (load_state_dict puts in another dict: bounds read again)
        self.params = _identities(optimizer)
        self.average = average  # |exp_avg| (Adam) or |momentum_buffer| (SGD)
        self.squares = squares  # exp_avg_sq and max_exp_avg_sq (Adam)
        self.weights = weights  # |p| (SGD with weight decay; None where no group decays)
        self.weights_read = weights  # ...as last read from the parameters themselves
        self.verdict: bool | None = None  # the step running now: proven by its bounds?
        self.unseen_writes = unseen_writes  # `UpdateBounds.unseen_writes` at its last step


class UpdateBounds:
    """Per optimizer, whether this step's update is proven to keep finite parameters finite."""

    def __init__(self) -> None:
        self._grown: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self.unseen_writes = 0

    def writes_unseen(self) -> None:
        """Code ran where an op writing a parameter would not be seen (a compiled call):
        the next step of every optimizer reads its parameters again."""
        self.unseen_writes += 1

    def gradients_applied(self, optimizer, grad_norm: float) -> None:
        """The step is about to apply gradients of norm `grad_norm`: the bounds grow by it
        (read from the state first, once, where they were not grown here), and whether
        they prove this step's update is decided now, with the hyperparameters it uses."""
        if type(optimizer) not in _PROVEN_CLASSES:
            return
        grown = self._grown.get(optimizer)
        if grown is None or grown.state is not optimizer.state:
            bounds = _state_bounds(optimizer)
            if bounds is None:
                self._grown.pop(optimizer, None)
                return
            grown = self._grown[optimizer] = _Grown(optimizer, *bounds, _weights_bound(optimizer), self.unseen_writes)
        groups = optimizer.param_groups
        if grown.weights is not None and not grown.weights <= _REREAD_AFTER_GROWING * max(grown.weights_read, 1.0):
            # The bound grows geometrically with weight decay (each step adds lr * wd * P)
            # while the weights themselves shrink: read them again, one pass in thousands of steps.
            grown.weights = grown.weights_read = _weights_bound(optimizer)
        if type(optimizer) is SGD:
            directions = [_sgd_direction(grown, group, grad_norm) for group in groups]
            buffers = [_sgd_buffers(grown.average, group, direction) for group, direction in zip(groups, directions)]
            if None in directions or None in buffers:
                del self._grown[optimizer]  # a momentum or decay the bounds cannot follow
                return
            grown.average = max(buffers)
            steps = [_sgd_step(grown.average if b else d, group, d) for b, d, group in zip(buffers, directions, groups)]
            if grown.weights is not None:
                grown.weights += max((step for _, step in steps), default=0.0)
            updates = [(d, grown.average, *step) for d, step in zip(directions, steps)]
        else:
            grown.average = max(grown.average, grad_norm)
            grown.squares = max(grown.squares, grad_norm * grad_norm)
            updates = [_adam_update(grown, group) for group in groups]
        if grown.params != _identities(optimizer):
            grown.verdict, grown.state = False, None  # new parameters: read after this step, bounds read anew
            return
        grown.verdict = not _hooked(optimizer) and all(_under_threshold(u, group) for u, group in zip(updates, groups))

    def proven_finite(self, optimizer) -> bool:
        """Did the step that just ran keep every parameter finite, by the bounds alone?"""
        grown = self._grown.get(optimizer)
        if grown is None:
            return False
        verdict, grown.verdict = grown.verdict, None
        if verdict is None or optimizer.state is not grown.state:
            del self._grown[optimizer]  # a step the bounds did not see begin: read them again
            return False
        unseen, grown.unseen_writes = grown.unseen_writes != self.unseen_writes, self.unseen_writes
        return verdict and not unseen


def _state_bounds(optimizer) -> tuple[float, float] | None:
    """The largest |exp_avg| (or |momentum_buffer|) and exp_avg_sq in the optimizer's
    state, read once (an empty state: zeros); None where it holds something else."""
    average = squares = 0.0
    for p, entry in optimizer.state.items():
        if not isinstance(entry, dict):
            return None
        for key, value in entry.items():
            if key == "step" or value is None:
                continue
            if key not in _STATE_KEYS or not isinstance(value, torch.Tensor) or value.is_complex() \
                    or not value.is_floating_point() or value.device.type != "cpu":
                return None
            largest = _largest_magnitude(value)
            if not math.isfinite(largest):
                return None  # (a NaN in the state reaches the parameters: the pass after the step finds it)
            if key in ("exp_avg_sq", "max_exp_avg_sq"):
                squares = max(squares, largest)
            else:
                average = max(average, largest)
    return average, squares


_STATE_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer")


def _identities(optimizer) -> list:
    return [tuple(map(id, group["params"])) for group in optimizer.param_groups]


def _hooked(optimizer) -> bool:
    """Does code besides torch's run in this step (hooks of the optimizer's own, global
    ones besides nandoctor's pair, a `step` set on the instance)?"""
    return bool(optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks
                or len(_optimizer_module._global_optimizer_pre_hooks) > 1
                or len(_optimizer_module._global_optimizer_post_hooks) > 1 or "step" in vars(optimizer))


# How far SGD's bound on the weights may grow past what they were read at before they are
# read again (see UpdateBounds.gradients_applied).
_REREAD_AFTER_GROWING = 1e3

# An update no bound is found for: not proven (the group is read after the step).
_UNBOUNDED = float("inf")


def _weights_bound(optimizer) -> float | None:
    """The largest |p| of an SGD optimizer whose groups decay weights (coupled weight decay
    adds `wd * p` to the gradient), read once; None where no group does (not needed)."""
    if type(optimizer) is not SGD or not any(group.get("weight_decay") for group in optimizer.param_groups):
        return None
    return max((_largest_magnitude(p) for group in optimizer.param_groups for p in group["params"]
                if p.is_floating_point()), default=0.0)


def _largest_magnitude(t: torch.Tensor) -> float:
    """max |t| (0 when empty); a NaN reads as Inf, so that it bounds nothing."""
    largest = float(t.detach().abs().max()) if t.numel() else 0.0
    return largest if largest == largest else math.inf


def _sgd_direction(grown: _Grown, group: dict, grad_norm: float) -> float | None:
    """The bound on the gradient SGD applies in `group`: the gradients' norm, plus `wd * |p|`
    with weight decay. None where the decay cannot be bounded (a number of no known type,
    or a decay with no bound on the weights read yet)."""
    decay = _number(group.get("weight_decay", 0))
    if decay is None or decay and grown.weights is None:
        return None
    return grad_norm + abs(decay) * grown.weights if decay else grad_norm


def _sgd_buffers(buffers: float, group: dict, direction: float | None) -> float | None:
    """The momentum buffers' bound (`buffers` before) after this step in `group` (0
    without momentum); None where the momentum cannot be followed."""
    momentum, dampening = _number(group.get("momentum", 0)), _number(group.get("dampening", 0))
    if direction is None or momentum is None or dampening is None or not momentum >= 0:
        return None
    if not momentum:
        return 0.0
    return max(buffers, momentum * buffers + max(1.0, abs(1 - dampening)) * direction)


def _sgd_step(buffers: float, group: dict, direction: float) -> tuple[float, float]:
    """SGD's update in `group` before and after the learning rate: the gradient (without
    momentum), the buffer, or with Nesterov the gradient plus momentum times it."""
    lr = _number(group["lr"])
    if lr is None:
        return _UNBOUNDED, _UNBOUNDED
    update = direction + (_number(group.get("momentum", 0)) or 0.0) * buffers if group.get("nesterov") else buffers
    return update, abs(lr) * update


def _adam_update(grown: _Grown, group: dict) -> tuple[float, ...]:
    """The bound on Adam's or AdamW's update in `group` and every intermediate of its step:
    exp_avg_sq over its bias correction (at least 1 - beta2), exp_avg over the denominator
    (at least eps), and the update, lr / (1 - beta1**t) times that (t >= 1)."""
    lr, eps, decay, betas = group["lr"], group["eps"], group.get("weight_decay", 0), group["betas"]
    if len(betas) != 2:
        return (_UNBOUNDED,)
    beta1, beta2 = betas
    if not {type(lr), type(eps), type(decay), type(beta1), type(beta2)} <= _PLAIN_NUMBERS:  # (tensors: read them)
        lr, eps, decay, beta1, beta2 = (_number(v) for v in (lr, eps, decay, beta1, beta2))
        if None in (lr, eps, decay, beta1, beta2):
            return (_UNBOUNDED,)
    if not (eps > 0 and 0 <= beta1 < 1 and 0 <= beta2 < 1):
        return (_UNBOUNDED,)  # (eps = 0: 0/0 on a row that never had a gradient)
    if decay and not group.get("decoupled_weight_decay") or not 0 <= lr * decay <= 1:
        return (_UNBOUNDED,)  # (Adam's L2 decay adds wd * p to the gradient; AdamW's scales p by 1 - lr * wd)
    ratio = grown.average / eps
    return grown.squares / (1 - beta2), ratio, 2 * abs(lr) * ratio / (1 - beta1)


_PLAIN_NUMBERS = {float, int}


def _under_threshold(bounds: tuple[float, ...], group: dict) -> bool:
    """Is every one of a step's `bounds` (its update and the intermediates) under the
    threshold of every parameter's format in `group`? (A NaN bound, from a NaN in the
    state, is not.) Not for a format with no proof (float16, complex, integer), or a
    capturable or differentiable step (other code paths)."""
    if group.get("differentiable") or group.get("capturable"):
        return False
    limit = min((_THRESHOLD.get(dtype, 0.0) for dtype in {p.dtype for p in group["params"]}), default=1.0)
    return all(bound < limit for bound in bounds)


def _number(value) -> float | None:
    """A hyperparameter as a float: a number, or a one-element tensor on the CPU (read
    without a sync). None for anything else."""
    if isinstance(value, torch.Tensor):
        return float(value) if value.device.type == "cpu" and value.numel() == 1 else None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
