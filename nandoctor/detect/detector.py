"""The detector: the public context manager around a running script.

It owns the state (records of non-finite tensors, provenance, phase, step, history),
installs the hooks where training shows itself, and decides — on the rare path only —
when a non-finite value is a verdict (stop) or a suspect (remember, keep going):

1. A NaN made in forward, optimizer or data loading stops the run at once.
2. An Inf is a suspect: it stops the run when it reaches the loss (`backward()`), a
   gradient, a parameter or optimizer state, or when its dtype is listed in
   `stop_on_inf_dtypes` (float16 by default).
3. Inside backward, NaN and Inf are suspects too: autograd formulas make Inf and mask it
   (atan2 at the origin, norm at zero). What counts is a gradient still non-finite when
   `backward()` returns.
4. `empty*` results and values written on purpose (`masked_fill(mask, -inf)`) never stop it.

When it stops, it raises `NonFiniteFound` (a BaseException, so a script's `except
Exception` cannot swallow it) and `result()` gives the event, the root and the lineage.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from nandoctor.detect import hooks
from nandoctor.detect.device_flags import DeviceFlags, Flagged, FlaggedOp
from nandoctor.detect.mode import CheckingMode, all_finite
from nandoctor.detect.ops import is_inplace, op_name
from nandoctor.detect.provenance import ModuleTracker, NodeSites, SourceLocator
from nandoctor.detect.records import Record, RecordTable, next_order, storage_key
from nandoctor.diagnose.facts import collect_facts
from nandoctor.report.model import History, OpSite
from nandoctor.stats import summarize


class NonFiniteFound(BaseException):
    """Raised into the script to stop it at the first non-finite value."""


class StepLimitReached(BaseException):
    """Raised into the script after `max_steps` optimizer steps (a clean, deliberate stop)."""


@dataclass
class Detection:
    event: OpSite
    root: OpSite
    lineage: list[OpSite]


@dataclass
class StepHistory:
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

    def as_report(self) -> History:
        return History(list(self.steps), list(self.loss), list(self.grad_norm))


class Detector:
    """`with Detector(settings): run the script` — see the module docstring."""

    def __init__(self, run_settings, locator: SourceLocator | None = None) -> None:
        self.settings = run_settings
        self.stop_inf_dtypes = {getattr(torch, name) for name in run_settings.get("stop_on_inf_dtypes", ())}
        self.max_steps = int(run_settings.get("max_steps", 0) or 0)
        # Check each op inside optimizer.step() (a replay localising an optimizer failure
        # does); by default the step is checked once, at its end.
        self.check_optimizer_ops = bool(run_settings.get("check_optimizer_ops", False))
        self.locator = locator or SourceLocator()
        self.modules = ModuleTracker()
        self.sites = NodeSites()
        self.records = RecordTable()
        # Ops on an accelerator are checked by flags read at boundaries (no sync per op).
        self.flags = DeviceFlags(str(run_settings.get("device_flags", "auto")))
        self._inf_suspects: list[Record] = []  # deferred ops of this step that made an Inf
        self.flags_read = False
        self.forward_nonfinite_by_node: dict[int, Record] = {}
        self.mode = CheckingMode(self)
        self.passive = False  # True while nandoctor runs its own ops, and after a stop
        self.step = 0
        self.optimizer_seen = False
        self.training_started = False
        self.in_optimizer = False
        self.data_depth = 0
        self.last_backward_record_order = -1
        self._optimizers_checked: "weakref.WeakSet" = weakref.WeakSet()
        self.history = StepHistory(int(run_settings.get("history", 64)))
        self._pending_loss: float | None = None
        self._pending_grad_norm: float | None = None
        self.detection: Detection | None = None
        self._hooks = hooks.TrainingHooks(self)

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> "Detector":
        self.modules.install()
        self._hooks.install()
        self.mode.__enter__()
        self._suspended = False
        return self

    def finish(self) -> None:
        """The script ended: flags still pending are read (a NaN in its last ops counts)."""
        self.read_flags()

    def __exit__(self, *exc) -> None:
        self.passive = True
        if not self._suspended:
            self.mode.__exit__(None, None, None)
        self._hooks.uninstall()
        self.modules.uninstall()

    def _suspend(self) -> None:
        """Take the per-op mode off the stack (optimizer step, data loading): these phases
        are checked at their boundary instead, which is what makes trace mode cheap there.
        Only done when ours is the innermost mode, so a user's own mode is never disturbed."""
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        if not self._suspended and _get_current_dispatch_mode() is self.mode:
            self.mode.__exit__(None, None, None)
            self._suspended = True

    def _resume(self) -> None:
        if self._suspended:
            self._suspended = False
            self.mode.__enter__()

    class _Internal:
        def __init__(self, detector: "Detector") -> None:
            self.detector = detector

        def __enter__(self):
            self.was = self.detector.passive
            self.detector.passive = True

        def __exit__(self, *exc):
            self.detector.passive = self.was

    def internal(self) -> "_Internal":
        """Run nandoctor's own tensor ops without checking them."""
        return Detector._Internal(self)

    # -- the phase ---------------------------------------------------------------------

    def phase(self, node, args) -> str:
        if node is not None:
            return "backward"
        if self.in_optimizer:
            return "optimizer"
        if self.data_depth:
            return "data"
        # Setup (building the model, loading a checkpoint) ends when an optimizer is made,
        # a batch is drawn, or a backward runs; an op inside a module's forward or one that
        # builds an autograd graph is a forward pass even before that.
        if not self.training_started and self.modules.current is None and not _builds_graph(args):
            return "init"
        return "forward"

    def optimizer_created(self, optimizer) -> None:
        self.optimizer_seen = True
        self.training_started = True

    # -- the rare path: an op made a non-finite value ------------------------------------

    def on_nonfinite(self, func, args, kwargs, out: torch.Tensor, node, created_seq, intended: bool = False) -> None:
        if out.is_meta:  # no values (a model built on the meta device): nothing to record
            return
        self.read_flags()  # a deferred op that ran earlier comes first
        with self.internal():
            if torch.isfinite(out).all():  # the cheap check's sum overflowed; the values are fine
                if self.records:
                    self.records.forget(out)
                return
            record = self._record_op(func, args, kwargs, out, node, created_seq, intended)
        self.records.put(out, record)
        if record.phase == "backward":
            self.last_backward_record_order = record.order
            return
        if intended:
            return
        if record.phase == "forward" and created_seq is not None:
            self.forward_nonfinite_by_node[created_seq] = record
        if record.has_nan or record.phase == "optimizer" or out.dtype in self.stop_inf_dtypes:
            self._stop(record, "NaN" if record.has_nan else "Inf")

    def _record_op(self, func, args, kwargs, out, node, created_seq, intended) -> Record:
        tensors = list(_named_tensor_args(func, args, kwargs))
        parents, untracked, untracked_parameter = [], False, None
        overwritten = _overwritten_name(func, tensors, out)
        for name, t in tensors:
            if name == overwritten:
                # Its values before the op are gone: only a record says it was bad before.
                parent = self.records.get(t)
                parents += [parent] if parent is not None else []
            elif t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
                parent = self.records.get(t)
                if parent is None:
                    untracked = True
                    untracked_parameter = untracked_parameter or self._parameter_of(t)
                else:
                    parents.append(parent)
        origin = not any(not p.intended for p in parents)
        summary = summarize(out, "output")
        inputs = ([summarize(t, f"{name} (after: overwritten in place)" if name == overwritten else name)
                   for name, t in tensors] if origin else [])
        phase = self.phase(node, args)
        if node is not None:
            seq = node._sequence_nr()
            site = self.sites.get(seq) or (None, None)
            where, module, node_name = site[0], site[1], type(node).__name__
        else:
            seq = created_seq
            where, module, node_name = self.locator.user_frame(3), self.modules.current, None
        record = Record(
            op=op_name(func),
            phase=phase,
            where=where,
            module=module,
            backward_node=node_name,
            node_seq=seq,
            step=self.step if self.optimizer_seen else None,
            output=summary,
            inputs=inputs,
            parents=parents,
            has_nan=summary.nan > 0,
            intended=intended,
            untracked_input=untracked,
            facts=_origin_facts(func, args, kwargs, tensors) if origin else {},
        )
        if "writes_parameter" in record.facts:
            record.facts["parameter"] = self.modules.parameter_name(args[0]) or f"of shape {record.facts['writes_parameter']}"
        if untracked_parameter is not None:
            record.facts["parameter"] = untracked_parameter
            if self.step > 0:
                # Parameters change outside the checked ops only inside optimizer.step(),
                # which is checked at its boundary: a seeded replay that checks each of its
                # ops tells which one made the value.
                record.facts["needs_replay"] = True
                record.facts["written_by_optimizer"] = True
        return record

    # -- deferred ops (accelerators): flags read at boundaries --------------------------

    def defer(self, func, args, out: torch.Tensor, node, created_seq) -> None:
        """Queue a device-side flag for `out` with what names the op later: no sync now."""
        if node is not None:
            seq, node_name, where, module = node._sequence_nr(), type(node).__name__, None, None
        else:
            seq, node_name, module = created_seq, None, self.modules.current
            # An op that built an autograd node has its line in the node sites already.
            where = None if created_seq is not None else self.locator.user_frame(1)
        entry = FlaggedOp(func, self.phase(node, args), out.dtype, seq, node_name, where, module,
                          self.step if self.optimizer_seen else None)
        if self.flags.add(out, entry):
            self.read_flags()

    def read_flags(self) -> None:
        """Read the pending flags (one sync) and apply the same policy as per-op checks:
        a NaN made outside backward stops the run, an Inf is a suspect, and inside backward
        both are suspects until a gradient is still non-finite when backward() returns."""
        if not len(self.flags):
            return
        self.flags_read = True
        with self.internal():
            flagged = self.flags.read()
        for flag in flagged:
            if flag.entry.phase == "backward":
                self.last_backward_record_order = next_order()
                continue
            record = self._flag_record(flag)
            if flag.has_nan or record.phase == "optimizer" or flag.entry.dtype in self.stop_inf_dtypes:
                self._stop(record, "NaN" if flag.has_nan else "Inf")
            if len(self._inf_suspects) < 16:
                self._inf_suspects.append(record)

    def _flag_record(self, flag: Flagged) -> Record:
        """A record of a flagged op: its name, phase, line and module, but not its values
        (freed by now); a seeded replay that checks each op at once recovers those."""
        e = flag.entry
        site = self.sites.get(e.node_seq) if e.node_seq is not None else None
        return Record(
            op=op_name(e.func), phase=e.phase, where=e.where or (site[0] if site else None),
            module=e.module or (site[1] if site else None), backward_node=e.node_name, node_seq=e.node_seq,
            step=e.step, output=None, inputs=[], parents=[], has_nan=flag.has_nan,
            facts={"needs_replay": True, "device_flag": "nan" if flag.has_nan else "inf"},
        )

    def carry(self, args, out) -> None:
        """A view/copy/index of a recorded non-finite tensor carries its record along."""
        source = next((self.records.get(a) for a in args if isinstance(a, torch.Tensor)), None)
        if source is None:
            return
        if isinstance(out, torch.Tensor):
            self.records.put(out, source)
        elif isinstance(out, (tuple, list)):
            for item in out:
                if isinstance(item, torch.Tensor):
                    self.records.put(item, source)

    # -- training boundaries (called by hooks) -----------------------------------------

    def before_backward(self, tensors) -> int:
        """The loss reaches backward(): a non-finite loss stops the run here."""
        self.training_started = True
        self.read_flags()
        with self.internal():
            for t in tensors:
                if not (isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()) or t.is_meta:
                    continue
                if t.numel() == 1:  # the usual scalar loss: one read gives the value and the check
                    value = float(t.detach().item())
                    self._pending_loss = value if self._pending_loss is None else self._pending_loss
                    finite = math.isfinite(value)
                else:
                    finite = all_finite(t)
                if not finite:
                    record = self.records.get(t) or self._bare_record("loss", t, "forward")
                    self._stop(record, "the loss is non-finite")
        return next_order()

    def after_backward(self, roots, started_order: int) -> None:
        """Backward finished: a leaf's gradient that is still non-finite stops the run.

        Only walked when this backward made a non-finite value somewhere (rare): most such
        values are masked inside autograd formulas and never reach a gradient.
        """
        self.read_flags()
        with self.internal():
            if self._backward_suspects_since(started_order):
                for leaf in _leaves(roots):
                    grad = leaf.grad
                    if grad is not None and grad.is_floating_point() and not bool(torch.isfinite(grad).all()):
                        record = self.records.get(grad) or self._bare_record("", grad, "backward")
                        name = self.modules.parameter_name(leaf)
                        record.facts.setdefault("parameter", name)
                        what = f"the gradient of `{name}`" if name else "a gradient"
                        self._stop(record, f"{what} is non-finite after backward()")
            self.sites.new_generation()
            self._forget_old_forward_records()
            self.records.prune()

    def after_grad(self, outputs, started_order: int) -> None:
        """torch.autograd.grad returned: its results are gradients the script holds."""
        self.read_flags()
        with self.internal():
            for g in outputs or ():
                if isinstance(g, torch.Tensor) and not all_finite(g):
                    record = self.records.get(g) or self._bare_record("", g, "backward")
                    self._stop(record, "a gradient returned by torch.autograd.grad is non-finite")
            self.sites.new_generation()

    def _backward_suspects_since(self, order: int) -> bool:
        return self.last_backward_record_order >= order

    def before_optimizer_step(self, optimizer) -> None:
        self.optimizer_seen = True
        self.training_started = True
        self.read_flags()  # ops since backward (gradient clipping, loss scaling)
        if not self.check_optimizer_ops:
            # Off the mode before our own checks too: they then cost no dispatch overhead.
            self._suspend()
        with self.internal():
            grads = [p.grad for group in optimizer.param_groups for p in group["params"]
                     if p.grad is not None and not p.grad.is_meta]
            if grads:
                total = global_norm(grads)
                self._pending_grad_norm = total
                if not math.isfinite(total):
                    self._stop_on_bad_gradient(optimizer)
            if optimizer not in self._optimizers_checked:
                # Once per optimizer: parameters that were non-finite before training
                # (every later change to them is an op the detector checks).
                self._optimizers_checked.add(optimizer)
                self._check_parameters(optimizer)
        self.in_optimizer = True

    def after_optimizer_step(self, optimizer) -> None:
        self.in_optimizer = False
        if not self.check_optimizer_ops:
            with self.internal():
                self._check_update(optimizer)
        self._resume()
        self.step += 1
        self._inf_suspects.clear()
        self.history.add(self.step, self._pending_loss, self._pending_grad_norm)
        self._pending_loss = self._pending_grad_norm = None
        if self.max_steps and self.step >= self.max_steps:
            self.passive = True
            raise StepLimitReached()

    def data_started(self) -> None:
        self.training_started = True
        self.data_depth += 1
        self._suspend()

    def data_finished(self) -> None:
        self.data_depth -= 1
        if not self.data_depth:
            self._resume()

    def check_batch(self, batch, batch_number: int, indices, dataset=None) -> None:
        """A batch out of a DataLoader that is already non-finite stops the run (phase data).

        Data loading runs without the per-op mode (collation is hundreds of small ops, and
        workers run in other processes anyway). When a batch is bad, the bad samples of a
        map-style dataset are fetched again here, under the mode, so an op in `__getitem__`
        that made the NaN (`mask / mask.max()`) is found with its line; otherwise the
        batch itself is reported.
        """
        with self.internal():
            for path, t in _tensors_in(batch):
                if not all_finite(t):
                    facts = _batch_facts(t, path, batch_number, indices)
                    self._refetch(dataset, facts.get("dataset_indices"))
                    record = self.records.get(t) or self._bare_record("", t, "data")
                    record.facts.update(facts)
                    self._stop(record, f"batch {batch_number} from the DataLoader is non-finite")

    def _refetch(self, dataset, indices) -> None:
        if dataset is None or not indices or not hasattr(dataset, "__getitem__"):
            return
        self.data_depth += 1
        self.passive = False
        self._resume()
        try:
            for index in indices:
                dataset[index]  # a NaN made here stops the run with its op and line
        except NonFiniteFound:
            raise
        except Exception:  # noqa: BLE001 - refetching is best effort; the batch is reported anyway
            pass
        finally:
            self.passive = True
            self.data_depth -= 1

    def _check_update(self, optimizer) -> None:
        """After optimizer.step(): one reduction over the parameters it may have changed.
        A non-finite one stops the run; a seeded replay then finds the op inside the step."""
        params = [p for g in optimizer.param_groups for p in g["params"] if p.is_floating_point() and not p.is_meta]
        if not params or math.isfinite(global_norm(params)):
            return
        for p in params:
            if not bool(torch.isfinite(p).all()):
                record = self._bare_record("", p, "optimizer")
                record.facts["parameter"] = self.modules.parameter_name(p) or _param_name(optimizer, p)
                record.facts["optimizer"] = type(optimizer).__name__
                record.facts["needs_replay"] = True
                self._stop(record, f"optimizer.step() ({type(optimizer).__name__}) made a parameter non-finite")

    # -- stopping and the result ---------------------------------------------------------

    def _check_parameters(self, optimizer) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.is_floating_point() and not p.is_meta and not bool(torch.isfinite(p).all()):
                    record = self.records.get(p) or self._bare_record("", p, "init" if not self.step else "optimizer")
                    record.facts.setdefault("parameter", self.modules.parameter_name(p) or _param_name(optimizer, p))
                    record.facts.setdefault("parameter_before_step", True)
                    self._stop(record, "a parameter is non-finite before the optimizer step")

    def _stop_on_bad_gradient(self, optimizer) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
                    record = self.records.get(p.grad) or self._bare_record("", p.grad, "backward")
                    record.facts.setdefault("parameter", self.modules.parameter_name(p) or _param_name(optimizer, p))
                    self._stop(record, "a gradient is non-finite before the optimizer step")

    def _parameter_of(self, t: torch.Tensor) -> str | None:
        """The name of the parameter `t` is (or is a view of), if it is one."""
        for candidate in (t, t._base):
            if isinstance(candidate, torch.nn.Parameter):
                return self.modules.parameter_name(candidate) or f"a parameter of shape {tuple(candidate.shape)}"
        return None

    def _bare_record(self, op: str, t: torch.Tensor, phase: str) -> Record:
        """A record for a non-finite tensor no op of which was seen being made."""
        return Record(
            op=op, phase=phase, where=self.locator.user_frame(2), module=self.modules.current,
            backward_node=None, node_seq=None, step=self.step if self.optimizer_seen else None,
            output=summarize(t, "value"), inputs=[], parents=[],
            has_nan=bool(torch.isnan(t).any()), untracked_input=True,
        )

    def _forget_old_forward_records(self) -> None:
        if len(self.forward_nonfinite_by_node) > 1024:
            for key in sorted(self.forward_nonfinite_by_node)[:-512]:
                del self.forward_nonfinite_by_node[key]

    def _stop(self, event: Record, reason: str) -> None:
        if self.flags_read and not event.inputs and "device_flag" not in event.facts:
            # Found at a boundary in a run checked by device flags, which keep no lineage:
            # a replay that checks each op at once finds the op; until then, the Infs the
            # flags saw this step are the candidates.
            event.facts["needs_replay"] = True
            if self._inf_suspects:
                event.facts["flagged_inf_ops"] = [self._describe(r) for r in self._inf_suspects]
        self.passive = True
        self.detection = self._explain(event, reason)
        raise NonFiniteFound(reason)

    def _describe(self, r: Record) -> str:
        where = self.locator.location(r.where)
        return f"{r.op} at {where.file}:{where.line}" if where else r.op

    def _explain(self, event: Record, reason: str) -> Detection:
        chain = [event]
        while True:
            parents = [p for p in chain[-1].parents if not p.intended and p not in chain]
            if not parents:
                break
            chain.append(min(parents, key=lambda r: r.order))
        root = chain[-1]
        # A backward op whose own forward op already made an Inf (divide first, mask
        # afterwards): the forward op is the earlier ancestor.
        if root.phase == "backward" and root.node_seq is not None:
            forward = self.forward_nonfinite_by_node.get(root.node_seq)
            if forward is not None:
                forward.facts["gradient_leak_through"] = root.backward_node
                chain.append(forward)
                root = forward
        intended = next((p for p in root.parents if p.intended), None)
        if intended is not None:
            # The root consumed an Inf written on purpose (a -inf mask): say where it was.
            where = self.locator.location(intended.where)
            root.facts.setdefault("inf_from", f"{where} (`{where.code}`)" if where else intended.op)
        chain.reverse()
        sites = [self._site(r) for r in chain]
        event_site = sites[-1]
        event_site.reason = reason
        return Detection(event=event_site, root=sites[0], lineage=sites)

    def _site(self, r: Record) -> OpSite:
        return OpSite(
            op=r.op, phase=r.phase, location=self.locator.location(r.where), module=r.module,
            backward_node=r.backward_node, output=r.output, inputs=list(r.inputs), step=r.step,
            facts=dict(r.facts, untracked_input=r.untracked_input) if r.untracked_input else dict(r.facts),
        )

    def history_report(self) -> History:
        return self.history.as_report()


