"""A backward checked node by node: the per-op mode off, one check per autograd node.

Most of trace mode's cost in backward is torch calling into Python for every op the
autograd engine runs (a fifth of a Transformer step's time, measured: see the README). A
node's outputs are what the next nodes receive, so a non-finite value that goes on to
matter leaves the node that made it non-finite. So for a plain `loss.backward()` the
per-op mode is taken off and each node of the graph gets a post-hook that checks its
outputs (one sum each, the hot path's own check). Only when one is non-finite is the node
run again, under the per-op mode, from the same gradients and its saved tensors, which
the engine frees only after the node's post-hooks: that finds the exact op with the
records, lineage and forward line per-op tracing gives, and its records pass on to the
node's real outputs.

Not every node: one that only moves a gradient gets no hook, and in a backward whose
checks go to the optimizer's step, neither does one that can only overflow (see
`_LEFT_TO_THE_STEP` and `_BOUNDED_DERIVATIVE`): the step's own check of the gradients
stops on what such a node makes, and the seeded replay names the op. A graph built again
as one already walked with nothing to hook is not walked again (`GraphBuilt`).

Python code that runs inside backward is still traced op by op: a custom
`autograd.Function` (and what is built on one: a module's backward hooks, reentrant
checkpointing) runs with the mode on between the pre-hook and post-hook it gets here, and
a tensor's `register_hook` function with the mode on (see hooks.py). torch.compile's
backward is an autograd.Function too, but runs no Python of the user's: most of it is fused
kernels no mode sees, so it is checked as one node, and a non-finite value it makes is
found by the replay, which runs the compiled code eagerly (see compiled.py). Backward
passes that build a graph (`create_graph=True`), those inside torch.func transforms,
`autograd.grad` stay per-op throughout.

On an accelerator, where reading a check's answer is a host sync, a node's outputs each
queue a device flag instead (see device_flags.py): a backward flag is read at the next
boundary, where the step's check of the gradients stops the run and a seeded replay,
which checks backward op by op, names the op.
"""
from __future__ import annotations

import functools

import torch
from torch.autograd.function import BackwardCFunction

from nandoctor.detect.mode import _finite

current_node = torch._C._current_autograd_node

_ACCUMULATE = "AccumulateGrad"
COMPILED_BACKWARD = "CompiledFunctionBackward"  # AOTAutograd's node: a compiled graph's backward
_ARMED = "nandoctor.armed"  # a node's metadata key: its hooks are in place (graphs kept across backwards)

# Nodes that hand on the one gradient they receive as it is, only reshaped (a Linear's
# weight reaches its accumulator through the transpose's node).
_RESHAPES = frozenset({
    "AliasBackward0", "PermuteBackward0", "ReshapeAliasBackward0", "SqueezeBackward0", "SqueezeBackward1",
    "TBackward0", "TransposeBackward0", "UnsafeViewBackward0", "UnsqueezeBackward0", "ViewBackward0",
})

# Nodes whose gradient is the one they received, moved (a view, a transpose, a copy, a
# select into zeros) or selected (ReLU's: where the input was positive, else zero):
# nothing non-finite starts there, and what passes through keeps its storage or reaches
# the next checked node, so they go unchecked (most nodes of a Transformer). A leaf's
# accumulator gets its own hook once a backward has made a non-finite value (see
# `arm_leaves`).
_UNCHECKED_NODES = _RESHAPES | frozenset({
    "AsStridedBackward0", "CatBackward0", "CloneBackward0", "DetachBackward0", "NarrowBackward0",
    "SelectBackward0", "SliceBackward0", "SplitBackward0", "SplitWithSizesBackward0", "SqueezeBackward2",
    "StackBackward0", "TransposeBackward1", "UnbindBackward0", "UnflattenBackward0", "UnsafeSplitBackward0",
    "ReluBackward0", "ThresholdBackward0",
})

