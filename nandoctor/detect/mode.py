"""The TorchDispatchMode that runs every ATen op and checks what it made.

This is the hot path: it runs for every op of forward, backward (ops run by the autograd
engine), optimizer step and data loading. It only classifies, runs, and does the cheapest
check that can be exact: the sum of a float tensor is non-finite whenever any element is
(a finite sum proves every element finite; a non-finite one is re-checked exactly on the
slow path, because large finite values can overflow the sum). On an accelerator, where
reading a result on the host is a sync, the check is queued on the device instead and read
at the next boundary (see `device_flags.py`). Everything else — deciding, recording,
explaining — happens in the `Detector` and its pieces, on the rare path.
"""
from __future__ import annotations

import cmath
import math

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.utils._python_dispatch import TorchDispatchMode

from nandoctor.detect.ops import (OpKind, base_name, cast_widens, op_kind, value_outputs, written_arguments,
                                  writes_nonfinite_scalar, writes_undefined)
from nandoctor.detect import hidden_nan
from nandoctor.detect.records import stored_values

_current_node = torch._C._current_autograd_node
_jit_tracing = torch._C._get_tracing_state
_sequence_nr = torch._C._autograd._get_sequence_nr

# Elements of an in-place op's `self` copied before the op (a few µs at this size); larger
# ones are reported with their values after the op.
SNAPSHOT_LIMIT = 1 << 16


def _before(args) -> torch.Tensor | None:
    """A copy of an in-place op's `self` as it is before the op, when small and plain."""
    t = args[0] if args else None
    if type(t) is torch.Tensor and t.is_floating_point() and t.numel() <= SNAPSHOT_LIMIT and not t.is_meta:
        return t.clone()
    return None


# Tensors that hold no values: torch.export, make_fx and torch.compile's tracing run the
# model on them. Reading one (`.item()`) would add a symbol or a guard to their trace.
_TRACED = (FakeTensor, FunctionalTensor)


