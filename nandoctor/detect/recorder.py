"""Records of non-finite values, written on the rare path only.

When an op's output is non-finite (or a boundary finds a value non-finite), the recorder
writes down what a report will need while the tensors are still live: the op, phase,
user frame, module, exact summaries of its inputs and output, the records of its
non-finite inputs (its parents, for the lineage) and typed facts (which parameter, the
op's own facts). Nothing here decides whether to stop; see `policy.py`.
"""
from __future__ import annotations

import collections
import linecache
import math
import re
import threading
from typing import Any, Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from nandoctor.detect.mode import all_finite, checkable
from nandoctor.detect.op_facts import collect_op_facts
from nandoctor.detect.numpy_warnings import NumpyWarnings
from nandoctor.detect.ops import base_name, is_inplace, op_name
from nandoctor.detect.provenance import ModuleTracker, NodeSites, SourceLocator
from nandoctor.detect.records import Record, RecordTable, lineage_of, storage_key, tensors_of
from nandoctor.detect.allow import Allowances
from nandoctor.detect.result import OVERWRITTEN_SUFFIX, Discarded, ParameterRef, SiteFacts
from nandoctor.detect.state import TrainingState
from nandoctor.stats import TensorSummary, summarize, summarize_number

# Distinct sites whose discarded non-finite values are counted for the report.
MADE_SITES_KEPT = 64