def _overwritten_name(func, tensors, out) -> str | None:
    """The argument an in-place op wrote its result into (`self` of `log_`), if any."""
    if not is_inplace(func):
        return None
    key = storage_key(out)
    return next((name for name, t in tensors if storage_key(t) == key), None)


def _origin_facts(func, args, kwargs, tensors) -> dict[str, Any]:
    """Facts about the op that made a non-finite value, for the diagnosis rules: the op's
    own (CTC lengths, ...) and which autograd op produced each input (a softmax, a std)."""
    facts = collect_facts(func, args, kwargs)
    if args and isinstance(args[0], torch.nn.Parameter) and func._schema.name.endswith("copy_"):
        facts["writes_parameter"] = f"{tuple(args[0].shape)}"
    producers = {name: type(t.grad_fn).__name__ for name, t in tensors if t.grad_fn is not None}
    if producers:
        facts["input_producers"] = producers
    return facts


def global_norm(tensors: list[torch.Tensor]) -> float:
    """The 2-norm over all `tensors`: non-finite iff some element is. One reduction per
    tensor in their own dtype; only if that overflows is it recomputed in float64, so a
    finite float32 gradient never reads as Inf."""
    total = float(torch.linalg.vector_norm(torch.stack([n.float() for n in torch._foreach_norm(tensors)])).item())
    if not math.isfinite(total):
        total = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float64))).item())
    return total


