"""torch.nn's own modules run as regions: the per-op mode off inside, their outputs checked.

Most forward ops of a model run inside torch.nn's own modules (a TransformerEncoder makes
~170 a step), and torch calling into Python for each of them is most of what trace mode
costs in forward. A module call whose whole subtree is torch.nn's own code — no hooks, no
user subclass, no running statistics — runs with the per-op mode off, as a region: its
outputs get the hot path's check when it returns. A non-finite output is rare, and then
the call is run again under the per-op mode, from the same inputs and the random state it
started from (a dropout draws the same mask): that finds the exact op, with the records,
lineage and line per-op tracing gives, and the replay's records pass on to the real
outputs. The real outputs are never replaced, and the random stream after the region is
the one the script would have had, so the numbers are the script's own.

What a region keeps of per-op tracing:

- backward: each autograd node built inside gets its forward line (the user's line that
  called the region; every frame inside is torch's) and its innermost module, as the
  per-op mode would note them: the node numbers are noted per stretch between two inner
  module boundaries (`NodeSites.note_range`);
- a -inf mask passed in (a causal mask into a TransformerEncoder): inside, it only meets
  ops that pass it on or mask it away; what comes out finite needs no record, and a
  non-finite output is replayed, where the mask's record is followed op by op.

Not a region (op by op, as before): a module with hooks of its own or a user subclass
anywhere below it (their Python code is the user's), BatchNorm and InstanceNorm with
running statistics (a replay would update them twice), an in-place layer that is not
idempotent (it changes the input the replay needs), inputs that are not plain tensors, a
tensor on an accelerator with device flags off (its check would be a host sync per
region), a call inside a torch.func
transform, one made while another dispatch mode is above ours or while someone else hooks
every module (`register_module_forward_hook`: their code would run inside, unchecked).
Dispatch modes are per thread, and so is a region. Whether a module is a
region is decided at its first call (its own hooks at every call): a hook or a user module
added below it later runs with the mode off, unchecked op by op, but the region's outputs
are still checked and a replay still runs it op by op (such a hook then runs twice).

On an accelerator, with device flags on, a region's output queues a flag instead of being
read (see device_flags.py): a flagged region is not replayed at once, its inputs gone by
the boundary; the seeded replay of the script, which runs every op under the mode, finds
the op.

A loss called as a function is a region too, where its one C call runs several ATen ops:
`F.cross_entropy` is a log_softmax, the detach of what it saves and an nll_loss (a dozen
ops with label smoothing or probabilities as targets), three trips through Python a step
that `nn.CrossEntropyLoss`, a module region, does not make. The C function is wrapped
while the detector runs, under the same rules as a module call.
"""
from __future__ import annotations

import functools
import sys
import threading
import weakref

import torch
from torch import nn
from torch.nn.modules import module as _nn_module
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd
from torch.nn.modules.instancenorm import _InstanceNorm

from nandoctor.detect.batches import tensors_in
from nandoctor.detect.compiled import code_of, compiling
from nandoctor.detect.hooks import scriptable_as
from nandoctor.detect.mode import _finite, all_finite

_pop_mode = torch._C._pop_torch_dispatch_stack
_push_mode = torch._C._push_on_torch_dispatch_stack
_modes_on_stack = torch._C._len_torch_dispatch_stack
_mode_at = torch._C._get_dispatch_stack_at
_sequence_nr = torch._C._autograd._get_sequence_nr
_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled
_cpu_generator = torch.default_generator
_thread_id = threading.get_ident

# In-place layers whose second application changes nothing: run again on an input they
# already changed in place, a replay computes the same values.
_IDEMPOTENT_INPLACE = (nn.ReLU, nn.ReLU6, nn.Hardtanh)
_PLAIN = (torch.Tensor, nn.Parameter)


def _kept_as_is(t):
    return t


def _others_hook_every_module() -> bool:
    """Has someone besides nandoctor (two hooks of each kind: the module tracker's and
    these) hooked every module? Their code would run inside regions, unchecked."""
    return len(_nn_module._global_forward_pre_hooks) > 2 or len(_nn_module._global_forward_hooks) > 2 \
        or bool(_nn_module._global_backward_hooks) or bool(_nn_module._global_backward_pre_hooks)


