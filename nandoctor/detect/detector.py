"""The detector: trace mode's observer, the context manager around a running script.

It wires the pieces together and owns the lifecycle; each piece is small:

- `mode.CheckingMode`: the hot path, every ATen op (the one place to profile);
- `recorder.Recorder`: records of non-finite values, on the rare path;
- `policy`: when a non-finite op output stops the run and when it is a suspect;
- `boundaries.BoundaryChecks`: the loss, the gradients, the optimizer's step;
- `batches.BatchChecks`: batches that arrive non-finite; `saved`: values through torch.save/load;
- `device_flags.DeferredOps`: per-op flags kept on an accelerator, read at boundaries;
- `lineage.explain`: from the record where it stopped to the root, as a `Detection`;
- `nodes.NodeChecks`: a plain backward checked node by node, with the per-op mode off;
- `regions.ModuleRegions`: torch.nn's own modules run with the mode off, outputs checked.

When it stops, it raises `NonFiniteFound` into the script and `finding()` gives the
`Detection` (typed, no words: diagnosis writes those).
"""
from __future__ import annotations

# `_signal`: `signal`'s own functions, without the wrappers that turn handlers into enums
# (through `signal`, getsignal() costs 6 us, a failed enum lookup; here 0.02 us).
import _signal
import contextlib
import functools
import math
import os
import random
import sys
import threading
import weakref

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode, _get_current_dispatch_mode_stack

from nandoctor.detect import hooks
from nandoctor.detect.batches import BatchChecks, tensors_in, undisturbed
from nandoctor.detect.compiled import code_of
from nandoctor.detect.boundaries import BoundaryChecks
from nandoctor.detect.device_flags import DeferredOps, DeviceFlags, HostRead
from nandoctor.detect.lineage import birth_of, explain
from nandoctor.detect.allow import Allowances
from nandoctor.detect.mode import CheckingMode, all_finite, checkable
from nandoctor.detect.numpy_warnings import NumpyWarnings
from nandoctor.detect import hidden_nan
from nandoctor.detect.nodes import COMPILED_BACKWARD, GraphBuilt, NodeChecks, current_node
from nandoctor.detect.ops import base_name
from nandoctor.detect.observer import (NonFiniteFound, Observer, PeerStopped, StepLimitReached, finite_metric,
                                       ranks_train_together, refuses_values, raised_at, speaks_of_nonfinite)
from nandoctor.detect.policy import HANDLES_NONFINITE, an_overflow, op_verdict, tests_finiteness
from nandoctor.detect.provenance import ModuleTracker, NodeSites, SourceLocator
from nandoctor.detect.recorder import Recorder
from nandoctor.detect.regions import ModuleRegions
from nandoctor.detect.records import Record, RecordTable, lineage_of, stored_values, tensors_of
from nandoctor.detect.result import Detection, StopReason
from nandoctor.detect.saved import SavedValues


_RUNNING: "weakref.WeakSet[Detector]" = weakref.WeakSet()
_pop_mode = torch._C._pop_torch_dispatch_stack
_push_mode = torch._C._push_on_torch_dispatch_stack
_grad_enabled = torch.is_grad_enabled
_sequence_nr = torch._C._autograd._get_sequence_nr
_set_grad_enabled = torch._C._set_grad_enabled

# The innermost frames of an error whose variables may hold the value an op refused.
_FRAMES_LOOKED_AT = 3

# Stops at a boundary that compiled code may explain when no op nandoctor saw made the value.
_UNSEEN_OP_REASONS = (StopReason.LOSS, StopReason.GRADIENT_AFTER_BACKWARD, StopReason.GRADIENT_BEFORE_STEP,
                      StopReason.GRADIENT_RETURNED, StopReason.READ_BACK)


# The numeric settings of a param group an update multiplies by.
_SETTINGS = ("lr", "momentum", "weight_decay", "eps", "alpha", "betas", "dampening")


def _nonfinite_setting(optimizer) -> str | None:
    """The name of a param group's setting that is not finite, or None. Numbers, and tensors
    on the CPU (a setting on an accelerator would be a host sync every step: its NaN update
    is found after it)."""
    for group in optimizer.param_groups:
        for name in _SETTINGS:
            value = group.get(name)
            for v in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(v, float) and not math.isfinite(v) or isinstance(v, torch.Tensor) \
                        and v.is_cpu and v.is_floating_point() and not bool(torch.isfinite(v).all()):
                    return name
    return None


# Ops that hand data on as it came: a cast (`torch.tensor(array, dtype=torch.float32)`
# casts after it lifts), a copy, a detach.
_AS_IT_CAME = {"_to_copy", "to", "clone", "copy_", "detach", "contiguous", "lift_fresh_copy"}


def _data_as_it_came(record: Record) -> bool:
    """Is `record` a value that entered torch non-finite from outside (data with NaN
    markers), handed on by casts and copies only, nothing computed from it?"""
    while not record.facts.entered:
        parts = record.op.split(".")
        if len(parts) < 2 or parts[1] not in _AS_IT_CAME or len(record.parents) != 1:
            return False
        record = record.parents[0]
    return True


def _born_as_a_metric(record: Record, no_parameters, with_graph: bool = False) -> bool:
    """Was `record`'s value born outside the model, without autograd, once training
    began? A validation metric logged as NaN (the precision of a class never predicted, a
    correlation over a constant batch, a MAPE over a zero target), a best-so-far ratio:
    read back, or kept in a metric's state that nothing trains, it is listed as made, not
    a stop, as in watch mode. A NaN the model itself made or passed through (an op inside
    a module: an EMA model evaluated with the NaN weights an average wrote), and data that
    arrived bad, still stop the run there. A module called on its own that holds no
    parameter (`no_parameters(name)`: a torchmetrics metric) is no model.
    `with_graph`: forward ops outside the model that built autograd nodes count too (a
    MAPE of the live predictions, logged without `detach()`); a backward's never do."""
    def made_by_the_model(r: Record) -> bool:
        in_graph = r.node_seq is not None and (not with_graph or r.backward_node is not None)
        return in_graph or r.module is not None and not no_parameters(r.module)

    if any(made_by_the_model(r) for r in lineage_of(record)):
        return False
    root = birth_of(record)
    return root.phase == "forward" and not root.facts.entered and not root.facts.untracked_input


# Ops a script writes to replace non-finite values on purpose (`nan_to_num(torch.log(p),
# neginf=-100)`, BCELoss's clamp written by hand): a guard, as a `where` is one.
_REPLACES_NONFINITE = {"nan_to_num", "nan_to_num_"}


def _made_integers_of(t: torch.Tensor, out) -> bool:
    """Is `out` the integers an op made of `t` element for element (a cast: `y.long()`)?"""
    return isinstance(out, torch.Tensor) and not (out.is_floating_point() or out.is_complex() or out.dtype == torch.bool) \
        and out.shape == t.shape


@contextlib.contextmanager
def _random_state_kept():
    """torch's CPU generator, Python's `random` and numpy's global state, as they were."""
    np = sys.modules.get("numpy")
    saved_python, saved_numpy = random.getstate(), np.random.get_state() if np is not None else None
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(saved_python)
            if saved_numpy is not None:
                np.random.set_state(saved_numpy)