# Nodes whose backward is sums of products (matrix products, convolutions, the affine
# parts of normalisations, an embedding's scatter of rows): from finite values they can
# only make a non-finite gradient by overflowing. What such a node hands a leaf's
# accumulator becomes the parameter's .grad, which the step's own check reads anyway (one
# norm over the gradients before any update), so with an optimizer in the run those outputs
# are left to it: one read of every weight's gradient less each step. Should one overflow,
# the step stops on it and the seeded replay, which checks backward op by op, names the op.
#
# In a backward whose checks go to the step (a plain `loss.backward()` with an optimizer in
# the run: see `Detector._checks_at_the_step`), such a node is not hooked at all. An Inf it
# makes matters only if it reaches a gradient the step applies, and there the step's check
# stops the run; on its way it may pass a node that is checked, which finds a non-finite
# gradient arriving that no record names (`Detector.node_went_nonfinite` marks it made out
# of sight). Either way the stop asks for the seeded replay, which names the op. What this
# saves is a hook and a read per node on every step of every run, most of a Transformer's
# checked nodes (its matmuls, layer norms and residual adds); what it costs is a replay,
# only on the rare run whose backward overflows in one of them.
_LEFT_TO_THE_STEP = frozenset({
    "AddmmBackward0", "MmBackward0", "BmmBackward0", "ConvolutionBackward0", "EmbeddingBackward0",
    "NativeLayerNormBackward0", "NativeBatchNormBackward0", "AddBackward0",
    COMPILED_BACKWARD,  # (the replay runs it eagerly to find the op)
})

# Nodes that multiply the gradient by a bounded factor made of finite values: tanh's and
# sigmoid's from their outputs (1 - y², y(1 - y)), a softmax's and a log-softmax's from
# theirs (probabilities; exp of a log-probability, 0 for a masked -inf), GELU's and SiLU's
# derivatives (at most ~1.1, and their input finite wherever the forward output was), an
# NLL loss's weights over their finite total (the step reads the loss before the
# gradients: a total of 0 is a NaN loss, stopped there first). Like the nodes above, only
# an overflow makes a non-finite gradient of them, and in a backward checked at the step
# they are left to it too.
#
# So do nodes that sum, average, spread or narrow a gradient of finite values: an expand's
# sum, a mean's division by its count, a max pool's scatter to its maxima, a cast down to
# a narrower float (a bfloat16 gradient under autocast: only an overflow makes an Inf),
# and attention's fused backward, which recomputes probabilities in [0, 1] from the
# log-sum-exp it saved and makes sums of products of them.
_BOUNDED_DERIVATIVE = frozenset({
    "TanhBackward0", "SigmoidBackward0", "SoftmaxBackward0", "SafeSoftmaxBackward0", "LogSoftmaxBackward0",
    "GeluBackward0", "SiluBackward0", "NllLossBackward0",
    "ExpandBackward0", "MeanBackward0", "MeanBackward1", "MaxPool2DWithIndicesBackward0", "ToCopyBackward0",
    "ScaledDotProductFlashAttentionForCpuBackward0", "ScaledDotProductFlashAttentionBackward0",
    "ScaledDotProductEfficientAttentionBackward0", "ScaledDotProductCudnnAttentionBackward0",
})

# What a backward checked at the step leaves unhooked: all of the above.
_UNCHECKED_AT_THE_STEP = _UNCHECKED_NODES | _LEFT_TO_THE_STEP | _BOUNDED_DERIVATIVE


def _reaches_a_leaf(node) -> bool:
    """Does a gradient handed to `node` become a leaf's .grad, with the same values?"""
    while node is not None:
        name = type(node).__name__
        if name == _ACCUMULATE:
            return True
        if name not in _RESHAPES:
            return False
        node = node.next_functions[0][0]
    return False


_RANGE = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}  # each holds the one before


def _widening_cast(node, name: str) -> bool:
    """A cast's backward casts the gradient back to the input's dtype: from bfloat16 to
    float32 (autocast's casts of the weights), it cannot overflow. The other way it can."""
    if name != "ToCopyBackward0":
        return False
    target = node.next_functions[0][0]
    if target is None:
        return True  # (no gradient to make)
    came = _RANGE.get(node._input_metadata[0].dtype)
    goes = _RANGE.get(target._input_metadata[node.next_functions[0][1]].dtype)
    return came is not None and goes is not None and came <= goes