def _finite_output(output) -> bool:
    if type(output) is torch.Tensor:
        return _finite(output)
    return all(_finite(t) for _, t in tensors_in(output))


# Modules that only reshape or pass on what they get: op by op their views cost a dict
# lookup, where a region would sum the whole output.
_ONLY_MOVES = (nn.Identity, nn.Flatten, nn.Unflatten)


# Functions that run as regions (see the module docstring): (owner, name) of C functions
# that torch.nn.functional looks up at each call.
_FUNCTIONS = ((torch._C._nn, "cross_entropy_loss"),)


def _on_the_cpu(t: torch.Tensor) -> bool:
    return t.is_cpu


def is_region(module: nn.Module, checkable=_on_the_cpu) -> bool:
    """Can a call of `module` run with the per-op mode off and be replayed exactly (and is
    it worth it)? `checkable(t)`: can a region's output on the device of `t` be checked
    without a host sync per region (on the CPU; on an accelerator, with device flags)?"""
    if isinstance(module, _ONLY_MOVES):
        return False
    for sub in module.modules():
        if not type(sub).__module__.startswith("torch.nn.modules."):
            return False  # a user's subclass, a parametrization, DDP or FSDP, a compiled module
        if sub._forward_hooks or sub._forward_pre_hooks or sub._backward_hooks or sub._backward_pre_hooks \
                or "forward" in sub.__dict__:
            return False  # Python code of the user's (or a library's) runs inside
        if isinstance(sub, _BatchNorm) or isinstance(sub, _InstanceNorm) and sub.track_running_stats:
            return False  # forward updates running statistics: a replay would do it twice
        if getattr(sub, "inplace", False) is True and not isinstance(sub, _IDEMPOTENT_INPLACE):
            return False
        if isinstance(sub, nn.Embedding) and sub.max_norm is not None:
            return False  # renormalises its weight in place
        if not all(checkable(t) for t in sub.parameters(recurse=False)):
            return False
    return True


# Modules whose forward draws from the random generator: a region holding one keeps the
# generator's state when it opens, for the replay to draw the same (a copy of 5 KB: not
# made for the rest). RNNs and attention name their dropout probability `dropout`.
_DRAWS_RANDOM = (_DropoutNd, nn.RReLU)


def draws_random(module: nn.Module) -> bool:
    return any(isinstance(sub, _DRAWS_RANDOM) or _a_probability(getattr(sub, "dropout", None))
               for sub in module.modules())


