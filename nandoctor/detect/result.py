"""What detection hands to everything after it: typed data, no sentences.

A `Detection` says why the run was stopped (`StopReason`), the site where it stopped (the
event), the earliest non-finite ancestor of that site (the root) and the lineage between
them, and whether only a seeded replay can fill in the op's values. Each `Site` carries
`SiteFacts`: typed things detection learnt (which parameter, whether the optimizer wrote
it, which batch and samples, where an intended Inf was written, op-specific facts such as
CTC lengths). Diagnosis turns these into a cause and words; renderers show them.

Nothing here imports torch: the report model and the renderers build on these types.
`to_dict`/`from_dict` give the JSON of a site (`shared/CONTRACT.md`, plus added fields).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from nandoctor.stats import TensorSummary

# The name suffix of an in-place op's input summarised after the op (too large to copy
# before it): its values say nothing about what the op received.
OVERWRITTEN_SUFFIX = " (after: overwritten in place)"


@dataclass(frozen=True)
class Location:
    """The source line a user should look at."""

    file: str
    line: int
    function: str
    code: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function, "code": self.code}

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Location | None":
        return cls(data["file"], data["line"], data["function"], data["code"]) if data else None


class StopReason(enum.Enum):
    """Why detection stopped the run (diagnosis words each one)."""

    OP_MADE_NAN = "op_made_nan"  # an op outside backward made a NaN
    OP_MADE_INF = "op_made_inf"  # an Inf that policy stops on (its dtype, or inside the optimizer)
    LOSS = "loss"  # the loss reaching backward() is non-finite
    GRADIENT_AFTER_BACKWARD = "gradient_after_backward"  # a leaf's .grad after backward()
    GRADIENT_RETURNED = "gradient_returned"  # a result of torch.autograd.grad
    GRADIENT_BEFORE_STEP = "gradient_before_step"  # a .grad the optimizer is about to use
    PARAMETER_BEFORE_STEP = "parameter_before_step"  # a parameter non-finite before any update
    UPDATE = "update"  # optimizer.step() made a parameter non-finite
    PARAMETER_WRITTEN = "parameter_written"  # an op wrote a non-finite value into a parameter or buffer
    READ_BACK = "read_back"  # the script read a non-finite value (.item(), .tolist(), .numpy(), print)
    AMP_SCALE_COLLAPSE = "amp_scale_collapse"  # a GradScaler skipped a step at a scale of 1 or less
    SCRIPT_RAISED = "script_raised"  # the script raised over a non-finite value it checked itself
    OP_REFUSED = "op_refused"  # an op raised an error over a non-finite input (BCE's target range check)
    STATE_EXPORTED = "state_exported"  # a module's state_dict() handed out a non-finite parameter or buffer
    OPTIMIZER_SETTING = "optimizer_setting"  # a param group's lr (momentum, ...) is non-finite before the step
    MONITORED_METRIC = "monitored_metric"  # ReduceLROnPlateau or EarlyStopping was given a non-finite metric
    NAN_HIDDEN = "nan_hidden"  # an op turned a NaN into finite values (an integer cast, a clipped grid)


@dataclass(frozen=True)
class ParameterRef:
    """A parameter or buffer: by name when the module that owns it ran or loaded a state
    dict, else by its place in the optimizer's `param_groups` or only by its shape."""

    name: str | None
    shape: tuple[int, ...]
    group: int | None = None
    index: int | None = None
    # False for an `nn.Parameter` nothing trains (requires_grad=False): a frozen weight, or
    # a framework's state kept as a parameter (Keras's metric and loss-tracker variables).
    trained: bool = True
    buffer: bool = False  # a module's buffer (BatchNorm's running_var), not an nn.Parameter


@dataclass(frozen=True)
class BatchOrigin:
    """Where a non-finite batch came from: the batch number, the tensor inside it, its bad
    rows and the dataset indices of those rows (when the sampler's indices were seen)."""

    number: int
    key: str
    rows: tuple[int, ...] = ()
    dataset_indices: tuple[int, ...] | None = None
    # Those samples fetched again in the main process came back finite: what made the
    # value differs between fetches (a random transform, a worker's own state).
    refetched_finite: bool = False