class GraphBuilt:
    """What built the autograd nodes made since the last backward, as one number (each
    maker in order, a module region, an op or a compiled function, with how many nodes it
    made) and how many nodes in all. Two steps of one training loop give the same: the
    same code built the same graph (see `NodeChecks.arm`)."""

    __slots__ = ("made", "nodes")

    def __init__(self) -> None:
        self.made = 0
        self.nodes = 0

    def add(self, maker, nodes: int) -> None:
        self.made = hash((self.made, maker, nodes))
        self.nodes += nodes

    def take(self) -> tuple[int, int]:
        """(what built it, how many nodes), and start again from nothing."""
        built = self.made, self.nodes
        self.made = self.nodes = 0
        return built


def _grad_fns(roots) -> list:
    return [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]


class NodeChecks:
    """The hooks of one detector; `detector` gives `node_went_nonfinite` and the mode's
    state (`mode_suspended`, `python_code_starts` / `python_code_ends`)."""

    def __init__(self, detector) -> None:
        self.detector = detector
        # A leaf's accumulator outlives the run's graphs: its hook and mark are taken off
        # when the run ends (`release`), so a later run in the process starts clean.
        self._lasting: list[tuple[dict, object]] = []
        self._graphs: list = []  # the roots of each backward running (a nested one last)
        self._leaves_armed_for = None  # the roots of the backward whose leaves are hooked
        # Graphs (as `Detector.graph_fingerprint` gives them) walked and found with no node to
        # hook: the same graph again, each step of a loop, is not walked again.
        self._nothing_to_hook: set = set()
        self._check_all = functools.partial(self._node_finished, frozenset())  # (a C call, no Python frame)

    def release(self) -> None:
        for metadata, handle in self._lasting:
            handle.remove()
            if metadata.get(_ARMED) is self:
                del metadata[_ARMED]
        self._lasting.clear()
        self._graphs.clear()
        self._leaves_armed_for = None

    def begin(self, roots) -> None:
        """A backward starts: `roots` when it is checked node by node (kept until `end`,
        for `arm` and `arm_leaves`), else None."""
        self._graphs.append(roots)

    def end(self) -> None:
        """The innermost backward ended: its graph is no longer ours to keep."""
        if self._graphs and self._graphs.pop() is self._leaves_armed_for:
            self._leaves_armed_for = None  # (holding its roots would keep the graph alive)

    def arm(self, fingerprint=None) -> None:
        """Hook every node of the innermost backward's graph that can make a non-finite
        gradient and is not hooked yet. Not the leaves' accumulators: they only matter once
        this backward has made a non-finite value (rare), and are hooked then
        (`arm_leaves`), before the engine reaches them.

        Registering a hook is most of this walk's cost (3-7 µs a node against about 1 µs to
        visit one, timed on this machine), so a node that only moves or selects a gradient
        gets none, and no mark either: the walk holds what it has visited instead.

        `fingerprint` (a backward checked at the step): what built this graph. A graph built
        as one that was walked and had no node to hook (a model of torch.nn's modules, its
        matmuls and activations left to the step) is not walked: each step of the loop
        builds it again. Were the fingerprint ever to match a graph with a node to hook,
        that node's non-finite gradient would still be stopped by the step's check, and
        named by the replay."""
        if fingerprint is not None and fingerprint in self._nothing_to_hook:
            return
        hooked = self._walk_and_hook()
        if fingerprint is not None and not hooked and len(self._nothing_to_hook) < 16:
            self._nothing_to_hook.add(fingerprint)

    def _walk_and_hook(self) -> bool:
        """`arm`'s walk; True when a node of the graph is hooked (now or by an earlier walk)."""
        hooked = False
        stack = _grad_fns(self._graphs[-1])
        starts, ends = self._python_node_starts, self._python_node_ends
        leaves_at_step = self.detector.state.optimizer_seen  # (else no step reads the .grad)
        unchecked = _UNCHECKED_AT_THE_STEP if self.detector.overflow_left_to_the_step else _UNCHECKED_NODES
        visited: dict[int, object] = {}  # (holding each node: a freed node's id can come back)
        while stack:
            node = stack.pop()
            if node is None or id(node) in visited:
                continue
            visited[id(node)] = node
            kind = type(node)
            name = kind.__name__
            if name == _ACCUMULATE:
                continue  # (a leaf: nothing behind it)
            python = issubclass(kind, BackwardCFunction) and name != COMPILED_BACKWARD
            edges = node.next_functions
            if python or name not in unchecked and not _widening_cast(node, name):
                hooked = True
                metadata = node.metadata
                if metadata.get(_ARMED) is self:
                    continue  # armed by an earlier backward of a kept graph, and all behind it
                metadata[_ARMED] = self
                if python:
                    node.register_prehook(starts)
                    node.register_hook(ends)
                else:
                    node.register_hook(self._check_of(name, edges, leaves_at_step))
            stack.extend(fn for fn, _ in edges)
        return hooked

    def _check_of(self, name: str, edges, leaves_at_step: bool):
        """The post-hook that checks a node's outputs: all of them, or all but those the
        step will read as .grad (see `_LEFT_TO_THE_STEP`)."""
        if leaves_at_step and name in _LEFT_TO_THE_STEP:
            to_leaves = [i for i, (fn, _) in enumerate(edges) if _reaches_a_leaf(fn)]
            if to_leaves:
                return functools.partial(self._node_finished, frozenset(to_leaves))
        return self._check_all

    def arm_leaves(self) -> None:
        """A non-finite value was just made in the innermost backward: hook its leaves'
        accumulators, so that a .grad the engine makes as a new tensor takes the record of
        the gradient that came in. An accumulator that already ran took a finite one. Once
        a backward: a graph whose every node goes non-finite (an integrator's rollout that
        overflowed) would otherwise be walked once per node."""
        if not self._graphs or self._graphs[-1] is None or self._graphs[-1] is self._leaves_armed_for:
            return
        self._leaves_armed_for = self._graphs[-1]
        # Accumulators of earlier graphs that are gone (most are: one per leaf per step).
        self._lasting = [(m, h) for m, h in self._lasting if h.hooks_dict_ref() is not None]
        stack = _grad_fns(self._graphs[-1])
        seen: dict[int, object] = {}  # (holding each node: a freed node's id can come back)
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen[id(node)] = node
            if type(node).__name__ != _ACCUMULATE:
                stack.extend(fn for fn, _ in node.next_functions)
                continue
            metadata = node.metadata
            if metadata.get(_ARMED) is not self:
                metadata[_ARMED] = self
                self._lasting.append((metadata, node.register_hook(self._leaf_accumulated)))

    def _node_finished(self, left_to_the_step, grad_inputs, grad_outputs):
        detector = self.detector
        if detector.passive or not detector.mode_suspended:
            return None  # the per-op mode is on (a per-op backward): it checked each op itself
        flags = detector.flags
        for index, g in enumerate(grad_inputs):
            if g is None or index in left_to_the_step:
                continue
            if flags.enabled and flags.covers(g):  # (on an accelerator: a read would be a sync)
                if g.is_floating_point() and g.numel():
                    detector.defer_gradient(g)
            elif not _finite(g):
                detector.node_went_nonfinite(grad_inputs, grad_outputs)
                break
        return None

    def _leaf_accumulated(self, grad_inputs, grad_outputs):
        """A leaf's .grad took its gradient. Once this backward has made a non-finite value
        (rare), a non-finite .grad the engine made as a new tensor (a copy into the
        parameter's layout, a sum) takes the record of the gradient that came in."""
        detector = self.detector
        if detector.passive or not detector.mode_suspended or not detector.made_nonfinite_in_backward():
            return None
        incoming = grad_outputs[0] if grad_outputs else None
        if incoming is not None:
            detector.leaf_gradient_from(current_node().variable, incoming)
        return None

    def _python_node_starts(self, grad_outputs):
        self.detector.python_code_starts()
        return None

    def _python_node_ends(self, grad_inputs, grad_outputs):
        self.detector.python_code_ends()
        return None