def _leaves(roots):
    """The leaf tensors (parameters, inputs with requires_grad) reachable from `roots`."""
    stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if variable is not None:
            yield variable
        stack.extend(fn for fn, _ in node.next_functions)


def _builds_graph(args) -> bool:
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


def _named_tensor_args(func, args, kwargs):
    """(ATen argument name, tensor) for each tensor input, lists included (`tensors[1]`)."""
    names = [a.name for a in func._schema.arguments]
    for i, value in enumerate(args):
        name = names[i] if i < len(names) else f"arg{i}"
        yield from _tensors_named(name, value)
    for name, value in kwargs.items():
        yield from _tensors_named(name, value)


def _tensors_named(name: str, value: Any):
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, (list, tuple)):
        for j, item in enumerate(value):
            if isinstance(item, torch.Tensor):
                yield f"{name}[{j}]", item


def _tensors_in(batch, path: str = ""):
    """(path, tensor) for every tensor in a nested batch: `[1]`, `['mask']`, `[0][2]`."""
    if isinstance(batch, torch.Tensor):
        yield path or "batch", batch
    elif isinstance(batch, dict):
        for k, v in batch.items():
            yield from _tensors_in(v, f"{path}[{k!r}]")
    elif isinstance(batch, (list, tuple)):
        for i, v in enumerate(batch):
            yield from _tensors_in(v, f"{path}[{i}]")


def _batch_facts(t: torch.Tensor, path: str, batch_number: int, indices) -> dict[str, Any]:
    bad_rows = (~torch.isfinite(t)).reshape(t.shape[0], -1).any(dim=1).nonzero().flatten().tolist() if t.dim() else []
    facts: dict[str, Any] = {"batch": batch_number, "key": path, "rows": bad_rows[:20]}
    if indices is not None:
        try:
            facts["dataset_indices"] = [int(indices[i]) for i in bad_rows[:20]]
        except (IndexError, TypeError, ValueError):
            pass
    return facts


def _param_name(optimizer, p) -> str:
    for gi, group in enumerate(optimizer.param_groups):
        for pi, q in enumerate(group["params"]):
            if q is p:
                return f"param_groups[{gi}].params[{pi}] {tuple(p.shape)}"
    return "a parameter"