class Recorder:
    def __init__(self, state: TrainingState, locator: SourceLocator, modules: ModuleTracker,
                 sites: NodeSites, records: RecordTable, allowances: Allowances | None = None) -> None:
        self.state = state
        self.allowances = allowances or Allowances()
        self.numpy_warnings: NumpyWarnings | None = None  # set by the detector that installs it
        # Where the script made the optimizer whose step is running: (code, line) or None.
        self.optimizer_made_at: Callable[[], tuple | None] = lambda: None
        self.watched_thread = threading.get_ident()  # the thread whose ops the dispatch mode sees
        # The last backward left the nodes that can only overflow unhooked (nodes.py): a
        # non-finite parameter gradient no record names was made there.
        self.gradients_left_to_the_step = False
        # (op, user frame) -> [count, made a NaN, allowed]: every birth of a non-finite value,
        # for the report of a run in which none of them mattered.
        self._made: dict[tuple, list] = {}
        self._births: collections.deque[Record] = collections.deque(maxlen=64)  # the latest births
        self.first_nan_birth: Record | None = None  # the first NaN made, accepted lines aside
        self.locator = locator
        self.modules = modules
        self.sites = sites
        self.records = records
        # Forward records by the autograd node their op created: a backward root whose own
        # forward op already made an Inf has that op as its earlier ancestor.
        self.forward_by_node: dict[int, Record] = {}
        # ...and the latest forward record of each line: a backward op that got a non-finite
        # value no record covers (made inside a region or a fused kernel) came from there.
        self.forward_by_line: dict[tuple, Record] = {}
        self.last_backward_order = -1  # order of the latest non-finite value made in backward
        self.latest_backward: Record | None = None  # ...and its record, in the backward running
        # Trained leaves (parameters) holding a non-finite value made by accident, that an op
        # made finite values of (softplus(-inf) = 0): leaf -> the record of its value.
        self.absorbed_leaves = WeakIdKeyDictionary()

    def op(self, func, args, kwargs, out: torch.Tensor, node, created_seq, intended: bool,
           before: torch.Tensor | None = None) -> Record:
        """The record of an op whose output `out` is non-finite; `before` is the in-place
        op's `self` as it was before the op, when the hot path could keep a copy."""
        named = list(_named_inputs(func, args, kwargs))
        tensors = [(name, v) for name, v in named if isinstance(v, torch.Tensor)]
        overwritten = _overwritten_name(func, tensors, out)
        parents, facts = self._parents(tensors, overwritten, before)
        if self.absorbed_leaves and node is None and not intended and all(p.intended for p in parents):
            parents += self._absorbed_leaves_behind(tensors, parents)  # (a birth from finite values)
        if parents and all(p.intended for p in parents) and base_name(func) == "copy_":
            if args[0]._base is not None and not _a_mask_being_built(args[0]):
                # An infinity written into data (`X[7, 3] = float("inf")` in a table of
                # values): data that holds an Inf from outside torch, not a sentinel passed on.
                parents, facts.untracked_input = [], True
            else:
                # Copied whole into a tensor of its own (load_state_dict copying a buffer of
                # bin edges): a copy of a sentinel is the sentinel.
                intended = True
        if intended and any(not p.intended for p in parents) and _accidents_survive_the_fill(args, kwargs, out):
            intended = False  # the -inf went on purpose into values made by accident, which it left in place
        facts.written_on_purpose = intended
        origin = not any(not p.intended for p in parents)
        inputs = [_summary(name, value, name == overwritten, before) for name, value in named] if origin else []
        if origin:
            _add_origin_facts(facts, func, args, kwargs, tensors)
            # (a mask's -inf summed, averaged or multiplied, not passed on: see passed_on_intended)
            facts.combined_written_inf = any(p.facts.written_on_purpose for p in parents) \
                and _uses_entries_as_numbers(func, args)
            if facts.loads_parameter or (func._schema.name.endswith("copy_") and self._is_buffer(args[0])):
                # (load_state_dict copies into parameters and buffers: a BatchNorm's running_var)
                facts.loads_parameter, facts.parameter = True, self.parameter_ref(args[0])
        if node is not None:
            seq = node._sequence_nr()
            where, module = self.sites.get(seq) or (None, None)
            # Code the user wrote inside backward (a custom Function, a hook) is its own line.
            own = self.locator.user_frame_inside_backward(2)
            if own is not None:
                where, facts.user_backward = own, True
            node_name = type(node).__name__
        else:
            seq, where, module, node_name = created_seq, self.locator.user_frame(3), self.modules.current, None
            facts.called_in = self.locator.location(self.locator.library_frame(3))
        written = self._written_parameter(func, args, kwargs)
        if written is not None:
            facts.writes_parameter = True
            facts.parameter = facts.parameter or written
        output = summarize(out, "output")
        if origin and not intended and (_an_extreme_fill_overflowed(inputs, output)
                                        or _a_sentinel_mask_overflowed(tensors, out)):
            intended = facts.written_on_purpose = facts.mask_overflowed = True
        phase = self.phase(node, args)
        facts.own_optimizer = phase == "optimizer" and self.locator.in_own_optimizer()
        if phase == "optimizer" and node is None and not facts.own_optimizer and not _calls_a_step(where):
            made = self.optimizer_made_at()
            if made is not None:
                # A framework's loop called step() (`trainer.fit(model)` is the script's
                # innermost line): the line that made the optimizer holds its settings.
                where, facts.optimizer_made_here = made, True
        if phase == "forward" and module is None and _updates_weight_by_hand(func, args, self.state.grad_enabled()):
            phase, facts.own_optimizer = "optimizer", True
        record = Record(
            op=op_name(func), phase=phase, where=where, module=module,
            backward_node=node_name, node_seq=seq, step=self.state.step_or_none, output=output, inputs=inputs,
            parents=parents, has_nan=output.nan > 0, intended=intended, facts=facts,
        )
        if origin and not intended and (record.phase != "backward" or facts.user_backward):
            # A birth: count it, and treat a value made on an allowed line as intended.
            record.intended = self.allowances.accepts(record.op, where)
            self.count_made(record)
            self._births.append(record)
        if record.phase == "backward":
            self.last_backward_order, self.latest_backward = record.order, record
        elif record.phase == "forward" and not intended:
            if created_seq is not None:
                self.forward_by_node[created_seq] = record
            if where is not None:
                self.forward_by_line[where] = record
        return record

    def node_output(self, node, t: torch.Tensor) -> Record:
        """The record of a non-finite gradient an autograd node gave, when running the node
        again op by op could not tell which of its ops made it (see nodes.py)."""
        seq = node._sequence_nr()
        where, module = self.sites.get(seq) or (None, None)
        output = summarize(t, "output")
        record = Record(op="", phase="backward", where=where, module=module, backward_node=type(node).__name__,
                        node_seq=seq, step=self.state.step_or_none, output=output, inputs=[],
                        parents=[self.latest_backward] if self.latest_backward is not None else [],
                        has_nan=output.nan > 0)
        self.last_backward_order, self.latest_backward = record.order, record
        return record

    def link_untracked(self, gradients) -> None:
        """Gradients the engine summed before a node (its mode off: see nodes.py) reach it
        with no record; a non-finite one came from the latest non-finite gradient made in
        this backward, the record it takes (for the lineage)."""
        if self.latest_backward is None:
            return
        for g in gradients:
            if isinstance(g, torch.Tensor) and (g.is_floating_point() or g.is_complex()) and self.records.get(g) is None \
                    and not all_finite(g):
                self.records.put(g, self.latest_backward)

    def made_out_of_sight(self, gradients) -> None:
        """Gradients that reach a checked node non-finite with no record, none made before
        in this backward to link them to: in a backward that left nodes unhooked to the
        step's check (see nodes.py, `_LEFT_TO_THE_STEP`), one of those made them. Each gets
        a record of that, with no op: the stop it leads to asks for the replay, which
        checks backward op by op."""
        if not self.gradients_left_to_the_step:
            return
        for g in gradients:
            if isinstance(g, torch.Tensor) and (g.is_floating_point() or g.is_complex()) and self.records.get(g) is None \
                    and not all_finite(g):
                self._out_of_sight(g)

    def _a_gradient_made_out_of_sight(self, t: torch.Tensor) -> bool:
        """Is `t`, non-finite with no record, a gradient the last backward made in a node
        left to the step's check (nodes.py)? Read by the script's own code inside backward
        (a tensor hook, a custom Function), or as a parameter's .grad after it (`p.grad /=
        scale`, printed, clipped). On the rare path only: it looks at every parameter."""
        return self.gradients_left_to_the_step and (torch._C._current_graph_task_id() != -1
                                                    or self.modules.holds_gradient([t]))

    def _out_of_sight(self, g: torch.Tensor) -> Record:
        output = summarize(g, "output")
        record = Record(op="", phase="backward", where=None, module=None, backward_node=None, node_seq=None,
                        step=self.state.step_or_none, output=output, inputs=[], parents=[],
                        has_nan=output.nan > 0, facts=SiteFacts(made_out_of_sight=True))
        self.last_backward_order, self.latest_backward = record.order, record
        self.records.put(g, record)
        return record

    def passed_on_intended(self, func, args, kwargs, out: torch.Tensor) -> Record | None:
        """The record of a value written on purpose (a -inf mask, `written_on_purpose`) that
        this op only passed on, or None when the op may have made something of its own.

        `scores + mask` (SDPA adds a float attention mask to the scores), `mask * 2`, a sum
        over a masked row, `-logp.mean()` over masked log-probabilities: every non-finite
        input is an intended record and the output holds no NaN. Such an output is the
        mask again, its sign flipped or not, not a birth: it carries the mask's record, as a
        view would, and costs one reduction instead of a record's exact statistics (every
        step of a model with a causal mask). A NaN (an all -inf row through softmax,
        `-inf - (-inf)`) or a non-finite input with no record is a birth, recorded. (Should
        the mask itself reach the loss, the report's root is where it was written.)
        `c[i, j] = float("-inf")` into a `torch.zeros` matrix, a constraint matrix written
        entry by entry, is a `copy_` of a one-infinity sentinel into a mask being built: it
        passes the sentinel on. The same write into data (`X[7, 3] = inf` in a random or
        loaded table) makes data that holds an Inf. Into a parameter or buffer while the
        model is built (`self.trans[O, I] = float("-inf")` under no_grad: a CRF's forbidden
        transition) it is a constant of the model, whatever its other values are."""
        source = None
        passed = args
        if base_name(func) == "copy_":
            if not (_a_mask_being_built(args[0]) or self._a_model_constant_written(args[0])):
                return None
            passed = args[1:]  # (copy_ overwrites `self`: only what it copies is passed on)
        for t in tensors_of((*passed, *kwargs.values())):
            record = self.records.get(t)
            if record is None:
                if not (t.is_floating_point() or t.is_complex()) or all_finite(t):
                    continue
                if storage_key(t) == storage_key(out):
                    return None  # an in-place op's own input: it holds what the op just made
                record = self.bare("", t, self.phase(None, ()))  # a sentinel no op was seen writing?
                if not record.intended:  # (no: a value from outside)
                    return None
                self.records.put(t, record)
            if not record.facts.written_on_purpose or record.output is None or record.output.nan:
                return None  # (a value made on an allowed line is accepted there, not a mask)
            source = source or record
        if source is None or bool(torch.isnan(out).any()):
            return None
        if _uses_entries_as_numbers(func, args) or base_name(func).rstrip("_") in _MAPS_MINUS_INF_TO_FINITE:
            return None
        return source

    def _a_model_constant_written(self, dest: torch.Tensor) -> bool:
        """Is `dest` (a view just written) part of a parameter or buffer of a model being
        built (its `__init__`, or between the model's making and its first call)?"""
        whole = dest._base if dest._base is not None else dest
        named = self._parameter_of(whole) is not None or self.modules.parameter_name(whole) is not None
        return named and self.phase(None, (whole,)) == "init"

    def phase(self, node, args) -> str:
        """The phase of an op running now (see TrainingState.phase). Between `backward()`
        and the step, an op on a parameter's gradient (a hand-written normalisation or
        clipping of `p.grad`) works on what backward made: backward, not forward."""
        phase = self.state.phase(node, args, self.modules.current, self.modules.building,
                                 self.locator.preparing_data, loading=bool(self.modules.loading_state),
                                 model_ran=lambda: self.modules.ran, in_training_loop=self.locator.in_training_loop)
        if phase == "forward" and self.state.backward_started and self.modules.holds_gradient(tensors_of(args)):
            return "backward"
        return phase

    def _parents(self, tensors, overwritten: str | None, before) -> tuple[list[Record], SiteFacts]:
        """The records of the non-finite inputs; an input non-finite with no record came
        from outside the checked ops (data, a parameter changed inside optimizer.step())."""
        parents: list[Record] = []
        facts = SiteFacts()
        for name, t in tensors:
            if name == overwritten and before is None:
                # Its values before the op are gone: only a record says it was bad before.
                parents += self.records.all_of(t)
                continue
            value = before if name == overwritten else t
            if checkable(value) and value.numel() and not bool(torch.isfinite(value).all()):
                # (Every record of what it covers: slices of it written separately.)
                recorded = self.records.all_of(t)
                if recorded:
                    parents += recorded
                    continue
                if self._a_gradient_made_out_of_sight(t):
                    parents.append(self._out_of_sight(t))
                    continue
                facts.untracked_input = True
                if facts.parameter is None:
                    facts.parameter = self._parameter_of(t)
        if facts.parameter is not None and self.state.step > 0:
            # Parameters change outside the checked ops only inside optimizer.step(), which
            # is checked at its boundary: a seeded replay that checks each of its ops tells
            # which one made the value.
            facts.written_by_optimizer = True
        return parents, facts

    def _written_parameter(self, func, args, kwargs) -> ParameterRef | None:
        """The parameter or buffer this op wrote a non-finite value into, if any (an in-place
        op on it, `load_state_dict`'s copy_, BatchNorm's running statistics)."""
        for i, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            t = args[i] if i < len(args) else kwargs.get(argument.name)
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                continue
            ref = self._parameter_of(t)
            if ref is None and self.modules.parameter_name(t) is not None:
                ref = self.parameter_ref(t)  # a buffer (running_mean)
            if ref is not None and not bool(torch.isfinite(t).all()):
                return ref
        return None

    def first_birth_since(self, order: int) -> Record | None:
        """The earliest non-finite value born after `order` (not one written on purpose)."""
        return next((r for r in self._births if r.order > order and not r.intended), None)

    def count_made(self, record: Record) -> None:
        """One more non-finite value born at this record's op and line."""
        if record.has_nan and not record.intended and self.first_nan_birth is None:
            self.first_nan_birth = record
        key = (record.op, record.where)
        entry = self._made.get(key)
        if entry is None:
            if len(self._made) >= MADE_SITES_KEPT:
                return
            entry = self._made[key] = [0, False, record.intended]
        entry[0] += 1
        entry[1] = entry[1] or record.has_nan

    def discarded(self) -> list[Discarded]:
        """Every site that made non-finite values, most frequent first (for a run in which
        none of them mattered)."""
        made = sorted(self._made.items(), key=lambda item: -item[1][0])
        return [Discarded(op, self.locator.location(where), "nan" if nan else "inf", count, allowed)
                for (op, where), (count, nan, allowed) in made]

    def bare(self, op: str, t: torch.Tensor, phase: str) -> Record:
        """A record for a non-finite value no op of which was seen being made. One that holds
        one infinity and nothing else is a sentinel written on purpose, wherever it comes
        from (`torch.tensor(float("inf"))`, a `best` buffer loaded from a checkpoint, a
        running-min buffer in a `deepcopy` of the model): it carries no data. So is a mask:
        one infinity among copies of one constant (a causal mask built with numpy,
        `np.triu(np.full((n, n), -np.inf), 1)`, or loaded as a buffer from a checkpoint)."""
        output = summarize(t, "value")
        sentinel = _one_infinity_only(output) or _a_mask(output)
        unwatched = self._unwatched_thread()
        return Record(
            op=op, phase=phase, where=self.locator.user_frame(2), module=self.modules.current,
            backward_node=None, node_seq=None, step=self.state.step_or_none,
            output=output, inputs=[], parents=[], has_nan=output.nan > 0, intended=sentinel,
            facts=SiteFacts(untracked_input=not sentinel and unwatched is None, written_on_purpose=sentinel,
                            unwatched_thread=None if sentinel else unwatched),
        )

    def _unwatched_thread(self) -> str | None:
        """The name of this thread when the dispatch mode does not see its ops: a script
        that trains on a thread of its own (the autograd engine's threads are seen: they run
        a backward with the mode of the thread that started it)."""
        if threading.get_ident() == self.watched_thread or torch._C._current_graph_task_id() != -1:
            return None
        return threading.current_thread().name

    def latest_birth(self) -> Record | None:
        """The non-finite value made most recently (accepted lines and masks aside)."""
        return next((r for r in reversed(self._births) if not r.intended), None)

    def entering_phase(self) -> str:
        """The phase of a value entering torch from outside (`from_numpy`, `torch.tensor`):
        data, as a batch that arrived non-finite is, unless a module's forward or its
        set-up made it."""
        phase = self.phase(None, ())
        return "data" if phase == "forward" and self.modules.current is None else phase

    def entered(self, op: str, t: torch.Tensor, phase: str) -> Record:
        """The record of a value that entered torch non-finite: a birth, from outside, unless
        it holds one infinity and nothing else. `torch.tensor(float("inf"))` as the best loss
        so far, `-inf` to start a running max: such a value carries no data, it is a sentinel
        written on purpose, as `torch.full((), float("inf"))` is (see `bare`); so are values
        the line building the tensor types itself (below). (Data with a bad value in it has
        finite values around it: a NaN typed or parsed among them is a missing measurement.)"""
        record = self.bare(op, t, phase)
        record.facts.entered = True
        if not record.intended and (_types_a_nonfinite_value(record.where) and
                                    (record.output.nan == 0 or _nothing_finite(record.output)) or _open_bounds(t)):
            # Bounds and constraints typed at the line that builds the tensor (`lower =
            # torch.tensor([0.0, -inf])`, `torch.tensor([1.0, math.inf])`), a NaN for "no
            # value yet" (`ema = torch.tensor(float("nan"))`): written on purpose. (A NaN
            # typed among finite values is a missing measurement: data.) So are sorted bin
            # edges open at their ends, wherever they were typed (`EDGES = [-inf, 13, 20, inf]`).
            record.intended = record.facts.written_on_purpose = True
            record.facts.untracked_input = False
        if record.intended:
            return record
        warned = self.numpy_warnings.made(record.has_nan, record.step) if self.numpy_warnings is not None else None
        if warned is not None:
            # numpy made it and warned at the script's line (`feats = np.log(raw)`): that
            # line is the one to change, not the one that wrapped the array.
            record.where, record.facts.made_by_numpy = warned.where, warned.message
        self.count_made(record)
        self._births.append(record)
        return record

    def exported(self, t: torch.Tensor, name: str, source: Record) -> Record:
        """The parameter or buffer `name` a `state_dict()` handed out, holding what `source`
        made: a record of its own (the stop's event) whose parent is `source`."""
        output = summarize(t, "value")
        return Record(
            op="", phase=self.phase(None, ()), where=self.locator.user_frame(2), module=None,
            backward_node=None, node_seq=None, step=self.state.step_or_none, output=output, inputs=[],
            parents=[source], has_nan=output.nan > 0, facts=SiteFacts(parameter=ParameterRef(name, tuple(t.shape))),
        )

    def existing_or_bare(self, t: torch.Tensor, op: str, phase: str) -> Record:
        record = self.records.get(t)
        if record is None and self._a_gradient_made_out_of_sight(t):
            return self._out_of_sight(t)
        return record or self.bare(op, t, phase)

    def carry(self, args, out) -> None:
        """A view/copy/index of a recorded non-finite tensor carries its record along. Of
        several (`cat`, `stack`), a value made by accident before one written on purpose
        (the NaN of a softmax over a fully masked row, concatenated with a -inf max-pool of
        the same empty sequence), the first made of them."""
        recorded = [r for r in map(self.records.get, tensors_of(args)) if r is not None]
        if not recorded:
            return
        made = [r for r in recorded if not r.intended]
        source = min(made, key=lambda r: r.order) if made else recorded[0]
        if _selects_by_mask(args) and isinstance(out, torch.Tensor) and all_finite(out):
            _mark_births(source, "masked")  # `snr[~torch.isnan(snr)]`: the non-finite values were left out
            return
        for item in (out,) if isinstance(out, torch.Tensor) else out if isinstance(out, (tuple, list)) else ():
            if isinstance(item, torch.Tensor):
                self.records.put(item, source)

    def absorbed(self, inputs: list[tuple[torch.Tensor, Record]]) -> None:
        """An op took recorded non-finite values (`inputs`: each with its record) and made
        only finite ones (`exp(-inf)` is 0, `x / inf` is 0): the forward went on finite, but
        backward still multiplies by the Inf (`exp(w * log(0))`'s gradient for w is
        0 * -inf). Said on the births the values came from, for the gradient-leak diagnosis
        (see lineage.py). An input the record only covers in part (a finite slice of it)
        absorbed nothing."""
        for t, record in inputs:
            if not all_finite(t):
                _mark_births(record, "absorbed")

    def absorbed_leaves_seen(self, inputs: list[tuple[torch.Tensor, Record]]) -> None:
        """Of the inputs an op absorbed, the trained leaves (a parameter made -inf while the
        model was built: `nn.Parameter(inv_softplus(0.0))`): kept, so a value born later from
        finite inputs that came from one (`log(softplus(raw) ** 2)`, log(0)) names it."""
        for t, record in inputs:
            if t.is_leaf and t.requires_grad and not record.intended and not all_finite(t):
                self.absorbed_leaves[t] = record

    def _absorbed_leaves_behind(self, tensors, parents: list[Record]) -> list[Record]:
        """The records of absorbed leaves (see `absorbed_leaves_seen`) that the autograd
        graph of `tensors` reaches: the finite values this op made non-finite came from them.
        On the rare path only: a walk of the graph, at most `_GRAPH_NODES_WALKED` nodes."""
        found: list[Record] = []
        seen: set = set()
        stack = [t.grad_fn for _, t in tensors if t.grad_fn is not None]
        while stack and len(seen) < _GRAPH_NODES_WALKED:
            fn = stack.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            leaf = getattr(fn, "variable", None)  # (an AccumulateGrad node: the leaf it feeds)
            if leaf is not None:
                record = self.absorbed_leaves.get(leaf)
                if record is not None and record not in parents and record not in found and not all_finite(leaf):
                    found.append(record)
                continue
            stack.extend(next_fn for next_fn, _ in fn.next_functions)
        return found

    def replaced(self, inputs: list[tuple[torch.Tensor, Record]]) -> None:
        """A guard of the script's (`nan_to_num`) replaced recorded non-finite values with
        finite ones: dropped on purpose, as a `where` drops them (`masked`), so a NaN that
        backward still makes through them is a masked leak, fixed before the op."""
        for t, record in inputs:
            if not all_finite(t):
                _mark_births(record, "masked")

    def absorbed_in_place(self, args, out: torch.Tensor) -> None:
        """An in-place math op made finite values of recorded non-finite ones, over them (a
        GRU's `sigmoid_` of +inf is 1). Nothing of the script's dropped them: where they
        were made, they were absorbed, not masked; and the tensor holds none now."""
        whole = out._base if out._base is not None else out
        if not whole.is_floating_point() or whole.is_meta or not bool(torch.isfinite(whole).all()):
            self.filled(args, out)  # (some are left: the record carries on, as a fill's)
            return
        sources = [r for r in (self.records.get(t) for t in tensors_of(args)) if r is not None and not r.intended]
        self.records.forget(out)
        for source in sources:
            _mark_births(source, "absorbed")

    def filled(self, args, out: torch.Tensor) -> None:
        """A fill, `where`, clamp or maximum touched recorded values: a non-finite output
        carries the record on (a made value before one written on purpose: `maximum` of a
        running max that starts at -inf passes the sentinel on); a finite one dropped them."""
        recorded = [r for r in (self.records.get(t) for t in tensors_of(args)) if r is not None]
        sources = [r for r in recorded if not r.intended]
        if not recorded:
            return
        whole = out._base if out._base is not None else out  # a fill of x[0] leaves the rest of x
        if whole.is_floating_point() and not whole.is_meta and not bool(torch.isfinite(whole).all()):
            candidates = sources or recorded
            if not bool(torch.isnan(whole).any()):  # what it kept is an Inf: not a NaN it dropped
                candidates = [r for r in candidates if not _nan_only(r)] or candidates
            self.records.put(out, candidates[0])
            return
        if not sources:
            return
        self.records.forget(out)  # (an in-place fill overwrote every bad value)
        for source in sources:
            _mark_births(source, "masked")

    def parameter_ref(self, p: torch.Tensor, optimizer=None) -> ParameterRef:
        """`p` by name when known, else by its place in `optimizer.param_groups`."""
        group = index = None
        if optimizer is not None:
            group, index = _position(optimizer, p)
        buffer = not isinstance(p, torch.nn.Parameter)
        trained = buffer or p.requires_grad
        return ParameterRef(self.modules.parameter_name(p), tuple(p.shape), group, index, trained, buffer)

    def _is_buffer(self, t) -> bool:
        """A floating tensor a module registered as a buffer (it has a name; no Parameter)."""
        return isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter) and t.is_floating_point() \
            and self.modules.parameter_name(t) is not None

    def _parameter_of(self, t: torch.Tensor) -> ParameterRef | None:
        """The parameter `t` is (or is a view of), if it is one."""
        for candidate in (t, t._base):
            if isinstance(candidate, torch.nn.Parameter):
                return self.parameter_ref(candidate)
        return None

    def new_generation(self) -> None:
        """A backward finished: forget forward records of graphs long gone (bounded memory)."""
        self.latest_backward = None
        if len(self.forward_by_line) > 1024:
            self.forward_by_line.clear()
        if len(self.forward_by_node) > 1024:
            for key in sorted(self.forward_by_node)[:-512]:
                del self.forward_by_node[key]
        self.records.prune()