# float8 formats: storage for scaled values, not arithmetic (no `isfinite`, no `sum` on the
# CPU). Not checked: a value cast into one is checked where it is cast back.
_STORAGE_ONLY = frozenset(getattr(torch, name) for name in (
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu") if hasattr(torch, name))


def checkable(t: torch.Tensor) -> bool:
    """Does `t` hold values a finiteness check reads: floating or complex, in a dtype
    torch computes in (not a float8 storage format)?"""
    return (t.is_floating_point() or t.is_complex()) and t.dtype not in _STORAGE_ONLY


def _finite(t: torch.Tensor) -> bool:
    """Cheap and one-sided: True proves every element finite; False may be an overflow."""
    if type(t) is not torch.Tensor and isinstance(t, _TRACED):
        return True
    if _jit_tracing() is not None:  # torch.jit.trace records every op run, a check's too
        return True
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return True
    try:  # (float8 has no sum: it raises, and is not checked, as `checkable` says)
        value = t.item() if t.dim() == 0 else t.sum().item()  # (a loss: no sum to make)
        # (Complex values: a spectrum; its gradients carry a NaN through torch.stft's backward.)
        return cmath.isfinite(value) if isinstance(value, complex) else math.isfinite(value)
    except (RuntimeError, NotImplementedError):  # meta and fake tensors hold no values to check
        return True


def _traced(types) -> bool:
    return any(issubclass(t, _TRACED) for t in types)


def all_finite(t: torch.Tensor) -> bool:
    """Exact, and cheap when the answer is yes (a sum instead of a full boolean mask)."""
    return _finite(t) or bool(torch.isfinite(stored_values(t)).all())


# Up to this many outputs (nll_loss's loss and total weight, a convolution's three
# gradients), one check each is cheaper than the fused norm's three extra ops.
_FEW = 4


def _all_finite(tensors) -> bool:
    """One check for a list of outputs (the optimizers' `_foreach_*` ops): the sum of the
    per-tensor norms is finite only if every element of every tensor is (an overflow of
    large finite values is re-checked tensor by tensor by the caller)."""
    floats = [t for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
    if len(floats) <= _FEW:
        return all(_finite(t) for t in floats)
    if len({(t.device, t.dtype) for t in floats}) > 1:
        return all(_finite(t) for t in floats)
    try:
        return math.isfinite(torch.stack(torch._foreach_norm(floats)).sum().item())
    except (RuntimeError, NotImplementedError):  # meta and fake tensors hold no values to check
        return True


class CheckingMode(TorchDispatchMode):
    def __init__(self, detector) -> None:
        super().__init__()
        self.detector = detector

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # TorchDispatchMode wraps __torch_dispatch__ in torch._disable_dynamo, a Python
        # wrapper on every op: measured at about a tenth of the whole trace-mode cost.
        # This handler is never worth compiling, and opting out keeps it a plain method.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        d = self.detector
        if d.passive or (types and _traced(types)):  # (a trace of the model: no values to check)
            return func(*args, **kwargs)
        kind = op_kind(func)
        if kind is OpKind.NOT_TENSOR_MATH:
            return func(*args, **kwargs)
        if kind is OpKind.CAST:
            kind = OpKind.PASSTHROUGH if cast_widens(args, kwargs) else OpKind.CHECKED
        if kind is OpKind.FINITE_PRESERVING:
            # Its output can only be non-finite when an input is: checked when one holds a
            # recorded non-finite value (a -inf mask into softmax), else not at all.
            kind = OpKind.CHECKED if d.records and d.records.any_of(args) else OpKind.UNCHECKED
        node = _current_node()
        created = None
        if node is None:
            seq = _sequence_nr()
            if seq != d.sites.last_seq:
                # Autograd numbered a node for this op: remember the forward line for backward.
                created = seq - 1
                d.graph_built.add(func, 1)  # (one node per op: an unseen one makes the count differ)
                d.sites.note(seq, (d.locator.user_frame(1), d.modules.current))
        elif d.sites.last_seq != (seq := _sequence_nr()):
            # A graph built inside backward: the forward that reentrant checkpointing runs
            # again there (the user's own line, under its node), or a double backward.
            own = d.locator.user_frame_inside_backward(1)
            if own is not None:
                d.sites.note(seq, (own, d.modules.current))
            else:
                d.sites.last_seq = seq  # (torch's own formulas: no line of the user's to give)
        taken = None
        if d.hidden_nans:  # integers a cast made of NaN live (see hidden_nan.py): this op may take them
            taken = hidden_nan.taken_by(d.hidden_nans, args)
            if taken:
                d.hidden_nans_taken(taken, passes_on=kind is OpKind.PASSTHROUGH)  # (a use stops before it runs)
        inplace, before = kind is OpKind.CHECKED_INPLACE, None
        if inplace:
            before, kind = _before(args), OpKind.CHECKED
        try:
            out = func(*args, **kwargs)
        except Exception as error:  # (free when nothing is raised)
            d.op_raised(error, base_name(func), args)
            raise
        if taken:
            d.hidden_nans_passed_on(func, args, kwargs, out, taken)
        if kind is OpKind.CHECKED:
            if not (d.flags.enabled and self._deferred(func, args, out, node, created)):
                self._check(func, args, kwargs, out, node, created, inplace, before)
        elif kind is OpKind.FILL:
            # (A deferred run keeps no lineage, so an intended -inf needs no record there; nor
            # is a 0-d scalar it was handed read: on an accelerator that read is a sync.)
            deferred = d.flags.enabled and isinstance(out, torch.Tensor) and d.flags.wants(out)
            if not deferred and writes_nonfinite_scalar(func, args, kwargs, d.records.get):
                d.on_nonfinite(func, args, kwargs, out, node, created, intended=True)
            elif writes_undefined(func, args):
                d.on_nonfinite(func, args, kwargs, out, node, created)  # a NaN the op computed
            elif d.records and isinstance(out, torch.Tensor):
                d.filled(args, out)  # a recorded value selected, overwritten or passed through
        elif kind is OpKind.PASSTHROUGH:
            if d.records:
                d.carry(args, out)
        elif kind is OpKind.READ:
            if isinstance(out, float) and not math.isfinite(out):
                d.value_read(args[0], out)
        elif kind is OpKind.ENTRY and isinstance(out, torch.Tensor) and not _finite(out):
            d.value_entered(out, str(func))
        return out

    def _deferred(self, func, args, out, node, created) -> bool:
        """Queue device flags for the op's outputs, no host sync (read at the boundary);
        False when they live where a read is no sync, to be checked now. Several outputs
        each get one: a layer norm's three, attention's output and log-sum-exp, a
        `_foreach_*` op's list (read on the host, one per op would be a sync each)."""
        d = self.detector
        if isinstance(out, torch.Tensor):
            if not d.flags.wants(out):
                return False
            if out.is_floating_point() and out.numel():
                d.defer(func, args, out, node, created)
            return True
        if out is None and args:  # (`_foreach_*_` ops and fused optimizer steps return nothing)
            out = written_arguments(func, args)
        if not isinstance(out, (tuple, list)):
            return False
        outputs = [t for t in value_outputs(func, out) if isinstance(t, torch.Tensor)]
        if not outputs or not all(d.flags.wants(t) for t in outputs):
            return False
        for t in outputs:
            if t.is_floating_point() and t.numel():
                d.defer(func, args, t, node, created)
        return True

    def _check(self, func, args, kwargs, out, node, created, inplace, before) -> None:
        d = self.detector
        if isinstance(out, torch.Tensor):
            if not _finite(out):
                d.on_nonfinite(func, args, kwargs, out, node, created, before=before)
            elif inplace and d.records and _overwrites(func):
                d.filled(args, out)  # overwritten with finite values, maybe not all of them
            elif inplace and d.records:
                d.absorbed_in_place(args, out)  # (a GRU's sigmoid_ of +inf is 1: no one dropped it)
            elif d.records:
                d.absorbed(func, args, node, out)  # (exp(-inf) = 0: a recorded Inf went in, none came out)
            return
        if out is None and args:  # (`_foreach_*_` ops and fused optimizer steps return nothing)
            out = written_arguments(func, args)
        if isinstance(out, (tuple, list)) and not _all_finite(out := value_outputs(func, out)):
            for item in out:  # each one: a convolution's grad_input, grad_weight and grad_bias
                if isinstance(item, torch.Tensor) and not _finite(item):
                    d.on_nonfinite(func, args, kwargs, item, node, created)


# In-place ops that write values over the tensor's (a copy, a replacement of non-finite
# values): a finite result dropped the old ones, as a fill does. Any other in-place op
# computed its finite result from them (`sigmoid_(+inf)` is 1).
_OVERWRITING = {"copy_", "nan_to_num_"}


def _overwrites(func) -> bool:
    return base_name(func) in _OVERWRITING
