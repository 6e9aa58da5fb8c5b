"""Which ATen ops the detector checks, decided once per op overload and cached.

The hot path costs one dict lookup per op to learn the op's kind:

- READ: `_local_scalar_dense` (`.item()`, `float(t)`, formatting a 0-d tensor): a value
  the script reads back, which a non-finite suspect must not reach.
- ENTRY: `lift_fresh` (`torch.tensor([...])`): values entering torch from Python, where a
  non-finite value from outside is born.
- UNINITIALISED: `empty*` results are whatever was in memory; checking them gives false
  alarms (they appear inside nn.TransformerEncoderLayer).
- PASSTHROUGH: views, copies, indexing, concatenation, fills: they cannot turn finite
  values into non-finite ones, so their outputs are not checked. When a non-finite tensor
  passes through one, the detector still carries its provenance over to the output.
- FINITE_PRESERVING: ops whose output is finite whenever their inputs are (bounded maps such
  as tanh and softmax, maps that never grow a value such as neg and gelu): checked only
  when an input holds a recorded non-finite value, since only then can their output be
  non-finite.
- CAST (`_to_copy`): a PASSTHROUGH when it widens (bfloat16 -> float32: the same values,
  so a non-finite one carries its record, as backward checked node by node leaves the
  cast's node unhooked), checked when it narrows (float32 -> float16 overflows past 65504).
- NOT_TENSOR_MATH: the profiler's marks (`record_function`, around every optimizer.step()
  and zero_grad()): they make no tensor, so they are run and nothing else.
- CHECKED: everything else that returns floating-point tensors; CHECKED_INPLACE for the
  in-place ones (`div_`, `add_`), whose `self` is kept as it was before the op when it is
  small enough to copy, so a report can show the values the op received.
"""
from __future__ import annotations

import enum

import torch

aten = torch.ops.aten


class OpKind(enum.Enum):
    CHECKED = "checked"
    CHECKED_INPLACE = "checked_inplace"  # checked; its `self` is kept as it was before the op
    PASSTHROUGH = "passthrough"
    FILL = "fill"  # passthrough, unless handed a non-finite scalar to write
    UNINITIALISED = "uninitialised"
    READ = "read"  # a value copied to Python (`.item()`, `float(t)`): the script reads it back
    ENTRY = "entry"  # a tensor made from Python data (`torch.tensor([...])`): values enter torch
    FINITE_PRESERVING = "finite_preserving"  # finite inputs give a finite output
    CAST = "cast"  # a passthrough when it widens the dtype's range, else checked
    UNCHECKED = "unchecked"  # a finite-preserving op whose inputs hold no recorded value: nothing to do
    NOT_TENSOR_MATH = "not_tensor_math"  # a profiler mark (optimizer.step, zero_grad): run, nothing else


_UNINITIALISED = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted"}

# Ops whose output holds only values that were already in their inputs (or zeros/ones):
# moving, selecting, reshaping and gathering never create a NaN or an Inf. (`copy_` is
# not among them: it can narrow float32 to float16, and it is how `load_state_dict`
# writes a checkpoint's values into parameters, which is where a bad checkpoint shows.)
# Fills, `where` and clamps pass values through too, but are in FILL_OPS below.
_PASSTHROUGH = {
    "detach", "alias", "clone", "contiguous", "view",
    "_unsafe_view", "reshape", "expand", "expand_as", "t", "transpose", "permute", "squeeze",
    "unsqueeze", "select", "slice", "narrow", "as_strided", "unfold", "flatten", "unbind",
    "split", "split_with_sizes", "chunk", "view_as", "movedim", "diagonal", "index",
    "index_select", "gather", "take", "masked_select", "cat", "stack", "roll", "flip", "repeat",
    "tile", "zeros", "zeros_like", "ones", "ones_like", "zero_", "new_zeros", "new_ones",
    "arange", "_to_dense", "tril", "triu", "embedding", "nonzero", "topk", "sort", "max", "min",
    "amax", "amin", "relu", "relu_", "threshold_backward", "_reshape_alias", "set_", "resize_",
    "item", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
    "is_same_size", "_has_compatible_shallow_copy_type", "dropout", "native_dropout",
    "bernoulli", "bernoulli_", "rand", "rand_like", "randn", "randn_like", "randint",
    "randint_like", "uniform_", "normal_", "randperm",
}