def _nan_only(record: Record) -> bool:
    """Did the record's op make NaN and no Inf? (`torch.logdet` builds a NaN for a negative
    determinant and a `where` keeps slogdet's -inf instead, for a zero one.)"""
    out = record.output
    return out is not None and out.nan > 0 and not out.posinf and not out.neginf


def _mark_births(record: Record, fact: str) -> None:
    """The values of `record` were dropped (`masked`: by a `where`, `masked_fill`, an
    index_put of 0) or made finite (`absorbed`): say so on the births they came from, for
    the gradient-leak diagnosis."""
    for r in lineage_of(record, follows=lambda parent: not parent.intended):
        if all(p.intended for p in r.parents):
            setattr(r.facts, fact, True)


_GRAPH_NODES_WALKED = 4096

# A tensor larger than this is data, not a mask written entry by entry.
_MASK_BUILT_BY_HAND = 1 << 16


# Ops that combine many entries into one number: a mask's -inf summed, averaged or
# multiplied into a product with other entries is used as a number, where the mask was
# meant to vanish (softmax, max, logsumexp, `where`). Label smoothing's `-log_softmax(x).sum()`
# over a -inf masked vocabulary, `(masked @ v)`: the output is the op's, born at its line.
_REDUCES_ENTRIES = frozenset((
    "sum", "mean", "nansum", "nanmean", "prod", "cumsum", "cumprod", "mm", "bmm", "matmul", "dot", "vdot", "mv",
    "linalg_vector_norm", "norm", "std", "var", "std_mean", "var_mean", "trace",
))
# ...and ops that add their first input to a product of the others (`addmm(bias, x, w)`):
# a mask in the added input is passed on, one in a factor is used as a number.
_ADDS_A_PRODUCT = frozenset(("addmm", "baddbmm", "addbmm", "addmv", "addr"))