@contextlib.contextmanager
def _as_worker(dataset, stream, worker: int | None):
    """In this process, what a DataLoader worker's code sees: `get_worker_info()` (a stream
    sharded by worker reads it), the seeds torch gives the worker, its `worker_init_fn`."""
    if worker is None:
        yield
        return
    from torch.utils.data._utils import worker as worker_module

    seed = (stream.base_seed or 0) + worker
    saved = worker_module._worker_info
    worker_module._worker_info = worker_module.WorkerInfo(id=worker, num_workers=stream.workers, seed=seed,
                                                          dataset=dataset)
    try:
        random.seed(seed)
        torch.manual_seed(seed)
        np = sys.modules.get("numpy")
        if np is not None:  # (a worker seeds numpy's global generator too)
            np.random.seed(worker_module._generate_state(stream.base_seed or 0, worker))
        if stream.worker_init_fn is not None:
            stream.worker_init_fn(worker)
        yield
    finally:
        worker_module._worker_info = saved


def _fetch_samples(dataset, indices) -> list:
    """A batch's samples as a worker fetches them (`__getitems__` where the dataset has one)."""
    indices = list(indices)
    if getattr(dataset, "__getitems__", None):
        return dataset.__getitems__(indices)
    return [dataset[i] for i in indices]


_THE_UPDATE = "the parameters after optimizer.step()"  # (how a flagged update is named until the replay)


def _forked() -> None:
    """In a child forked while a detector runs (a DataLoader worker started outside
    `DataLoader.__iter__`, a multiprocessing pool): the copied detector only watches the
    parent's run, so it goes passive and never raises into the child's code."""
    for detector in list(_RUNNING):
        detector.passive = True


os.register_at_fork(after_in_child=_forked)


class _InterruptHeld:
    """`with _InterruptHeld():` a Ctrl-C that comes during the block takes effect when it ends.

    Python runs SIGINT's handler between two bytecodes of the main thread, anywhere, and
    putting the per-op mode on torch's mode stack or taking it off
    (TorchDispatchMode.__enter__/__exit__) takes several: interrupted halfway, the mode's
    saved flags and torch's stack disagree, and the pop at the end of the run fails
    (IndexError, "trying to pop from empty mode stack") instead of the run ending with the
    user's KeyboardInterrupt, exit 130 and its report. So for the block SIGINT's handler
    (python's, or one the script installed) is swapped for one that only notes the signal,
    and is called when the block is done, with everything consistent. Where python has no
    handler (SIGINT ignored, or default) and off the main thread (handlers only run there),
    nothing changes. Written as a class, not contextlib, so that a KeyboardInterrupt raised
    here shows no frame that is not the user's or nandoctor's (which the runner trims)."""

    __slots__ = ("frame", "held", "previous")

    def __enter__(self) -> "_InterruptHeld":
        self.previous, self.frame, self.held = None, None, False
        if threading.current_thread() is threading.main_thread():
            previous = _signal.getsignal(_signal.SIGINT)
            if callable(previous):
                self.previous = previous
                _signal.signal(_signal.SIGINT, self._hold)
        return self

    def _hold(self, signum, frame) -> None:
        self.held, self.frame = True, frame

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            _signal.signal(_signal.SIGINT, self.previous)
            if self.held:
                self.previous(_signal.SIGINT, self.frame)


class _ModeFullyOff:
    """`with _ModeFullyOff(detector):` the per-op mode off torch's stack and off
    TorchDispatchMode's own flags, for compiled code. Dynamo compiles nothing while those
    flags say a mode is on (torch 2.9 and older; 2.13 with `inline_torch_dispatch_torch_compile`
    off), and `Detector._suspend`, one C call, leaves them as they are: so here the mode
    goes through its own `__exit__` and `__enter__`, as a phase's switch once did, and
    comes back as it was (on, or off the stack with its flags set)."""

    __slots__ = ("detector", "was_suspended", "switched")

    def __init__(self, detector: "Detector") -> None:
        self.detector = detector

    def __enter__(self) -> None:
        d = self.detector
        self.was_suspended, self.switched = d._suspended, False
        if not d._suspended and _get_current_dispatch_mode() is not d.mode:
            return  # a script's own mode is above ours: Dynamo sees that one anyway
        with _InterruptHeld():
            if d._suspended:
                _push_mode(d.mode)  # back on top, so that __exit__ takes it off with its flags
            d.mode.__exit__(None, None, None)
            d._suspended, self.switched = True, True

    def __exit__(self, *exc) -> None:
        if not self.switched:
            return
        d = self.detector
        with _InterruptHeld():
            d.mode.__enter__()
            if self.was_suspended:
                _pop_mode(None)  # off the stack again, as the phase around the call had it
            d._suspended = self.was_suspended