# Fills and masked fills CAN write a non-finite value when they are told to (a -inf
# attention mask): their output is looked at only when they were handed a non-finite
# scalar (see `writes_nonfinite_scalar`), and such an Inf is marked as intended.
FILL_OPS = {"full", "full_like", "new_full", "fill", "fill_", "masked_fill", "masked_fill_",
            "scalar_tensor", "where", "index_put", "index_put_", "scatter", "scatter_",
            "constant_pad_nd", "clamp", "clamp_min", "clamp_max", "maximum", "minimum"}

# Finite inputs always give a finite output: bounded (tanh, sigmoid, softmax), or never
# larger in magnitude than the input (neg, abs, gelu, silu). Not `exp`, not a product, not
# a backward formula (a gradient times a factor can overflow), not layer norm (eps=0).
_FINITE_PRESERVING = {
    "neg", "abs", "sign", "sgn", "tanh", "sigmoid", "sin", "cos", "erf", "gelu", "silu", "mish", "hardtanh",
    "hardsigmoid", "hardswish", "softsign", "_softmax", "_safe_softmax", "logsigmoid",
}
# Ops that normalise each row over its entries: a row with every entry at -inf is NaN,
# whatever wrote the -inf. Softmaxes by their base names, and the fused attentions that
# take a mask (nn.TransformerEncoderLayer's and nn.MultiheadAttention's fast path, SDPA).
SOFTMAX_OPS = ("_softmax", "softmax", "_log_softmax", "log_softmax", "_safe_softmax")
ATTENTION_OPS = ("_transformer_encoder_layer_fwd", "_native_multi_head_attention", "scaled_dot_product_attention",
                 "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_cudnn_attention")
_ROW_NORMALISING = frozenset(SOFTMAX_OPS + ATTENTION_OPS)


def normalises_rows(op: str) -> bool:
    """`op` as a record names it: `aten._softmax.default`."""
    parts = op.split(".")
    return len(parts) >= 2 and parts[1] in _ROW_NORMALISING


# Floating dtypes by range: a cast to a dtype of at least the same range keeps finite values finite.
_RANGE_RANK = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}

_READS = {"_local_scalar_dense"}
_ENTRIES = {"lift_fresh", "lift_fresh_copy"}

_kinds: dict[object, OpKind] = {}


def base_name(func) -> str:
    """`aten.masked_fill_.Scalar` -> `masked_fill_`."""
    return func._opname if hasattr(func, "_opname") else str(func).split(".")[-2]


# Ops whose outputs after the first are workspaces kept for backward, in part never
# written: `_ctc_loss`'s log_alpha is `empty()` past each sequence's input length, so its
# garbage could read as a NaN or an Inf made by the op (which one depended on what the
# allocator handed out). Only the first output is the op's value.
_WORKSPACES_AFTER_FIRST = {"_ctc_loss"}


def value_outputs(func, outputs):
    """The outputs of `func` that hold values (a multi-output op's)."""
    return outputs[:1] if base_name(func) in _WORKSPACES_AFTER_FIRST else outputs


def op_kind(func) -> OpKind:
    kind = _kinds.get(func)
    if kind is None:
        kind = _kinds[func] = _classify(func)
    return kind