# Ops that make a finite value of a -inf mask (exp(-inf) = 0): an Inf in their output is
# not the mask passed on but made there (`torch.exp(masked_scores)` of a score past 88.7,
# a softmax by hand over a masked row), or a +inf sentinel used as a number.
_MAPS_MINUS_INF_TO_FINITE = frozenset(("exp", "exp2", "expm1", "special_exp2", "special_expm1"))


def _uses_entries_as_numbers(func, args) -> bool:
    name = base_name(func).rstrip("_")
    if name in _REDUCES_ENTRIES:
        return True
    return name in _ADDS_A_PRODUCT and any(
        isinstance(t, torch.Tensor) and t.is_floating_point() and not all_finite(t) for t in args[1:3])


def _a_mask_being_built(dest: torch.Tensor) -> bool:
    """Is `dest` (a view just written) part of a tensor whose finite values are all one
    constant, the zeros or ones it was made of: a mask or bounds being written by hand?"""
    whole = dest._base if dest._base is not None else dest
    if not whole.is_floating_point() or whole.numel() > _MASK_BUILT_BY_HAND:
        return False
    finite = whole[torch.isfinite(whole)]
    return finite.numel() == 0 or bool((finite == finite[0]).all())


def _selects_by_mask(args) -> bool:
    """Does the op select elements by a boolean mask (`x[mask]`, `masked_select`)?"""
    return any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in tensors_of(args))


