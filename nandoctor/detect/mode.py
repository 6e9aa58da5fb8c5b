"""The TorchDispatchMode that runs every ATen op and checks what it made.

This is the hot path: it runs for every op of forward, backward (ops run by the autograd
engine), optimizer step and data loading. It only classifies, runs, and does the cheapest
check that can be exact: the sum of a float tensor is non-finite whenever any element is
(a finite sum proves every element finite; a non-finite one is re-checked exactly on the
slow path, because large finite values can overflow the sum). Everything else — deciding,
recording, explaining — happens in the `Detector`, on the rare path.
"""
from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nandoctor.detect.ops import OpKind, is_inplace, op_kind, writes_nonfinite_scalar

_current_node = torch._C._current_autograd_node
_sequence_nr = torch._C._autograd._get_sequence_nr


def _finite(t: torch.Tensor) -> bool:
    if not t.is_floating_point() or t.numel() == 0:
        return True
    return math.isfinite(t.sum().item())


class CheckingMode(TorchDispatchMode):
    def __init__(self, detector) -> None:
        super().__init__()
        self.detector = detector

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        d = self.detector
        if d.passive:
            return func(*args, **kwargs)
        kind = op_kind(func)
        node = _current_node()
        created = None
        if node is None:
            seq = _sequence_nr()
            if seq != d.sites._last_seq:
                # Autograd numbered a node for this op: remember the forward line for backward.
                created = seq - 1
                d.sites.note(seq, (d.locator.user_frame(1), d.modules.current))
        out = func(*args, **kwargs)
        if kind is OpKind.CHECKED:
            self._check(func, args, kwargs, out, node, created)
        elif kind is OpKind.FILL:
            if writes_nonfinite_scalar(func, args, kwargs):
                d.on_nonfinite(func, args, kwargs, out, node, created, intended=True)
            elif d.records and is_inplace(func):
                d.records.forget(out) if isinstance(out, torch.Tensor) else None
        elif kind is OpKind.PASSTHROUGH and d.records:
            d.carry(args, out)
        return out

    def _check(self, func, args, kwargs, out, node, created) -> None:
        d = self.detector
        if isinstance(out, torch.Tensor):
            if not _finite(out):
                d.on_nonfinite(func, args, kwargs, out, node, created)
            elif d.records and is_inplace(func):
                d.records.forget(out)
            return
        if out is None and is_inplace(func) and args:  # _foreach_*_ ops return nothing
            out = args[0]
        if isinstance(out, (tuple, list)):
            for item in out:
                if isinstance(item, torch.Tensor) and not _finite(item):
                    d.on_nonfinite(func, args, kwargs, item, node, created)
                    return