def _classify(func) -> OpKind:
    if getattr(func, "namespace", None) == "profiler":
        return OpKind.NOT_TENSOR_MATH
    name = base_name(func)
    if name in _UNINITIALISED:
        return OpKind.UNINITIALISED
    if name in FILL_OPS:
        return OpKind.FILL
    if name in _READS:
        return OpKind.READ
    if name in _ENTRIES:
        return OpKind.ENTRY
    if name in _PASSTHROUGH or getattr(func, "is_view", False):
        return OpKind.PASSTHROUGH
    if name in _FINITE_PRESERVING:
        return OpKind.FINITE_PRESERVING
    if name == "_to_copy":
        return OpKind.CAST
    return OpKind.CHECKED_INPLACE if is_inplace(func) and not name.startswith("_foreach_") else OpKind.CHECKED


def cast_widens(args, kwargs) -> bool:
    """`_to_copy` to a dtype whose range holds the input's (or to no other dtype)."""
    source = args[0].dtype if args and isinstance(args[0], torch.Tensor) else None
    target = kwargs.get("dtype") or source
    return target == source or _RANGE_RANK.get(source, 99) <= _RANGE_RANK.get(target, -1)


def op_name(func) -> str:
    """The name a user sees and the contract uses: `aten.log.default`."""
    return str(func)


def is_inplace(func) -> bool:
    name = base_name(func)
    return name.endswith("_") and not name.startswith("_") or name.startswith("_foreach_") and name.endswith("_")


def written_arguments(func, args) -> list | None:
    """What an op that returns nothing wrote: the tensors of the arguments its schema marks
    as written (`Tensor(a!)[] self`), in order; None when it wrote none. The `_foreach_*_`
    ops write their first list; a fused optimizer step (`_fused_adamw_`, `_fused_sgd_`)
    writes the parameters, then its state."""
    places = _WRITTEN_PLACES.get(func)
    if places is None:
        schema = getattr(func, "_schema", None)
        places = _WRITTEN_PLACES[func] = tuple(
            i for i, argument in enumerate(schema.arguments if schema is not None else ())
            if argument.alias_info is not None and argument.alias_info.is_write)
    written = []
    for i in places:
        if i < len(args):
            value = args[i]
            written += [t for t in value if isinstance(t, torch.Tensor)] if isinstance(value, (list, tuple)) \
                else [value] if isinstance(value, torch.Tensor) else []
    return written or None


_WRITTEN_PLACES: dict = {}


def writes_nonfinite_scalar(func, args, kwargs, recorded=lambda t: None) -> bool:
    """True when a fill-like op was handed a non-finite Python number (e.g. -inf for a mask),
    or a 0-d tensor holding one. A 0-d tensor that a checked op made non-finite
    (`recorded(t)` is its record, not one written on purpose) is not written on purpose: it is
    carried on (Keras's `divide_no_nan` is a `where` over a non-finite loss). One that was
    itself written on purpose is: `where(causal, scalar_tensor(-inf), 0)` is how
    nn.MultiheadAttention builds its float mask on every call."""
    if base_name(func) not in FILL_OPS or writes_undefined(func, args):
        return False
    for value in (*args, *kwargs.values()):
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            return True
        if isinstance(value, torch.Tensor) and value.dim() == 0 and value.is_floating_point() and not value.is_meta \
                and _written_on_purpose_or_new(recorded(value)):
            v = value.item()
            if v != v or v in (float("inf"), float("-inf")):
                return True
    return False


def writes_undefined(func, args) -> bool:
    """`scalar_tensor(nan)`: how torch's own composite ops write NaN where their result is
    undefined (`torch.logdet` of a matrix whose determinant is negative is
    `where(sign < 0, scalar_tensor(nan), logabsdet)`). Scripts write NaN with `full`,
    `fill_`, `masked_fill` or `torch.tensor`; this NaN is made by the op the line called."""
    # (Every fill op passes here: the type test first, the name only for a float NaN.)
    return bool(args) and isinstance(args[0], float) and args[0] != args[0] and base_name(func) == "scalar_tensor"


def _written_on_purpose_or_new(record) -> bool:
    return record is None or record.facts.written_on_purpose