def _accidents_survive_the_fill(args, kwargs, out: torch.Tensor) -> bool:
    """A fill wrote a non-finite value on purpose (`masked_fill(causal, -inf)`) into a tensor
    that held values made by accident (a `+inf` from `x / 0` or `-log(0)`): does the output
    still hold some of them, non-finite values other than the one written?"""
    written = [float(v) for v in (*args, *kwargs.values())
               if isinstance(v, (int, float)) and not isinstance(v, bool) or isinstance(v, torch.Tensor) and v.dim() == 0]
    written = [v for v in written if not math.isfinite(v)]
    left = ~torch.isfinite(out)
    for value in written:
        left &= out != value
    return bool(left.any())


def _overwritten_name(func, tensors, out) -> str | None:
    """The argument an in-place op wrote its result into (`self` of `log_`), if any."""
    if not is_inplace(func):
        return None
    key = storage_key(out)
    return next((name for name, t in tensors if storage_key(t) == key), None)


def _add_origin_facts(facts: SiteFacts, func, args, kwargs, tensors) -> None:
    """Facts about the op that made a non-finite value from finite inputs, for the rules:
    the op's own (CTC lengths, ...) and which autograd op produced each input."""
    for key, value in collect_op_facts(func, args, kwargs).items():
        setattr(facts, key, value)
    facts.loads_parameter = bool(args) and isinstance(args[0], torch.nn.Parameter) and \
        func._schema.name.endswith("copy_")
    facts.input_producers = {name: type(t.grad_fn).__name__ for name, t in tensors if t.grad_fn is not None}