@dataclass(frozen=True)
class CtcItem:
    item: int
    input_length: int
    target_length: int
    repeats: int


@dataclass(frozen=True)
class CtcLengths:
    """CTC's lengths per batch item, and the items that cannot be aligned at all."""

    input_lengths: tuple[int, ...]
    target_lengths: tuple[int, ...]
    impossible: tuple[CtcItem, ...]


DeviceFlag = Literal["nan", "inf"]


@dataclass(frozen=True)
class AmpScaling:
    """A GradScaler's record when it stopped helping: its scale, the steps it skipped in a
    row and in all, out of the steps it was asked to take, and the losses in a row that
    were non-finite before scaling."""

    scale: float | None
    skipped_in_a_row: int
    skipped: int
    steps: int
    nonfinite_losses_in_a_row: int = 0  # stopped on the loss: non-finite this many steps in a row


@dataclass
class SiteFacts:
    """What detection learnt about one site beyond its op, inputs and output."""

    parameter: ParameterRef | None = None  # the op wrote / the value is this parameter
    loads_parameter: bool = False  # a copy_ into a Parameter (load_state_dict)
    writes_parameter: bool = False  # the op wrote its non-finite value into a parameter or buffer
    parameter_before_step: bool = False  # seen non-finite before the optimizer's first update of it
    written_by_optimizer: bool = False  # changed by optimizer.step(), outside the checked ops
    optimizer: str | None = None  # the optimizer's class
    optimizer_setting: str | None = None  # the param-group setting that was non-finite ("lr", "betas")
    untracked_input: bool = False  # an input was non-finite and no op nandoctor saw made it
    made_out_of_sight: bool = False  # a gradient a backward node left to the step's check made (nodes.py)
    received_from_peers: bool = False  # a collective (all_reduce, all_gather) brought it from the other ranks
    unwatched_thread: str | None = None  # first seen on this thread, whose ops the per-op watch does not see
    scaled_gradient_stepped: bool = False  # a GradScaler's scaled gradient reached optimizer.step(), not scaler.step()
    entered: bool = False  # the value entered torch non-finite here (torch.tensor, from_numpy)
    made_by_numpy: str | None = None  # ...made at this line by numpy, as it warned ("divide by zero encountered in log")
    inf_written_at: Location | None = None  # where the intended Inf this op consumed was written
    inf_written_by: str | None = None  # ...the op that wrote it, when it has no user line
    mask_overflowed: bool = False  # a finite mask (finfo.min, -1e9) this op pushed past the range: -inf, a mask still
    combined_written_inf: bool = False  # a sum, mean or matrix product over entries holding an Inf written on purpose
    batch: BatchOrigin | None = None
    device_flag: DeviceFlag | None = None  # seen by a device-side flag: values not kept
    gradient_leak_through: str | None = None  # the backward node that turned this op's Inf into NaN
    masked: bool = False  # its values were dropped downstream in forward (where, masked_fill, index_put)
    absorbed: bool = False  # an op downstream in forward made only finite values of them (exp(-inf) = 0)
    written_on_purpose: bool = False  # a fill was handed the non-finite value to write (a -inf mask)
    user_backward: bool = False  # called by the user's own code inside backward (custom Function, hook)
    own_optimizer: bool = False  # called by the step() of an optimizer the user wrote (LARS by hand)
    optimizer_made_here: bool = False  # a framework's loop called its step(): the location is where it was made
    input_producers: dict[str, str] = field(default_factory=dict)  # input name -> autograd node
    ctc: CtcLengths | None = None
    amp: AmpScaling | None = None
    compiled: str | None = None  # made inside this torch.compile'd function or module (ops unseen)
    called_in: Location | None = None  # the framework's own line (Keras, Lightning) that ran the op
    exponent: float | None = None  # a Python-number exponent of pow
    ignore_index: int | None = None  # nll_loss / cross_entropy: the target value left out of the mean
    counted_targets: int | None = None  # ...and how many targets the mean counted (0: 0/0)
    reduced_count: int | None = None  # std / var: how many values each output reduces over
    correction: float | None = None  # ...and the correction subtracted from that count (Bessel's 1)
    keyless_queries: tuple[int, ...] | None = None  # softmax over square scores: query rows with every key -inf
    keyless_in_every_matrix: bool = False  # ...the same rows in every score matrix of the batch (the mask's shape)
    op_facts_error: str | None = None  # collecting op facts failed (never breaks detection)
    loss: float | None = None  # watch mode: the loss seen at the boundary
    grad_norm: float | None = None  # watch mode: the gradient norm seen at the boundary

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON keys; only what is set (the keys are stable across releases)."""
        out: dict[str, Any] = {}
        p = self.parameter
        if p is not None:
            out["parameter"] = p.name
            out["parameter_shape"] = list(p.shape)
            if p.group is not None:
                out["parameter_position"] = [p.group, p.index]
            if not p.trained:
                out["parameter_trained"] = False
            if p.buffer:
                out["parameter_buffer"] = True
        for key in ("loads_parameter", "writes_parameter", "parameter_before_step", "masked", "absorbed", "entered", "written_by_optimizer", "untracked_input",
                    "user_backward", "written_on_purpose", "own_optimizer", "scaled_gradient_stepped", "mask_overflowed",
                    "optimizer_made_here", "received_from_peers", "made_out_of_sight", "combined_written_inf"):
            if getattr(self, key):
                out[key] = True
        for key in ("optimizer", "inf_written_by", "device_flag", "gradient_leak_through", "exponent",
                    "op_facts_error", "loss", "grad_norm", "compiled", "ignore_index", "counted_targets",
                    "reduced_count", "correction", "unwatched_thread", "made_by_numpy", "optimizer_setting"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.keyless_queries is not None:
            out["keyless_queries"] = list(self.keyless_queries)
            out["keyless_in_every_matrix"] = self.keyless_in_every_matrix
        if self.inf_written_at is not None:
            out["inf_written_at"] = self.inf_written_at.to_dict()
        if self.called_in is not None:
            out["called_in"] = self.called_in.to_dict()
        if self.batch is not None:
            b = self.batch
            out.update(batch=b.number, key=b.key, rows=list(b.rows))
            if b.dataset_indices is not None:
                out["dataset_indices"] = list(b.dataset_indices)
            if b.refetched_finite:
                out["refetched_finite"] = True
        if self.input_producers:
            out["input_producers"] = dict(self.input_producers)
        if self.ctc is not None:
            out.update(input_lengths=list(self.ctc.input_lengths), target_lengths=list(self.ctc.target_lengths),
                       impossible=[vars(i).copy() for i in self.ctc.impossible])
        if self.amp is not None:
            out["amp"] = vars(self.amp).copy()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "SiteFacts":
        data = data or {}
        facts = cls(**{f.name: data[f.name] for f in fields(cls)
                       if f.name in data and f.name not in ("parameter", "batch", "ctc", "inf_written_at", "amp", "called_in")})
        if "parameter_shape" in data:
            group, index = data.get("parameter_position") or (None, None)
            facts.parameter = ParameterRef(data.get("parameter"), tuple(data["parameter_shape"]), group, index,
                                           data.get("parameter_trained", True), data.get("parameter_buffer", False))
        if "batch" in data:
            indices = data.get("dataset_indices")
            facts.batch = BatchOrigin(data["batch"], data.get("key", "batch"), tuple(data.get("rows") or ()),
                                      tuple(indices) if indices is not None else None,
                                      bool(data.get("refetched_finite", False)))
        if "input_lengths" in data:
            facts.ctc = CtcLengths(tuple(data["input_lengths"]), tuple(data["target_lengths"]),
                                   tuple(CtcItem(**i) for i in data.get("impossible") or ()))
        facts.inf_written_at = Location.from_dict(data.get("inf_written_at"))
        facts.called_in = Location.from_dict(data.get("called_in"))
        if data.get("amp") is not None:
            facts.amp = AmpScaling(**data["amp"])
        return facts


@dataclass
class Site:
    """One op whose output was non-finite (or a value found non-finite at a boundary, with
    `op` empty): where it ran and what went in and out."""

    op: str
    phase: str
    location: Location | None
    module: str | None = None
    backward_node: str | None = None
    output: TensorSummary | None = None
    inputs: list[TensorSummary] = field(default_factory=list)
    step: int | None = None
    facts: SiteFacts = field(default_factory=SiteFacts)

    @property
    def made(self) -> DeviceFlag | None:
        """What the site's output held: "nan" if any NaN, else "inf"; None when unknown."""
        if self.output is None:
            return self.facts.device_flag
        return "nan" if self.output.nan else "inf" if self.output.nonfinite else None

    def lineage_entry(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "phase": self.phase,
            "location": self.location.to_dict() if self.location else None,
            "backward_node": self.backward_node,
            "module": self.module,
            "output": self.output.to_dict() if self.output else None,
            **({"called_in": self.facts.called_in.to_dict()} if self.facts.called_in else {}),
        }

    def to_dict(self) -> dict[str, Any]:
        return dict(self.lineage_entry(), inputs=[s.to_dict() for s in self.inputs], step=self.step,
                    facts=self.facts.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Site":
        return cls(
            op=data["op"], phase=data["phase"], location=Location.from_dict(data.get("location")),
            module=data.get("module"), backward_node=data.get("backward_node"),
            output=TensorSummary.from_dict(data["output"]) if data.get("output") else None,
            inputs=[TensorSummary.from_dict(s) for s in data.get("inputs") or []],
            step=data.get("step"), facts=SiteFacts.from_dict(data.get("facts") or _lineage_facts(data)),
        )


def _lineage_facts(entry: dict[str, Any]) -> dict[str, Any]:
    """The facts a lineage entry keeps (the framework line that ran its op)."""
    return {"called_in": entry["called_in"]} if entry.get("called_in") else {}


@dataclass
class Detection:
    """Why the run stopped, where, and the non-finite ancestry back to the root (root first)."""

    reason: StopReason
    event: Site
    root: Site
    lineage: list[Site]
    # Only a seeded replay that checks every op at once can name the op or its values:
    # a device flag kept no values, or the optimizer's step was checked only at its end.
    needs_replay: bool = False
    # Ops whose device flags saw a non-finite value this step: the candidates while no replay ran.
    flagged_suspects: list[Site] = field(default_factory=list)
    refused_by: str | None = None  # OP_REFUSED: the op that raised over the event's value
    hidden_by: str | None = None  # NAN_HIDDEN: the op that turned the event's NaN into finite values


@dataclass(frozen=True)
class Discarded:
    """Non-finite values an op made that never mattered (nothing that counts read them):
    where they were born, how many times, and whether a `# nandoctor: allow` or the
    config's `run.allow` accepted the line."""

    op: str
    location: Location | None
    made: DeviceFlag  # "nan" when any of them held a NaN, else "inf"
    count: int
    allowed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "location": self.location.to_dict() if self.location else None,
                "made": self.made, "count": self.count, "allowed": self.allowed}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Discarded":
        return cls(data["op"], Location.from_dict(data.get("location")), data["made"], data["count"],
                   data.get("allowed", False))