class Detector(Observer):
    """`with Detector(settings): run the script`; see the module docstring."""

    watches_data = True  # the data phase runs without the per-op mode, checked per batch
    watches_values = True  # where values leave torch and enter it (see hooks.py)

    def __init__(self, run_settings, locator: SourceLocator | None = None) -> None:
        super().__init__(run_settings)
        self.stop_inf_dtypes = {getattr(torch, name) for name in run_settings.get("stop_on_inf_dtypes", ())}
        self.strict_overflow = bool(run_settings.get("strict_overflow", False))
        self.check_batches = bool(run_settings.get("check_batches", True))
        # Check each op inside optimizer.step() (a replay localising an optimizer failure
        # does); by default the step is checked once, at its end.
        self.check_optimizer_ops = bool(run_settings.get("check_optimizer_ops", False))
        # Run torch.compile'd code eagerly under the per-op mode (the replay does), instead
        # of compiled with its outputs checked (see compiled.py).
        self.eager_compiled = bool(run_settings.get("eager_compiled", False))
        # Check a plain CPU backward node by node (see nodes.py); the replay checks every op.
        self.backward_by_node = bool(run_settings.get("backward_by_node", True))
        # Run torch.nn's own modules as regions checked at their outputs (see regions.py);
        # the replay checks every op.
        module_regions = bool(run_settings.get("module_regions", True))
        self._last_compiled: str | None = None
        # What the hot path reads, as plain attributes.
        self.locator = locator or SourceLocator()
        self.modules = ModuleTracker()
        self.sites = NodeSites()
        self.records = RecordTable()
        self.hidden_nans: dict = {}  # integers a cast made of NaN, while they live (see hidden_nan.py)
        self.flags = DeviceFlags(str(run_settings.get("device_flags", "auto")))
        self.passive = False  # True while nandoctor runs its own ops, and after a stop
        self.recorder = Recorder(self.state, self.locator, self.modules, self.sites, self.records,
                                 Allowances(run_settings.get("allow", ())))
        self.recorder.numpy_warnings = self._numpy_warnings = NumpyWarnings(self.locator, lambda: self.state.step_or_none)
        self._optimizers_made_at: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._stepping_optimizer: weakref.ref | None = None
        self.recorder.optimizer_made_at = self._made_at_of_the_stepping_optimizer
        self.deferred = DeferredOps(self.flags, self.recorder)
        self.boundaries = BoundaryChecks(self.state, self.recorder, self.stop)
        self.batches = BatchChecks(self.recorder, self._refetch, self._refetch_stream, self._refetch_as_worker)
        self.saved = SavedValues(self.records)
        self.detection: Detection | None = None
        self._refused: tuple[Exception, str, Record] | None = None  # (error, op, input) of op_raised
        self.mode = CheckingMode(self)
        self._suspended = False
        self._stepping = 0  # optimizer.step() calls running (see `stepping`)
        self._scaled_backward = False
        self._checked_at_the_step = False  # this backward's loss and gradients (see `_checks_at_the_step`)
        self._overflow_left_to_the_step = False  # ...and its nodes that can only overflow (see nodes.py)
        self._backward_mark = 0
        self.nodes = NodeChecks(self)
        self.regions = ModuleRegions(self, module_regions)
        self._nodes_before = _sequence_nr()  # the autograd node number when the graph began (see `_graph_fingerprint`)
        self.graph_built = GraphBuilt()  # what made the nodes since (regions, ops, compiled functions)
        self._by_node: list[bool] = []  # per backward() running: did it take the mode off
        self._python_code: list[bool] = []  # per Python function running inside it: was the mode off
        self._hooks = hooks.TrainingHooks(self)

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> "Detector":
        with _InterruptHeld():  # see _InterruptHeld: a Ctrl-C here comes once all is in place
            self.regions.install()  # (before the module tracker: see ModuleRegions)
            self.modules.install()
            self._hooks.install()
            self._numpy_warnings.install()
            self.mode.__enter__()
            self._suspended = False
            self._nodes_before = self.sites.last_seq = _sequence_nr()  # (nodes made before are no op's of ours)
        _RUNNING.add(self)
        return self

    def runtime_code(self) -> list:
        return code_of(type(self.mode).__torch_dispatch__, ModuleTracker._enter, ModuleTracker._leave) + \
            self.regions.runtime_code()

    def finish(self) -> None:
        """The script ended: flags still pending are read (a NaN in its last ops counts).
        (A loss kept for a step that never came was never applied: it is not read.)"""
        self.read_flags()

    def __exit__(self, *exc) -> None:
        _RUNNING.discard(self)
        self.passive = True
        with _InterruptHeld():  # ...and here once all is undone
            self.regions.uninstall()
            if self.mode not in _get_current_dispatch_mode_stack():  # suspended, or a region a Ctrl-C left open
                _push_mode(self.mode)
            self._suspended = False
            self.mode.__exit__(None, None, None)  # (TorchDispatchMode's own flags are restored here)
            self._hooks.uninstall()
            self._numpy_warnings.uninstall()
            self.modules.uninstall()
            self.nodes.release()

    def _suspend(self) -> None:
        """Take the per-op mode off the stack (optimizer step, data loading): these phases
        are checked at their boundary instead, which is what makes trace mode cheap there.
        Only done when ours is the innermost mode, so a user's own mode is never disturbed.
        One C call off torch's stack and one back (regions.py does the same): a Ctrl-C
        between a call and the flag leaves a flag that `__exit__` does not trust."""
        if not self._suspended and _get_current_dispatch_mode() is self.mode:
            _pop_mode(None)
            self._suspended = True

    def _resume(self) -> None:
        if self._suspended:
            _push_mode(self.mode)
            self._suspended = False

    class _Internal:
        def __init__(self, detector: "Detector") -> None:
            self.detector = detector
            self.outermost = False

        def __enter__(self):
            d = self.detector
            self.was = d.passive
            d.passive = True
            if d.state.script_grad is None:  # (the outermost: nested ones find grad off)
                d.state.script_grad = _grad_enabled()
                self.outermost = True
                _set_grad_enabled(False)

        def __exit__(self, *exc):
            d = self.detector
            if self.outermost:
                _set_grad_enabled(d.state.script_grad)
                d.state.script_grad = None
            d.passive = self.was

    def own_work(self) -> "_Internal":
        return self.internal()

    def internal(self) -> "_Internal":
        """Run nandoctor's own tensor ops without checking them, and without autograd: a
        check of a tensor that requires grad (`isfinite` is `abs` underneath) would add to
        the script's graph what it saves, which non-reentrant checkpointing counts."""
        return Detector._Internal(self)

    # -- called by the hot path (mode.py), on the rare path or for deferred ops ----------

    def on_nonfinite(self, func, args, kwargs, out: torch.Tensor, node, created_seq, intended: bool = False,
                     before: torch.Tensor | None = None) -> None:
        if out.is_meta or not checkable(out):  # no values (the meta device), or float8 storage
            return
        self.read_flags()  # a deferred op that ran earlier comes first
        with self.internal():
            if torch.isfinite(stored_values(out)).all():  # the cheap check's sum overflowed; the values are fine
                if self.records:
                    self.records.forget(out)
                return
            # (Also with no records yet: an input may be a sentinel loaded from a checkpoint.)
            carried = self.recorder.passed_on_intended(func, args, kwargs, out) if not intended else None
            if carried is not None:
                self.records.put(out, carried)  # the mask, passed on: no birth
                return
            record = self.recorder.op(func, args, kwargs, out, node, created_seq, intended, before)
        self.records.put(out, record)
        written = record.facts.parameter if record.facts.writes_parameter else None
        writes_parameter = written is not None and (written.trained or not _born_as_a_metric(record, self._metric_module)) \
            and not self._a_constant_put_back(record, args)
        has_inf = bool(record.output.posinf or record.output.neginf)
        reason = op_verdict(record.phase, record.has_nan, has_inf, out.dtype, accepted=record.intended,
                            writes_parameter=writes_parameter)
        record.overflow = not record.intended and an_overflow(record.phase, has_inf, out.dtype, self.stop_inf_dtypes)
        if reason is None and record.overflow and self.strict_overflow:
            reason = StopReason.OP_MADE_NAN if record.has_nan else StopReason.OP_MADE_INF
        if reason is not None:
            self.stop(record, reason)

    def value_read(self, t: torch.Tensor, value: float | None = None) -> None:
        """The script reads `t` back (`.item()` gave `value`; `.tolist()`, `.numpy()`, print):
        a non-finite value it reads stops the run, with the lineage of where it was made.
        Not one read on a line that tests it (`if not math.isfinite(loss.item()): continue`):
        what the script does next decides. Skipping the batch discards the value on purpose;
        raising over it is reported by `raised_over`; using it anyway stops the run where
        it reaches the gradients."""
        if self.passive or not (t.is_floating_point() or t.is_complex()) or t.is_meta:
            return
        self.read_flags()  # a deferred op made what is read: its flag names it
        with self.internal():
            finite = math.isfinite(value) if value is not None else all_finite(t)
            if finite:
                return
            record = self.recorder.existing_or_bare(t, "", self.recorder.phase(None, ()))
        # (A -inf mask or an allowed line's value may be printed; so may data that came in
        # with its NaN markers, `print(y[:5])` of a table with missing targets: looking at the
        # data is no use of it, and what training does with it is checked where it trains.
        # So may a metric born outside the model: without grad; or, where an optimizer
        # trains, with grad too: a MAPE of the live predictions is logged and trains
        # nothing, and were it the loss, its backward stops the run with the same root.)
        if not record.intended and not record.tested and not _data_as_it_came(record) \
                and not self.locator.tests_finiteness(self.locator.user_frame()) \
                and not self.amp.from_scaled_gradients(record) \
                and not _born_as_a_metric(record, self._metric_module, with_graph=self.state.optimizer_seen):
            self.stop(record, StopReason.READ_BACK)

    def metric_followed(self, metric) -> None:
        """A non-finite metric training follows changes training: a NaN never improves, so
        ReduceLROnPlateau lowers the learning rate and EarlyStopping ends training over it
        (a validation metric the script only printed would not have stopped the run)."""
        if self.passive:
            return
        with self.internal():
            if finite_metric(metric):
                return
            tensor = isinstance(metric, torch.Tensor)
            record = self.records.get(metric) if tensor else None
            # (A number read with .item() keeps no record: the latest value made non-finite is its.)
            record = record or self.recorder.latest_birth() or self.recorder.bare(
                "", metric.detach() if tensor else torch.tensor(float(metric)), self.recorder.phase(None, ()))
        self.stop(record, StopReason.MONITORED_METRIC)

    def defer(self, func, args, out: torch.Tensor, node, created_seq) -> None:
        """Queue a device-side flag for `out`: no sync now, read at the next boundary."""
        if self.deferred.defer(func, args, out, node, created_seq):
            self.read_flags()

    def defer_region(self, name: str, t: torch.Tensor, phase: str, where, module) -> None:
        """Queue a device-side flag for a module region's output (see regions.py)."""
        if self.deferred.defer_named(name, t, phase, where, module):
            self.read_flags()

    def defer_gradient(self, t: torch.Tensor) -> None:
        """Queue a device-side flag for a gradient a backward node gave (see nodes.py)."""
        if self.deferred.defer_gradient(t):
            self.read_flags()

    def carry(self, args, out) -> None:
        self.recorder.carry(args, out)

    def absorbed(self, func, args, node=None, out=None) -> None:
        """A checked op made only finite values (see `Recorder.absorbed`). Per op while
        records exist (a mask's, every step): a lookup, and nandoctor's own ops only for an
        input that holds a value made by accident. Unless the op handles non-finite values
        (`nan_to_num`, `isnan`, `nanmean`): a float16 overflow it absorbs stops the run where
        it overflowed (see `an_overflow`); a NaN it turns into finite values in forward (a
        cast to integers gives -2**63, a sampling grid clips it to the border) stops it
        there: what follows computes with values that no longer show it. (Integers a cast
        made stop the run where they are used, not where they are made: see hidden_nan.py.)"""
        made = [(t, r) for t in tensors_of(args) if (r := self.records.get(t)) is not None and not r.intended]
        if not made:
            return
        with self.internal():
            self.recorder.absorbed(made)
            self.recorder.absorbed_leaves_seen(made)
            name = base_name(func)
            if name in HANDLES_NONFINITE:
                if tests_finiteness(name, args):
                    for _, record in made:
                        record.tested = True
                if name in _REPLACES_NONFINITE:
                    self.recorder.replaced(made)
                return
            hidden = node is None and next((r for t, r in made if r.has_nan and not _born_as_a_metric(r, self._metric_module)
                                            and bool(torch.isnan(t).any())), None)
        for _, record in made:
            born = birth_of(record)
            if born.overflow:
                self.stop(born, StopReason.OP_MADE_NAN if born.has_nan else StopReason.OP_MADE_INF)
        if not hidden:
            return
        hidden_in = next(t for t, r in made if r is hidden)
        if not _made_integers_of(hidden_in, out):
            self.stop(hidden, StopReason.NAN_HIDDEN, hidden_by=f"aten.{name}")
        with self.internal():
            hidden_nan.hide(self.hidden_nans, out, torch.isnan(hidden_in), hidden, f"aten.{name}")

    def hidden_nans_taken(self, taken, passes_on: bool) -> None:
        """An op is about to take integers a cast made of NaN (`taken`, see hidden_nan.py).
        Unless it only passes values on (`passes_on`) and takes them first, it uses them:
        the run stops at the NaN, before the op runs (a loss given the label -2**63 raises
        over it)."""
        if not (passes_on and len(taken) == 1 and taken[0][0] == 0):
            self.stop(taken[0][1].record, StopReason.NAN_HIDDEN, hidden_by=taken[0][1].hidden_by)

    def hidden_nans_passed_on(self, func, args, kwargs, out, taken) -> None:
        """...and it ran, passing values on: the positions of `out` that came from NaN are
        the op's own on the positions taken (`target[labelled]` keeps none: clean); an op
        they cannot be followed through is a use."""
        entry = taken[0][1]
        with self.internal():
            positions = hidden_nan.positions_passed_on(func, (entry.positions, *args[1:]), kwargs, out)
            if positions is not None:
                hidden_nan.hide(self.hidden_nans, out, positions, entry.record, entry.hidden_by)
        if positions is None:
            self.stop(entry.record, StopReason.NAN_HIDDEN, hidden_by=entry.hidden_by)

    def values_received(self, collective: str, received, sent: list) -> None:
        """A collective (`dist.all_reduce`, `all_gather`, `broadcast`) wrote what the ranks
        sent into `received`, in place. A non-finite value there that this rank sent itself
        (`sent`, all_gather's input, holds a value it made) carries that value's record; one
        no record of this rank's covers arrived from a peer: recorded as received, so that
        what it goes on to make is not this rank's own (the peer that made it is the
        culprit), and it is not taken for data from outside torch."""
        if self.passive:
            return
        with self.internal():
            own = next((r for _, t in tensors_in(sent) if (r := self.records.get(t)) is not None
                        and not r.intended), None)
            for _, t in tensors_in(received):
                if not t.is_floating_point() or t.is_meta or not checkable(t) or all_finite(t) \
                        or self.records.get(t) is not None:
                    continue
                if own is not None:
                    self.records.put(t, own)  # (its own share came back with the others')
                    continue
                # (A lone -inf, a running max's start, stays the sentinel `bare` takes it for.)
                record = self.recorder.bare(f"torch.distributed.{collective}", t, self.recorder.phase(None, ()))
                record.facts.untracked_input, record.facts.received_from_peers = False, True
                self.records.put(t, record)

    def absorbed_in_place(self, args, out: torch.Tensor) -> None:
        """An in-place op computed finite values over recorded non-finite ones (a gate's
        `sigmoid_` of +inf): absorbed, as `Recorder.absorbed_in_place` says."""
        with self.internal():
            self.recorder.absorbed_in_place(args, out)

    def filled(self, args, out: torch.Tensor) -> None:
        """A fill, `where` or clamp touched a tensor with a record (rare): its output carries
        the record while it is still non-finite; values it dropped were masked away."""
        with self.internal():
            self.recorder.filled(args, out)

    def read_flags(self) -> None:
        """Read the pending device flags (one sync) and apply the policy to what they saw."""
        if not len(self.flags):
            return
        with self.internal():
            verdict = self.deferred.read()
        if verdict is not None:
            self.stop(*verdict)

    def value_entered(self, t, op: str) -> None:
        """A tensor entered torch from outside (`torch.tensor`, `from_numpy`, `as_tensor`):
        a non-finite one is born here, at this line, as input data."""
        if self.passive or not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.is_meta:
            return
        with self.internal():
            if self.records.get(t) is not None or all_finite(t):  # (from_numpy also lifts)
                return
            record = self.recorder.entered(op, t, self.recorder.entering_phase())
        self.records.put(t, record)

    def _metric_module(self, name: str) -> bool:
        return self.recorder.modules.holds_no_parameters(name)

    def _a_constant_put_back(self, record: Record, args) -> bool:
        """Is `record` a buffer copied back (load_state_dict) with what a model was built with
        before training and has trained with since (a log-prior of -inf for a class never
        seen), as `state_exported` lets such a value out?"""
        written = record.facts.parameter
        if not (written is not None and written.buffer and record.op.startswith("aten.copy_") and self.state.step > 0
                and len(args) > 1 and isinstance(args[1], torch.Tensor)):
            return False
        source = self.records.get(args[1])
        if source is not None:
            return birth_of(source).phase == "init"
        # A copy made outside torch's view (copy.deepcopy of the state) put back into the
        # buffer that held the same: its own constant, the same infinities again.
        out = record.output
        return bool(record.parents) and all(
            birth_of(p).phase == "init" and p.output is not None
            and (p.output.nan, p.output.posinf, p.output.neginf) == (out.nan, out.posinf, out.neginf)
            for p in record.parents)

    def state_exported(self, module, state) -> None:
        """A value made non-finite by accident that ended up in a model's state (written
        through a detached alias, as `AveragedModel` and EMA helpers write their average)
        matters once the script takes it out: an EMA's weights saved to deploy. Not a value
        the model was built with and has trained with since (a log-prior of -inf for a class
        never seen, ±inf bin edges): steps that used it kept their loss and gradients finite,
        so it is a constant of the model, exported as it was made. Only tensors with a record
        are looked at, so this costs nothing while no value went bad."""
        if self.passive or not self.records:
            return
        with self.internal():
            for name, t in state.items():
                record = self.records.get(t) if isinstance(t, torch.Tensor) else None
                if record is None or record.intended or (record.phase == "init" and self.state.step > 0):
                    continue
                if not all_finite(t):
                    self.stop(self.recorder.exported(t, name, record), StopReason.STATE_EXPORTED)

    def saving(self, obj) -> None:
        with self.internal():
            self.saved.saving(obj)

    def loaded(self, obj) -> None:
        with self.internal():
            self.saved.loaded(obj)

    def discarded(self):
        """Sites whose non-finite values never mattered: in a stopped run, not the ones on
        the way from the root to the stop (those mattered)."""
        made = self.recorder.discarded()
        if self.detection is None:
            return made
        mattered = {(s.op, s.location) for s in self.detection.lineage}
        return [d for d in made if (d.op, d.location) not in mattered]

    def op_raised(self, error: Exception, op: str, args) -> None:
        """An op raised `error`. When it refused its values (BCE's "all elements of target
        should be between 0 and 1") and an input held a NaN or Inf made by accident, that
        value is what the script dies of: kept for `raised_over`. (Not a -inf mask: a shape
        error next to one is the script's own.)"""
        if self.passive or not refuses_values(error):
            return
        with self.internal():
            for t in tensors_of(args):
                if (t.is_floating_point() or t.is_complex()) and not t.is_meta and t.numel() and not all_finite(t):
                    record = self.recorder.existing_or_bare(t, "", self.recorder.phase(None, ()))
                    if not record.intended:
                        self._refused = (error, op, record)
                        return

    def raised_over(self, error: BaseException) -> Detection | None:
        """A script that guards its own loss (`if torch.isnan(loss): raise`, `assert
        torch.isfinite(loss)`, a framework's "loss is nan" error) dies over a value this run
        saw made but let pass, since only the check's boolean was read: the latest one made
        is what it raised over. Only for an error that speaks of NaN/Inf (message or line).
        Or an op refused a non-finite input with the error the script died of (`op_raised`):
        that input is the event."""
        if self.detection is not None:
            return None
        if self._refused is not None and _same_error(error, self._refused[0]):
            _, op, record = self._refused
            self.detection = self._explain(record, StopReason.OP_REFUSED, refused_by=op)
            return self.detection
        held = self._held_where_it_raised(error)
        if held is not None:  # (an op of a phase checked at its boundary: a sampler's multinomial)
            self.detection = self._explain(held[1], StopReason.OP_REFUSED, refused_by=held[0])
            return self.detection
        if not (speaks_of_nonfinite(error) or self.locator.tests_finiteness(raised_at(error))):
            return None
        birth = self.recorder.latest_birth()
        made_in_backward = self.recorder.latest_backward  # (the script's own detect_anomaly raises there)
        if made_in_backward is not None and (birth is None or made_in_backward.order > birth.order):
            birth = made_in_backward
        if birth is None:
            return None
        self.detection = self._explain(birth, StopReason.SCRIPT_RAISED)
        return self.detection

    def _held_where_it_raised(self, error: BaseException) -> tuple[str, Record] | None:
        """(the function, the record) of a non-finite value made by accident that the
        innermost frames of a value error hold, as a variable or an attribute of `self`:
        an op nandoctor did not watch refused it (`WeightedRandomSampler` draws with
        `torch.multinomial(self.weights, ...)` while data loads, and NaN weights make it
        raise "invalid multinomial distribution")."""
        if not isinstance(error, (RuntimeError, ValueError, IndexError)) or not self.records:
            return None
        frames = []
        tb = error.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        for frame in reversed(frames[-_FRAMES_LOOKED_AT:]):
            owner = frame.f_locals.get("self")
            values = [*frame.f_locals.values(), *(vars(owner).values() if hasattr(owner, "__dict__") else ())]
            for value in values:
                record = self.records.get(value) if isinstance(value, torch.Tensor) else None
                if record is not None and not record.intended:
                    name = frame.f_code.co_qualname if hasattr(frame.f_code, "co_qualname") else frame.f_code.co_name
                    return name, record
        return None

    def _explain(self, event: Record, reason: StopReason, **how) -> Detection:
        """The detection of `event`: its lineage back to the root (see lineage.explain)."""
        detection = explain(event, reason, self.recorder.forward_by_node, self.locator,
                            forward_by_line=self.recorder.forward_by_line, **how)
        root = detection.root
        if self.recorder.gradients_left_to_the_step and not root.op and root.facts.untracked_input:
            # A value no op was seen making, between a backward that left nodes to the step
            # and the step: most likely what such a node made (a gradient the script read
            # through ops that pass a value on unchecked, `p.grad.abs().max()`). The replay
            # checks backward op by op.
            detection.needs_replay = True
        return detection

    def first_nan(self) -> Detection | None:
        """The first NaN made in the run, explained as if it had stopped it, also when it
        was discarded (for a caller stricter than the run policy: the pytest plugin)."""
        birth = self.recorder.first_nan_birth
        if birth is None:
            return None
        return self._explain(birth, StopReason.OP_MADE_NAN)

    # -- the training boundaries (the observer protocol) ----------------------------------

    def before_backward(self, roots, plain: bool = False) -> int:
        self.state.training_started = True
        self.regions.close_interrupted()
        graph = roots  # what backward() runs from (a GradScaler's scaled loss)
        roots, self._scaled_backward = self.amp.unscaled(roots)  # a GradScaler's: its loss
        self._checked_at_the_step = self._checks_at_the_step(roots)
        if not (self._checked_at_the_step and self.flags.enabled):
            self.read_flags()
        built = self.graph_built.take()
        by_node = plain and self._can_check_by_node(graph)
        self._by_node.append(by_node and not self._suspended)
        self.nodes.begin(graph if by_node else None)
        # Not where ranks train together: each rank's gradients are all-reduced in backward,
        # and the rank whose node made a value must have its record to be named the culprit.
        self._overflow_left_to_the_step = self._checked_at_the_step and not ranks_train_together()
        self.recorder.gradients_left_to_the_step = by_node and self._overflow_left_to_the_step
        if by_node:
            self._suspend()  # (first: the loss's read and the arming run no op through the mode)
        with self.internal():
            self._backward_mark = self.boundaries.loss(roots, self.amp if self._scaled_backward else None,
                                                       keep=self._checked_at_the_step)
            self.amp.backward_began(self._backward_mark, self._scaled_backward)
            if by_node:
                self.nodes.arm(self._graph_fingerprint(graph, *built) if self._overflow_left_to_the_step else None)
        return self._backward_mark

    def _graph_fingerprint(self, roots, made: int, nodes: int):
        """What built the graph a backward starts on, when every autograd node made since
        the last backward is accounted for (`graph_built`: regions, ops through the mode,
        compiled functions): what made them, in order, with their node counts, and where
        in that stretch the roots are. Each step of a training loop gives the same (see
        NodeChecks.arm). None when some node was made where nandoctor did not see it."""
        if _sequence_nr() - self._nodes_before != nodes:
            return None
        return made, tuple(t.grad_fn._sequence_nr() - self._nodes_before for t in roots
                           if isinstance(t, torch.Tensor) and t.grad_fn is not None)

    def _checks_at_the_step(self, roots) -> bool:
        """Leave this backward's checks (the loss, the gradients after it, and on an
        accelerator the flags) to the optimizer's step? A non-finite loss or gradient
        matters where the step would apply it: a script that skips the update when they
        are not finite (`if not torch.isfinite(grad_norm): optimizer.zero_grad(); continue`)
        discards them on purpose, as watch mode sees. On an accelerator it is also one host
        sync a step instead of three. Not without an optimizer (no step would check them),
        inside one's step (a closure's backward: its step boundary has passed), or for a
        GradScaler's loss (the scaler decides at once whether the step is skipped)."""
        return (self.state.optimizer_seen and not self._stepping and not self._scaled_backward
                and (not self.flags.enabled
                     or all(t.is_cpu or self.flags.covers(t) for t in roots if isinstance(t, torch.Tensor))))

    def _can_check_by_node(self, roots) -> bool:
        """With ours the innermost mode (a script's own mode sees the ops it asked for), on
        the CPU or on an accelerator whose nodes then queue device flags (see nodes.py).
        Not under the script's own `detect_anomaly`: it raises from inside the engine
        before a node's post-hook runs, so only a per-op backward has seen the op that
        made the value by then."""
        return (self.backward_by_node and not self.passive and _get_current_dispatch_mode() is self.mode
                and not torch.is_anomaly_enabled()
                and all(t.is_cpu or self.flags.covers(t) for t in roots if isinstance(t, torch.Tensor)))

    def _backward_ended(self) -> None:
        self.nodes.end()
        if self._by_node and self._by_node.pop():
            if not self._by_node:
                self._python_code.clear()  # (a Python node that raised never said it ended)
            # The engine runs each node under the thread's modes as they were when backward()
            # began, and puts them back after it: where a node raised before its post-hook,
            # what the flag says may not be what is on the stack.
            self._suspended = self.mode not in _get_current_dispatch_mode_stack()
            self._resume()

    def backward_failed(self) -> None:
        self._backward_ended()

    @property
    def overflow_left_to_the_step(self) -> bool:
        """Are this backward's loss and gradients checked at the optimizer's step (see
        `_checks_at_the_step`), with no peer rank to share them? Then its nodes that can
        only overflow go unhooked (nodes.py)."""
        return self._overflow_left_to_the_step

    @property
    def mode_suspended(self) -> bool:
        return self._suspended

    def python_code_starts(self) -> None:
        """Python code runs inside a backward checked node by node (a custom Function's
        backward, a hook): op by op, as everywhere else."""
        resumed = self._suspended and not self.passive  # (never after the run: a hook outlives it)
        self._python_code.append(resumed)
        if resumed:
            self._resume()

    def python_code_ends(self) -> None:
        if self._python_code and self._python_code.pop():
            if self.made_nonfinite_in_backward():
                self.nodes.arm_leaves()  # (before the engine reaches them: see nodes.py)
            self._suspend()

    def python_in_backward(self, fn):
        detector = self

        @functools.wraps(fn)
        def traced(*args, **kwargs):
            detector.python_code_starts()
            try:
                return fn(*args, **kwargs)
            finally:
                detector.python_code_ends()

        return traced

    def node_went_nonfinite(self, grad_inputs, grad_outputs) -> None:
        """A node checked by `nodes.NodeChecks` gave a non-finite gradient: run it again
        under the per-op mode, from the same gradients and its saved tensors, so that its
        ops are recorded as a per-op backward records them; the records pass on to what
        the node really gave."""
        node = current_node()
        with self.internal():
            self.recorder.link_untracked(grad_outputs)  # summed by the engine, out of the mode's sight
            self.recorder.made_out_of_sight(grad_outputs)  # by a node left to the step (nodes.py)
        again = None
        self.python_code_starts()
        try:
            again = node(*grad_outputs)
        except Exception:  # noqa: BLE001 - not callable again: its outputs are recorded as they are
            pass
        finally:
            self.python_code_ends()
        again = again if isinstance(again, (tuple, list)) else (again,)
        with self.internal():
            for index, real in enumerate(grad_inputs):
                replayed = again[index] if index < len(again) else None
                if isinstance(real, torch.Tensor) and (real.is_floating_point() or real.is_complex()) \
                        and not all_finite(real):
                    record = self.records.get(replayed) if isinstance(replayed, torch.Tensor) else None
                    self.records.put(real, record or self.recorder.node_output(node, real))
        self.nodes.arm_leaves()

    def made_nonfinite_in_backward(self) -> bool:
        return self.recorder.last_backward_order >= self._backward_mark

    def leaf_gradient_from(self, leaf, incoming: torch.Tensor) -> None:
        """`leaf.grad` took `incoming` (see NodeChecks._leaf_accumulated)."""
        grad = getattr(leaf, "grad", None)
        if not isinstance(grad, torch.Tensor) or self.records.get(grad) is not None:
            return
        with self.internal():
            record = self.records.get(incoming)
            if record is None and incoming.is_floating_point() and not all_finite(incoming):
                record = self.recorder.latest_backward  # summed by the engine before it came
            if record is not None and not all_finite(grad):
                self.records.put(grad, record)

    def after_backward(self, roots, mark: int) -> None:
        self._backward_ended()
        self._nodes_before = _sequence_nr()  # (the next graph starts here: what was built so far is not in it)
        self.graph_built.take()
        at_the_step = self._checked_at_the_step
        if not (at_the_step and self.flags.enabled):
            self.read_flags()
        with self.internal():
            # The gradients of a scaled loss are the scaler's to check (it skips the step),
            # and with an optimizer its step reads them before the update.
            self.boundaries.gradients_after_backward(roots, mark, check=not (self._scaled_backward or at_the_step))

    def scaler_stepped(self, scaler, optimizer, skipped: bool) -> None:
        super().scaler_stepped(scaler, optimizer, skipped)
        if not skipped:
            return
        with self.internal():
            collapse = self.amp.collapsed(scaler)
        if collapse is not None:
            # The first non-finite value the last (scaled) backward made, else a gradient.
            with self.internal():
                record = self.recorder.first_birth_since(self._backward_mark) or self._bad_gradient(optimizer)
            birth_of(record).facts.amp = collapse  # the root's fact: the rules read the root
            self.stop(record, StopReason.AMP_SCALE_COLLAPSE)

    def _bad_gradient(self, optimizer) -> Record:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]
                 if p.grad is not None and not bool(torch.isfinite(stored_values(p.grad)).all())]
        return self.recorder.existing_or_bare(grads[0], "", "backward") if grads else \
            self.recorder.bare("", torch.tensor(float("nan")), "backward")

    def after_grad(self, outputs, mark: int) -> None:
        self.read_flags()
        with self.internal():
            self.boundaries.returned_gradients(outputs)

    def optimizer_created(self, optimizer) -> None:
        super().optimizer_created(optimizer)
        self.boundaries.optimizers.add(optimizer)
        try:
            # (A Keras optimizer's torch view is made inside fit: it knows where the script made it.)
            self._optimizers_made_at[optimizer] = getattr(optimizer, "made_at", None) or self.locator.user_frame()
        except TypeError:
            pass  # (an optimizer that takes no weak reference: its step's line stays the answer)

    def _made_at_of_the_stepping_optimizer(self) -> tuple | None:
        optimizer = self._stepping_optimizer() if self._stepping_optimizer is not None else None
        return self._optimizers_made_at.get(optimizer) if optimizer is not None else None

    def before_optimizer_step(self, optimizer) -> None:
        self._stepping_optimizer = weakref.ref(optimizer) if type(optimizer).__weakrefoffset__ else None
        self.state.optimizer_created()
        self.regions.close_interrupted()
        with self.internal():
            # Every number the step's checks need, in one transfer (one host sync on a GPU):
            # the flags of the ops since backward (gradient clipping, loss scaling) or since
            # the last step, the losses kept, the gradients' norm. Checked in that order.
            transfer = HostRead(one_transfer=self.flags.enabled)
            flags = self.deferred.take(transfer) if len(self.flags) else None
            losses = self.boundaries.take_kept_losses(transfer)
            gradients = self.boundaries.take_gradients(optimizer, transfer)
            host = transfer.read()
            verdict = flags(host) if flags is not None else None
        if verdict is not None:
            self.stop(*verdict)
        if not self.check_optimizer_ops:
            self._suspend()  # off the mode before our own checks too: no dispatch overhead
        with self.internal():
            losses(host)
            gradients(host)
            setting = _nonfinite_setting(optimizer)
            if setting is not None:
                self.stop(self._made_the_setting(setting), StopReason.OPTIMIZER_SETTING)
        self.state.in_optimizer = True

    def _made_the_setting(self, setting: str) -> Record:
        """The record of what made an optimizer's `setting` non-finite: a schedule computed
        in the script (`(1 - it / max_iter) ** power` past the end). The value an op made
        non-finite last, in torch; else the line numpy warned at in this step
        (`np.power(1 - it / max_iter, 0.9)`); else the step's own line."""
        record = self.recorder.latest_birth()
        if record is None:
            record = self.recorder.bare("", torch.tensor(float("nan")), "optimizer")
            numpy_warnings = self.recorder.numpy_warnings
            warned = numpy_warnings and (numpy_warnings.made(True, record.step) or numpy_warnings.made(False, record.step))
            if warned:
                record.where, record.facts.made_by_numpy = warned.where, warned.message
        record.facts.optimizer_setting = setting
        return record

    def clearing_gradients(self, optimizer, clear):
        """zero_grad runs with the mode off: it only sets gradients to None or zeros, and
        through the mode it cost two profiler marks' and a zeroing's dispatches a step.
        A gradient zeroed in place no longer holds what its record said."""
        self.boundaries.drop_kept_losses()  # the script throws the gradients they made away
        self.recorder.gradients_left_to_the_step = False
        try:
            return self._mode_off_for(clear)
        finally:
            if self.records:
                for group in optimizer.param_groups:
                    for p in group["params"]:
                        if isinstance(p.grad, torch.Tensor):
                            self.records.forget(p.grad)

    def stepping(self, optimizer, step):
        """The whole step runs with the mode off, the profiler mark torch puts around it
        included (two ops a step); its boundaries check the update."""
        if self.check_optimizer_ops:
            return step()
        self._stepping += 1
        try:
            return self._mode_off_for(step)
        finally:
            self._stepping -= 1

    def _mode_off_for(self, call):
        """`call()` with the per-op mode off (only when ours is the innermost mode), and back
        as it was after."""
        was_suspended = self._suspended
        self._suspend()
        try:
            return call()
        finally:
            if not was_suspended:
                self._resume()

    def closure_started(self, optimizer) -> None:
        # The closure's forward and backward are checked op by op, in their own phase.
        self.state.in_optimizer = False
        self._resume()

    def after_optimizer_step(self, optimizer) -> None:
        self.state.in_optimizer = False
        self.recorder.gradients_left_to_the_step = False  # (applied: the parameters are checked now)
        if not self.check_optimizer_ops:
            with self.internal():
                # (A step proven to keep the parameters finite needs neither, see update_bounds.py.)
                if not self.boundaries.update_bounds.proven_finite(optimizer) \
                        and not (self.flags.enabled and self._flag_the_update(optimizer)):
                    self.boundaries.after_step(optimizer)
        if not self._stepping:  # (else `stepping` puts it back, after torch's profiler mark)
            self._resume()
        self.deferred.suspects.clear()
        try:
            super().after_optimizer_step(optimizer)
        except (StepLimitReached, PeerStopped):
            self.passive = True
            raise

    def _flag_the_update(self, optimizer) -> bool:
        """On an accelerator, the parameters' check after the step is a device flag (one
        fused norm, in float64 where no finite value overflows), read with the next step's
        check, not a host sync now; a flagged update is localised by the replay, which
        checks each op of the step. False where the check is made on the host."""
        params = [p for g in optimizer.param_groups for p in g["params"] if p.is_floating_point() and not p.is_meta]
        if not params or not all(self.flags.covers(p) for p in params) or len({p.device for p in params}) > 1:
            return False
        norms = torch.stack(torch._foreach_norm(params, 2, dtype=torch.float64))
        if self.deferred.defer_named(_THE_UPDATE, norms, "optimizer", self.locator.user_frame(2), None):
            self.read_flags()
        return True

    def compiled_call(self, fn, name: str, args, kwargs, eager=None):
        if self.eager_compiled and eager is not None:
            # The replay runs the region's code itself, every op checked: not through Dynamo,
            # which under a dispatch mode runs it eagerly, or with fullgraph=True refuses to.
            return eager(*args, **kwargs)
        if self.passive or self.eager_compiled:
            return fn(*args, **kwargs)
        self._last_compiled = name
        first_node = _sequence_nr()
        with _ModeFullyOff(self):  # the user's graphs compile and run as in plain python
            out = fn(*args, **kwargs)
        self.boundaries.update_bounds.writes_unseen()  # (its code may write a parameter)
        self.graph_built.add(name, _sequence_nr() - first_node)
        with self.internal():
            self._check_compiled_outputs(out, name)
        return out

    def _check_compiled_outputs(self, out, name: str) -> None:
        """A non-finite output of a compiled region is a suspect like any op's, made by the
        region as a whole (its ops ran unseen): the replay finds the op inside."""
        for _, t in tensors_in(out):
            if t.is_floating_point() and not t.is_meta and self.records.get(t) is None and not all_finite(t):
                record = self.recorder.bare("", t, self.recorder.phase(None, ()))
                record.facts.untracked_input = False
                record.facts.compiled = name
                self.records.put(t, record)

    def data_started(self) -> None:
        self.state.training_started = True
        self.state.data_depth += 1
        self.regions.close_interrupted()
        self._suspend()

    def data_finished(self) -> None:
        self.state.data_depth -= 1
        if not self.state.data_depth:
            self._resume()

    def check_batch(self, batch, batch_number: int, indices, dataset=None, collate=None, stream=None) -> None:
        if self.check_batches:
            with self.internal():
                self.batches.check(batch, batch_number, indices, dataset, collate, stream)

    def _refetch(self, dataset, indices, collate=None) -> list[torch.Tensor] | None:
        """Fetch these samples again under the per-op mode (and collate them, when
        `collate` is given), so the op that makes the value there is recorded with its own
        line; gives the samples' non-finite tensors. The random state is the script's again
        after (a random augmentation draws again here; a script that imputes the batch
        trains on with its own stream). Best effort: the batch is recorded anyway."""
        def fetch(twin):
            self._check_ops_again()
            samples = [twin[index] for index in indices]
            if collate is not None:
                collate(samples)
            return samples

        return self._fetched_again(fetch, dataset)

    def _refetch_stream(self, dataset, stream, batch_number: int, collate=None) -> list[torch.Tensor] | None:
        """An IterableDataset's batch `batch_number`, fetched again (see `_refetch`): a new
        pass over the stream in this process, as the worker that made the batch (its
        `get_worker_info()` and seeds), with the per-op mode off up to the batch and on for
        its samples. Deterministic streams only, like any refetch."""
        worker, number = stream.worker_of(batch_number)
        per_batch = stream.batch_size or 1

        def fetch(twin):
            with _as_worker(twin, stream, worker):
                samples = iter(twin)
                for _ in range(number * per_batch):  # (at the script's own speed: no op checked)
                    next(samples)
                self._check_ops_again()
                batch = [next(samples) for _ in range(per_batch)]
                if collate is not None:
                    collate(batch)
                return batch

        return self._fetched_again(fetch, dataset)

    def _refetch_as_worker(self, dataset, stream, worker: int, batches: list, collate=None) -> list[torch.Tensor] | None:
        """A map-style dataset's batch that worker process `worker` made, the last of
        `batches` (the indices of each it fetched this epoch), fetched again (see `_refetch`)
        as that worker fetched it: its `get_worker_info()`, seeds and `worker_init_fn`, then
        each earlier batch, in order, with the per-op mode off (a random transform draws the
        same numbers), then this one with it on."""
        *earlier, this = batches

        def fetch(twin):
            with _as_worker(twin, stream, worker):
                for indices in earlier:  # (at the script's own speed: no op checked)
                    samples = _fetch_samples(twin, indices)
                    if collate is not None:
                        collate(samples)
                self._check_ops_again()
                samples = _fetch_samples(twin, this)
                if collate is not None:
                    collate(samples)
                return samples

        return self._fetched_again(fetch, dataset)

    def _fetched_again(self, fetch, dataset) -> list[torch.Tensor] | None:
        """What the refetches share: `fetch(twin)` runs in the data phase on a copy of the
        dataset that leaves the script's own as it was (`undisturbed`: its generators and
        counters), with the script's random state put back after; a dataset that fails on
        a second read gives None (the batch is reported as it came), and what comes back
        gives its non-finite tensors."""
        self.state.data_depth += 1
        try:
            with _random_state_kept(), self._numpy_warnings.caught():
                samples = fetch(undisturbed(dataset))
        except NonFiniteFound:
            raise
        except Exception:  # noqa: BLE001 - a dataset or stream that fails on a second read: report the batch
            return None
        finally:
            self.passive = True
            self.state.data_depth -= 1
        with self.internal():
            return [t for _, t in tensors_in(samples) if t.is_floating_point() and not all_finite(t)]

    def _check_ops_again(self) -> None:
        """From here on in a refetch, ops run under the per-op mode (they are recorded)."""
        self.passive = False
        self._resume()

    # -- stopping ------------------------------------------------------------------------

    def stop(self, event: Record, reason: StopReason, needs_replay: bool = False, hidden_by: str | None = None) -> None:
        """Stop the run at `event`: explain it (root, lineage) and raise into the script."""
        suspects: list[Record] = []
        born = birth_of(event)
        came_in = born.facts.entered or born.facts.batch is not None  # data: its own root
        if self.deferred.were_read and born.facts.device_flag is None and not came_in and \
                (not born.inputs or born.facts.untracked_input):
            # In a run checked by device flags, which keep no lineage, a value found bad
            # with no op of its own behind it (at a boundary, or an input no record names)
            # most likely came from a flagged op: a replay that checks each op at once finds
            # it; until then the suspects the flags saw are the candidates, the first NaN
            # (else Inf) the root.
            needs_replay = True
            suspects = self.deferred.suspects
            first = next((r for r in suspects if r.has_nan), suspects[0] if suspects else None)
            if first is not None and first is not born:
                born.parents.append(first)
        # A compiled backward runs with the mode on, but most of its work in fused kernels the
        # mode never sees: an op it sees with a non-finite input no record names did not
        # make that value, an unseen kernel before it did.
        in_compiled_backward = born.backward_node == COMPILED_BACKWARD and born.facts.untracked_input
        if self._last_compiled is not None and not came_in and born.facts.device_flag is None and \
                (not born.op and reason in _UNSEEN_OP_REASONS or in_compiled_backward):
            # No op nandoctor saw made it, and compiled code ran: a compiled forward or its
            # compiled backward did. The replay runs the compiled code eagerly to find the op.
            born.facts.compiled = born.facts.compiled or self._last_compiled
            born.facts.untracked_input = False
        if born.facts.compiled is not None:
            needs_replay = True
        if born.phase == "backward" and born.backward_node is not None and not born.op:
            needs_replay = True  # a node that could not run again op by op (see node_went_nonfinite)
        if reason is StopReason.GRADIENT_BEFORE_STEP and self.amp.from_scaled_gradients(event):
            # scaler.step() steps only on finite unscaled gradients: these came in around it.
            event.facts.scaled_gradient_stepped = True
        if reason is StopReason.GRADIENT_BEFORE_STEP and born.phase == "backward" and not born.op:
            # A gradient no op nandoctor saw made: what a node left to the step's check made
            # (see nodes.py, `_LEFT_TO_THE_STEP`), or summed out of sight. The replay checks
            # backward op by op.
            needs_replay = True
        self.passive = True
        self.detection = self._explain(event, reason, needs_replay=needs_replay, flagged_suspects=suspects,
                                       hidden_by=hidden_by)
        raise NonFiniteFound(reason.value)


def _same_error(error: BaseException, refused: BaseException) -> bool:
    """Is `error` the one an op raised, or raised from it (a library that wraps it)?"""
    seen = 0
    while error is not None and seen < 8:
        if error is refused:
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False