def _position(optimizer, p) -> tuple[int | None, int | None]:
    for gi, group in enumerate(optimizer.param_groups):
        for pi, q in enumerate(group["params"]):
            if q is p:
                return gi, pi
    return None, None


def _summary(name: str, value, overwritten: bool, before: torch.Tensor | None) -> TensorSummary:
    if not isinstance(value, torch.Tensor):
        return summarize_number(value, name)
    if overwritten:
        return summarize(before, name) if before is not None else summarize(value, name + OVERWRITTEN_SUFFIX)
    return summarize(value, name)


def _named_inputs(func, args, kwargs):
    """(ATen argument name, value) for each tensor input, lists included (`tensors[1]`), and
    each Python number given where the op takes a tensor (`x / 0` is `div(x, 0)`)."""
    schema = func._schema.arguments
    tensor_typed = {a.name for a in schema if isinstance(a.type, torch.TensorType)}
    names = [a.name for a in schema]
    for i, value in enumerate(args):
        name = names[i] if i < len(names) else f"arg{i}"
        yield from _inputs_named(name, value, name in tensor_typed)
    for name, value in kwargs.items():
        yield from _inputs_named(name, value, name in tensor_typed)


def _inputs_named(name: str, value: Any, tensor_typed: bool):
    if isinstance(value, torch.Tensor):
        yield name, value
    elif tensor_typed and isinstance(value, (int, float)) and not isinstance(value, bool):
        yield name, value
    elif isinstance(value, (list, tuple)):
        for j, item in enumerate(value):
            if isinstance(item, torch.Tensor):
                yield f"{name}[{j}]", item