@dataclass
class History:
    """Per-step loss and global gradient norm, oldest first (None where not seen)."""

    steps: list[int] = field(default_factory=list)
    loss: list[float | None] = field(default_factory=list)
    grad_norm: list[float | None] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "loss": self.loss, "grad_norm": self.grad_norm}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "History":
        data = data or {}

        def number(v):  # JSON carries non-finite floats as strings
            return float(v) if isinstance(v, str) else v

        return cls(list(data.get("steps", [])), [number(v) for v in data.get("loss", [])],
                   [number(v) for v in data.get("grad_norm", [])])


@dataclass(frozen=True)
class WatchFinding:
    """What watch mode saw: which value went non-finite, at which step, called from where."""

    # parameters: found at the end of the run; exported: in the weights of an untrained
    # model (an EMA's) that a state_dict() handed out; refused: the script died of an error
    # an op raises over values a NaN fails (a finding only if the replay finds that NaN)
    what: Literal["loss", "gradient", "parameters", "exported", "refused"]
    step: int  # optimizer steps completed
    location: Location | None  # the backward() / step() call
    loss: float | None
    grad_norm: float | None
    weights_clean: bool | None

    @property
    def phase(self) -> str:
        """The phase of its step in which the value went non-finite."""
        return {"loss": "forward", "refused": "forward", "monitored metric": "forward",
                "gradient": "backward"}.get(self.what, "optimizer")