def _a_probability(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value != 0


def _region_name(called) -> str:
    """How a flagged region is named until the replay finds its op: `torch.nn.LayerNorm`."""
    if isinstance(called, nn.Module):
        return f"torch.nn.{type(called).__name__}"
    return f"torch.nn.functional.{getattr(called, '__name__', 'function')}"


class _Open:
    """The region running now."""

    __slots__ = ("module", "random_state", "site_line", "first_node", "stretch_start", "thread")

    def __init__(self, module, random_state, site_line, stretch_start, thread) -> None:
        self.module = module  # (or the function)
        self.thread = thread  # dispatch modes are per thread: so is a region
        self.random_state = random_state  # the CPU generator's state when the call began (None: draws nothing)
        self.site_line = site_line  # (code, line) of the user's line that called it
        self.first_node = stretch_start  # the autograd node number when the call began
        self.stretch_start = stretch_start  # the first autograd node number not noted yet


class ModuleRegions:
    """The regions of one detector, from two global module hooks (installed before the
    ModuleTracker's, so that when they run its `current` is the module whose stretch of
    ops just ended)."""

    def __init__(self, detector, enabled: bool = True) -> None:
        self.detector = detector
        self.enabled = enabled
        self.open: _Open | None = None
        self._replaying = 0
        self._known: "weakref.WeakKeyDictionary[nn.Module, bool]" = weakref.WeakKeyDictionary()
        self._handles: list = []
        self._undo: list = []

    def install(self) -> None:
        if not self.enabled:
            return
        self._handles = [
            _nn_module.register_module_forward_pre_hook(self._enter),
            _nn_module.register_module_forward_hook(self._leave, with_kwargs=True, always_call=True),
        ]
        for owner, name in _FUNCTIONS:
            original = getattr(owner, name)
            wrapper = self._function_region(original)
            setattr(owner, name, wrapper)
            self._undo += [functools.partial(setattr, owner, name, original), scriptable_as(original, wrapper)]

    def uninstall(self) -> None:
        self.open = None  # (the detector puts its mode back on the stack)
        for handle in self._handles:
            handle.remove()
            # (torch's handle forgets its with_kwargs mark: left behind, it keeps every
            # compiled module warning of global hooks after the run, on each call)
            _nn_module._global_forward_hooks_with_kwargs.pop(handle.id, None)
        self._handles = []
        while self._undo:
            self._undo.pop()()

    def runtime_code(self) -> list:
        return code_of(ModuleRegions._enter, ModuleRegions._leave, ModuleRegions._function_region)

    def close_interrupted(self) -> None:
        """A region whose call never returned (a KeyboardInterrupt, or another
        BaseException, went through torch's module call, which then runs no hook): the
        per-op mode goes back on. Called at the next training boundary and at the end."""
        if self.open is None:
            return
        self.open = None
        if self.detector.mode not in torch.utils._python_dispatch._get_current_dispatch_mode_stack():
            _push_mode(self.detector.mode)

    # -- the two hooks: the hot path of a region ------------------------------------------

    def _enter(self, module, args) -> None:
        opened = self.open
        if opened is not None:
            if opened.thread == _thread_id():
                self._stretch_ends(opened)  # an inner module begins: the ops so far were its parent's
            return
        if not self._may_open():  # (first: Dynamo traces this hook, and must see no more of it)
            return
        known = self._known.get(module)
        if known is None:  # (False, or whether a call draws random numbers)
            known = self._known[module] = is_region(module, self._checkable) and (draws_random(module),)
        if not known or module._forward_hooks or module._forward_pre_hooks or module._backward_hooks \
                or module._backward_pre_hooks or _others_hook_every_module():
            return
        self._open(module, args, draws_random=known[0])

    def _may_open(self) -> bool:
        d = self.detector
        return not (d.passive or self._replaying or compiling() or d.state.transform_depth)

    def _open(self, called, args, draws_random: bool = False) -> _Open | None:
        """Take the per-op mode off for this call of `called` (a module or a function) and
        return the open region; None when the call cannot be one and stays op by op.
        `draws_random`: the call may draw random numbers (keep the generator's state)."""
        d = self.detector
        depth = _modes_on_stack()
        if not depth or _mode_at(depth - 1) is not d.mode:
            return None  # the mode is off already (optimizer, data), or a script's mode is above ours
        hidden = d.hidden_nans  # (integers a cast made of NaN: their use is seen op by op, see hidden_nan.py)
        for a in args:
            if isinstance(a, torch.Tensor) and (type(a) not in _PLAIN or not self._checkable(a) or hidden and id(a) in hidden):
                return None
        random_state = _cpu_generator.get_state() if draws_random else None
        self.open = _Open(called, random_state, d.locator.user_frame(1), _sequence_nr(), _thread_id())
        _pop_mode(None)
        return self.open

    def _leave(self, module, args, *kwargs_and_output) -> None:
        opened = self.open
        if opened is None or opened.thread != _thread_id():
            return  # (another thread's module: the mode and the region are this thread's)
        if opened.module is not module:
            self._stretch_ends(opened)
            return  # an inner module ended
        # (torch calls always-called hooks without kwargs when forward raised, inside its
        # `except` clause: the error is the one being handled)
        if len(kwargs_and_output) < 2 and isinstance(error := sys.exc_info()[1], Exception):
            self._close(opened)
            self.detector.op_raised(error, type(module).__name__, args)
            return
        if not self._close(opened, *kwargs_and_output[1:]):
            kwargs, output = kwargs_and_output
            self._replay(opened, lambda: module(*args, **kwargs), args, output)

    def _checkable(self, t: torch.Tensor) -> bool:
        return t.is_cpu or self.detector.flags.covers(t)

    def _close(self, opened: _Open, *output) -> bool:
        """The region's call ended, returning `output` (nothing: it raised). Its output is
        checked while the mode is still off, then the mode goes back on; False when the
        output is non-finite (to be replayed)."""
        self._stretch_ends(opened)
        self.open = None
        self.detector.graph_built.add(id(opened.module), opened.stretch_start - opened.first_node)
        grad = _grad_enabled()
        _set_grad_enabled(False)  # (the check's sum is no node of the script's graph)
        try:
            finite = not output or self._finite_or_flagged(opened, output[0])
        finally:
            _set_grad_enabled(grad)
            _push_mode(self.detector.mode)
        return finite

    def _finite_or_flagged(self, opened: _Open, output) -> bool:
        """The hot path's check of a region's output: on the host, or, where a read would
        be a host sync, one device flag per output tensor, read at the next boundary (True
        then: a flagged region is found by the seeded replay, which runs it op by op)."""
        d = self.detector
        if not d.flags.enabled:
            return _finite_output(output)
        tensors = [output] if type(output) is torch.Tensor else [t for _, t in tensors_in(output)]
        finite = True
        for t in tensors:
            if not d.flags.covers(t):
                finite = finite and _finite(t)
            elif t.is_floating_point() and t.numel():
                d.defer_region(_region_name(opened.module), t, d.recorder.phase(None, ()), opened.site_line,
                               d.modules.current)
        return finite

    def _function_region(self, original):
        """`original`, a C function of torch's, called as a region (see the module docstring)."""
        regions = self

        @functools.wraps(original)
        def region(*args, **kwargs):
            if compiling():  # (Dynamo traces through: the user's graph gets torch's own function)
                return original(*args, **kwargs)
            opened = regions._open(original, args) if regions.open is None and regions._may_open() else None
            if opened is None:
                return original(*args, **kwargs)
            try:
                output = original(*args, **kwargs)
            except BaseException as error:
                regions._close(opened)
                if isinstance(error, Exception):
                    regions.detector.op_raised(error, original.__name__, args)
                raise
            if not regions._close(opened, output):
                regions._replay(opened, lambda: original(*args, **kwargs), args, output)
            return output

        return region

    def _stretch_ends(self, opened: _Open) -> None:
        """Autograd nodes built since the last inner module boundary were built in the
        module that is innermost now: they get its name and the region's user line."""
        now = _sequence_nr()
        if now > opened.stretch_start:
            self.detector.sites.note_range(opened.stretch_start, now, (opened.site_line, self.detector.modules.current))
            opened.stretch_start = now

    # -- the rare path -------------------------------------------------------------------

    def _replay(self, opened: _Open, call, args, output) -> None:
        """Run the call again under the per-op mode, from its inputs and starting random
        state: its ops are checked and recorded one by one (a stop raises from here, as
        from the op itself), and the records of what it returned pass to the real outputs."""
        d = self.detector
        random_after = _cpu_generator.get_state() if opened.random_state is not None else None
        if random_after is not None:
            _cpu_generator.set_state(opened.random_state)
        self._replaying += 1
        again = None
        try:
            # What the replay saves for its own backward (never run) stays its own: under
            # non-reentrant checkpointing, the checkpoint's hooks would count it as saved by
            # the real forward, and its recomputation would not match that count.
            with torch.autograd.graph.saved_tensors_hooks(_kept_as_is, _kept_as_is):
                again = call()
        except Exception:  # noqa: BLE001 - it does not run twice: its outputs are recorded as they are
            pass
        finally:
            self._replaying -= 1
            if random_after is not None:
                _cpu_generator.set_state(random_after)
        replayed = dict(tensors_in(again)) if again is not None else {}
        with d.internal():
            for path, real in tensors_in(output):
                if not real.is_floating_point() or d.records.get(real) is not None or all_finite(real):
                    continue
                twin = replayed.get(path)
                record = d.records.get(twin) if isinstance(twin, torch.Tensor) else None
                if record is None:  # the replay did not make it again: made in the region, op unknown
                    record = d.recorder.bare("", real, d.recorder.phase(None, args))
                    record.facts.untracked_input = False
                d.records.put(real, record)