# A non-finite value written in the source: `float("inf")`, `math.inf`, `-np.inf`, `float("nan")`.
_NONFINITE_LITERAL = re.compile(r"\b(inf(inity)?|nan)\b", re.IGNORECASE)


def _types_a_nonfinite_value(where) -> bool:
    """Does the script's line (its comment aside) write a non-finite value itself? Values
    parsed or computed elsewhere (`torch.tensor(row)`, `torch.tensor(np.log(p))`) are data."""
    if where is None:
        return False
    code, line = where
    return _NONFINITE_LITERAL.search(linecache.getline(code.co_filename, line).split("#", 1)[0]) is not None


def _an_extreme_fill_overflowed(inputs: list[TensorSummary], output: TensorSummary) -> bool:
    """A mask written as its dtype's extreme finite value (`masked_fill(eye, finfo(dtype).min)`,
    as Hugging Face writes attention masks) that an op scaled or added past the range: its
    -inf is the mask still (`sim / temperature` in bfloat16). The infinities are of the
    extreme's sign, and no NaN."""
    if output.nan or bool(output.posinf) == bool(output.neginf):
        return False
    for s in inputs:
        dtype = getattr(torch, s.dtype, None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or s.min is None:
            continue
        extreme = torch.finfo(dtype)
        if (output.neginf and s.min == extreme.min) or (output.posinf and s.max == extreme.max):
            return True
    return False


# The smallest magnitude of a value written to stand for "minus infinity" in an additive
# mask (-1e4 in BERT, -1e9 in the Annotated Transformer, float32's min in Hugging Face).
_SENTINEL = 1e4


def _a_sentinel_mask_overflowed(tensors: list[tuple[str, torch.Tensor]], out) -> bool:
    """An additive mask of zeros and one large constant (`(1.0 - mask) * -1e9`; both there: a
    tensor of the constant alone is a value, not a mask) that a cast or a scaling pushed
    past the dtype's range (float16's 65504): its infinities stand exactly where the
    constant stood, of its sign, and no NaN. The Inf is the mask still."""
    if not isinstance(out, torch.Tensor) or not out.is_floating_point() or torch.isnan(out).any():
        return False
    infinite = torch.isinf(out)
    signs = torch.sign(out[infinite])
    if not len(signs) or not (signs == signs[0]).all():
        return False
    for _, t in tensors:
        if not t.is_floating_point() or t.numel() < 2 or not torch.isfinite(t).all():
            continue
        try:
            marks = torch.broadcast_to(t != 0, out.shape)
        except RuntimeError:
            continue
        constant = t[t != 0]
        if 0 < len(constant) < t.numel() and torch.equal(marks, infinite) and bool((constant == constant[0]).all()) \
                and abs(float(constant[0])) >= _SENTINEL and math.copysign(1.0, float(constant[0])) == float(signs[0]):
            return True
    return False


# A line that calls an optimizer's step itself: `opt.step()`, `scaler.step(opt)`.
_A_STEP_CALL = re.compile(r"\bstep\s*\(")


def _calls_a_step(where) -> bool:
    if where is None:
        return False
    code, line = where
    return _A_STEP_CALL.search(linecache.getline(code.co_filename, line).split("#", 1)[0]) is not None


def _open_bounds(t: torch.Tensor) -> bool:
    """A sorted vector whose only non-finite values are -inf first and +inf last: the edges
    of bins open at their ends (`torch.bucketize`'s boundaries, an ordinal model's cut points)."""
    if t.dim() != 1 or t.numel() < 3 or not t.is_floating_point():
        return False
    # (Sorted, with every inner value finite, an end can only be -inf first or +inf last; a
    # NaN anywhere fails the comparison.)
    return bool(torch.isfinite(t[1:-1]).all() and not torch.isfinite(t).all() and (t[1:] >= t[:-1]).all())


def _nothing_finite(summary: TensorSummary) -> bool:
    return summary.numel > 0 and summary.nan + summary.posinf + summary.neginf == summary.numel


def _one_infinity_only(summary: TensorSummary) -> bool:
    return summary.nan == 0 and summary.numel > 0 and summary.numel in (summary.posinf, summary.neginf)


# Fewer elements than this are a row of data, not a mask (`torch.tensor([0.0, inf])`).
_MASK_SIZE = 4


def _a_mask(summary: TensorSummary) -> bool:
    """One infinity (a sign, no NaN) among copies of one finite constant (the summary's min
    and max are over the finite values): an additive mask, not data (data with a bad value
    has varied values around it)."""
    return not summary.nan and bool(summary.posinf) != bool(summary.neginf) and summary.numel >= _MASK_SIZE \
        and summary.min is not None and summary.min == summary.max


def _updates_weight_by_hand(func, args, grad_enabled: bool) -> bool:
    """Is this in-place op, run outside any module with grad mode off, writing a trained
    weight (a leaf that requires grad)? That is an update step the script wrote itself
    (`w -= lr * w.grad`, SAM's perturbation, WGAN's weight clipping): its optimizer phase,
    though no `optimizer.step()` runs it."""
    if grad_enabled or not args or not isinstance(args[0], torch.Tensor):
        return False
    written = func._schema.arguments[0].alias_info
    weight = args[0]
    return written is not None and written.is_write and weight.is_leaf and weight.requires_grad
