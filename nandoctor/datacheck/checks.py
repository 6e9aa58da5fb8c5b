"""Checks on numeric arrays, pure numpy, fed chunk by chunk so memory stays bounded.

An `ArrayChecker` sees one array (or one table column) as a sequence of flat chunks in
storage order, each with the flat index of its first element, and at the end returns
`Finding`s: nan, inf, fp16_range, constant, empty, label_range.

The fast path for floats is two reductions per chunk: `min` and `max` propagate NaN and
reach +-Inf, so when both are finite every element is finite, and the same two numbers
serve the fp16-range and constant checks. Only a chunk that fails is looked at again to
count and locate the bad values.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

FP16_MAX = 65504.0
# Small enough that the max pass finds the chunk still in cache after the min pass, large
# enough that Python's per-chunk overhead vanishes: 4 MiB measured best with
# bench/bench_check_data.py (1 MiB and 16 MiB were slower).
CHUNK_BYTES = 4 << 20
# PyTorch's cross_entropy / nll_loss skip this target by default: a negative label that is
# meant, not a bug (`check_data.ignore_labels` adds others: -1, VOC's 255).
IGNORE_INDEX = -100

_LABEL_WORDS = {"label", "labels", "target", "targets", "y", "class", "classes", "cls",
                "class_id", "class_ids", "category", "categories", "gt"}


def looks_like_label(name: str | None) -> bool:
    """True for names such as `label`, `labels`, `y_train`, `target`, `class_ids`, `['label']`."""
    if not name:
        return False
    last = re.split(r"[/\[\]'\".]+", name.strip("/[]'\" ").lower())[-1]
    if last in _LABEL_WORDS:
        return True
    words = [w for w in re.split(r"[^a-z0-9]+", last) if w]
    return any(w in _LABEL_WORDS for w in words)


@dataclass(frozen=True)
class CheckOptions:
    max_positions: int = 5
    num_classes: int | None = None  # labels are checked only when it is given
    ignore_labels: tuple[int, ...] = (IGNORE_INDEX,)
    chunk_bytes: int = CHUNK_BYTES


@dataclass
class Finding:
    check: str
    count: int
    detail: str
    positions: list[tuple[int, ...]] = field(default_factory=list)


def flat_chunks(array: np.ndarray, chunk_bytes: int = CHUNK_BYTES) -> tuple[str, Iterator[tuple[np.ndarray, int]]]:
    """(order, chunks): flat views of a contiguous array (no copy, mmap-friendly), or copied
    row blocks of a strided one. `order` is how flat indices map back to positions."""
    if array.flags.c_contiguous or array.flags.f_contiguous:
        order = "C" if array.flags.c_contiguous else "F"
        flat = array.reshape(-1, order=order)
        step = max(1, chunk_bytes // max(1, array.itemsize))
        return order, ((flat[i:i + step], i) for i in range(0, flat.size, step))
    return "C", row_chunks(lambda a, b: array[a:b], array.shape, array.itemsize, chunk_bytes)


def row_chunks(read_rows, shape: Sequence[int], itemsize: int,
               chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[np.ndarray, int]]:
    """Blocks of whole rows (axis 0) read by `read_rows(start, stop)`, flattened in C order.

    For sources that can only be sliced (HDF5 datasets, safetensors slices, strided views).
    """
    if len(shape) == 0:
        yield np.asarray(read_rows(None, None)).reshape(-1), 0
        return
    row_elements = int(np.prod(shape[1:], dtype=np.int64))
    rows_per_chunk = max(1, chunk_bytes // max(1, row_elements * itemsize))
    for start in range(0, shape[0], rows_per_chunk):
        block = np.ascontiguousarray(read_rows(start, start + rows_per_chunk))
        yield block.reshape(-1), start * row_elements


class ArrayChecker:
    """Accumulates what one array's chunks show; `findings()` turns it into problems."""

    def __init__(self, shape: Sequence[int] | None, dtype: np.dtype | None = None, *,
                 order: str = "C", options: CheckOptions = CheckOptions(),
                 is_label: bool = False, allow_constant: bool = True, columns: bool = False) -> None:
        """`columns`: a 2-D array is a table of examples by features (a .npy of features,
        not a checkpoint's weight), whose constant columns are said (see _ChannelRanges)."""
        self.shape = tuple(shape) if shape is not None else None  # None: 1-D, length unknown
        self.dtype = np.dtype(dtype) if dtype is not None else None
        self.order = order
        self.options = options
        self.is_label = is_label
        self.allow_constant = allow_constant
        self.seen = 0
        self.nan = self.posinf = self.neginf = self.missing = 0
        self.fp16 = self.bad_labels = 0
        self.lo: float | None = None  # over finite values only
        self.hi: float | None = None
        self.label_lo: int | None = None
        self.label_hi: int | None = None
        self.positions: dict[str, list[int]] = {"nan": [], "inf": [], "fp16_range": [], "label_range": []}
        self.channels = _ChannelRanges.of(self.shape, self.dtype, order, columns=columns and not is_label) \
            if allow_constant else None

    # ---- feeding -------------------------------------------------------------------------

    def feed(self, chunk: np.ndarray, offset: int) -> None:
        """One flat chunk whose first element has flat index `offset`."""
        self.seen += chunk.size
        if chunk.size == 0:
            return
        if self.channels is not None:
            self.channels.feed(chunk, offset)
        kind = chunk.dtype.kind
        if kind == "f":
            self._feed_float(chunk if chunk.dtype.itemsize >= 4 else chunk.astype(np.float32), offset)
        elif kind in "iu":
            self._feed_integer(chunk, offset)
        elif kind == "b":
            self._note_range(chunk.min(), chunk.max())
        elif kind == "c":
            self._feed_complex(chunk, offset)

    def feed_missing(self, count: int) -> None:
        """Empty or NA cells of a table column: they arrive as NaN, this only labels them."""
        self.missing += count

    def _feed_float(self, chunk: np.ndarray, offset: int) -> None:
        lo, hi = chunk.min(), chunk.max()
        if np.isfinite(lo) and np.isfinite(hi):
            self._note_range(lo, hi)
            if max(-lo, hi) > FP16_MAX and chunk.dtype.itemsize > 2:
                self._count("fp16_range", np.abs(chunk) > FP16_MAX, offset)
            return
        self._feed_nonfinite_float(chunk, offset)

    def _feed_nonfinite_float(self, chunk: np.ndarray, offset: int) -> None:
        self.nan += self._count("nan", np.isnan(chunk), offset)
        inf = np.isinf(chunk)
        if inf.any():
            self._count("inf", inf, offset)
            pos = int(np.count_nonzero(chunk[inf] > 0))
            self.posinf += pos
            self.neginf += int(np.count_nonzero(inf)) - pos
        finite_mask = np.isfinite(chunk)
        finite = chunk[finite_mask]
        if finite.size:
            self._note_range(finite.min(), finite.max())
            if chunk.dtype.itemsize > 2:
                self._count("fp16_range", finite_mask & (np.abs(chunk) > FP16_MAX), offset)

    def _feed_complex(self, chunk: np.ndarray, offset: int) -> None:
        if np.isfinite(chunk).all():
            return
        self.nan += self._count("nan", np.isnan(chunk), offset)
        inf = np.isinf(chunk)
        self.posinf += self._count("inf", inf, offset)

    def _feed_integer(self, chunk: np.ndarray, offset: int) -> None:
        lo, hi = chunk.min(), chunk.max()
        self._note_range(lo, hi)
        top = self.options.num_classes
        if not self.is_label or top is None:
            # Without a class count any integer is a possible label: -1 and 255 are common
            # "ignore" values, so nothing here says a label is wrong.
            return
        self.label_lo = int(lo) if self.label_lo is None else min(self.label_lo, int(lo))
        self.label_hi = int(hi) if self.label_hi is None else max(self.label_hi, int(hi))
        if lo >= 0 and hi < top:
            return
        bad = (chunk < 0) | (chunk >= top)
        bad &= ~np.isin(chunk, self.options.ignore_labels)
        self.bad_labels += self._count("label_range", bad, offset)

    def _note_range(self, lo, hi) -> None:
        lo, hi = float(lo), float(hi)
        self.lo = lo if self.lo is None else min(self.lo, lo)
        self.hi = hi if self.hi is None else max(self.hi, hi)

    def _count(self, check: str, mask: np.ndarray, offset: int) -> int:
        """Count a mask's hits and keep the first positions (flat indices)."""
        count = int(np.count_nonzero(mask))
        if count:
            kept = self.positions[check]
            if check == "fp16_range":
                self.fp16 += count
            room = self.options.max_positions - len(kept)
            if room > 0:
                kept.extend(int(i) + offset for i in np.flatnonzero(mask)[:room])
        return count

    # ---- results -------------------------------------------------------------------------

    def findings(self) -> list[Finding]:
        if self.seen == 0:
            return [Finding("empty", 1, f"{self._what()} has no elements")]
        found = []
        if self.nan:
            found.append(Finding("nan", self.nan, self._nan_detail(), self._where("nan")))
        if self.posinf or self.neginf:
            found.append(Finding("inf", self.posinf + self.neginf, self._inf_detail(), self._where("inf")))
        if self.fp16:
            found.append(Finding("fp16_range", self.fp16, self._fp16_detail(), self._where("fp16_range")))
        if self.bad_labels:
            found.append(Finding("label_range", self.bad_labels, self._label_detail(), self._where("label_range")))
        if self._is_constant():
            found.append(Finding("constant", 1, self._constant_detail()))
        if not found and self.channels is not None:
            found += self.channels.findings()
        return found

    def _is_constant(self) -> bool:
        if not self.allow_constant or self.seen < 2 or self.lo is None:
            return False
        if self.nan or self.posinf or self.neginf:
            return False  # already reported; "constant" would only add noise
        if self.is_label and self.dtype is not None and self.dtype.kind in "iu":
            return False  # a label array with one class is a choice, not a division by zero
        return self.lo == self.hi

    def _where(self, check: str) -> list[tuple[int, ...]]:
        flat = self.positions[check]
        if not flat:
            return []
        if self.shape is None or len(self.shape) <= 1:
            return [(i,) for i in flat] if self.shape != () else [()]
        coords = np.unravel_index(np.asarray(flat, dtype=np.int64), self.shape, order=self.order)
        return [tuple(int(c[j]) for c in coords) for j in range(len(flat))]

    def _what(self) -> str:
        dtype = f"{self.dtype} " if self.dtype is not None else ""
        if self.shape is None:
            return f"{dtype}column".strip()
        return f"{dtype}array of shape {list(self.shape)}"

    def _first(self, check: str) -> str:
        where = self._where(check)
        # (A single value, a 0-d array, has no position worth naming.)
        return f", first at {_fmt_pos(where[0])}" if where and where[0] != () else ""

    def _nan_detail(self) -> str:
        text = f"{_n(self.nan)} NaN of {_n(self.seen)} values ({_pct(self.nan, self.seen)})"
        if self.missing:
            text += f", {_n(self.missing)} of them empty/NA cells (pandas reads them as NaN)"
        return text + self._first("nan")

    def _inf_detail(self) -> str:
        parts = [f"{_n(c)} {s}" for c, s in ((self.posinf, "+Inf"), (self.neginf, "-Inf")) if c]
        signs = " and ".join(parts) if parts else f"{_n(self.posinf)} Inf"
        return f"{signs} of {_n(self.seen)} values{self._first('inf')}"

    def _fp16_detail(self) -> str:
        peak = max(abs(self.lo or 0.0), abs(self.hi or 0.0))
        return (f"{_count(self.fp16, 'finite value')} beyond float16's range (|x| > 65504, largest "
                f"{peak:.4g}): they become Inf under half precision or autocast{self._first('fp16_range')}")

    def _label_detail(self) -> str:
        ignored = ", ".join(str(v) for v in self.options.ignore_labels)
        return (f"{_count(self.bad_labels, 'label')} outside [0, {self.options.num_classes}) (values span "
                f"{self.label_lo}..{self.label_hi}; ignored: {ignored or 'none'}){self._first('label_range')}")

    def _constant_detail(self) -> str:
        return (f"all {_n(self.seen)} values are {self.lo:g}: normalising by its std or max "
                f"divides by zero (NaN)")


def _n(value: int) -> str:
    return f"{value:,}"


def _count(value: int, word: str) -> str:
    return f"{_n(value)} {word}{'' if value == 1 else 's'}"


def _pct(part: int, whole: int) -> str:
    share = 100.0 * part / whole if whole else 0.0
    return f"{share:.3g}%"


def _fmt_pos(pos: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(i) for i in pos) + "]"


def check_array(array: np.ndarray, *, options: CheckOptions = CheckOptions(), is_label: bool = False,
                allow_constant: bool = True, columns: bool = False, on_bytes=None) -> list[Finding]:
    """All checks on one in-memory or memory-mapped array, chunk by chunk."""
    order, chunks = flat_chunks(array, options.chunk_bytes)
    checker = ArrayChecker(array.shape, array.dtype, order=order, options=options,
                           is_label=is_label, allow_constant=allow_constant, columns=columns)
    for chunk, offset in chunks:
        checker.feed(chunk, offset)
        if on_bytes is not None:
            on_bytes(chunk.nbytes)
    return checker.findings()


# A batch of images: (N, C, H, W) or (N, H, W, C), with a few channels and a real picture.
_MAX_CHANNELS = 16
_MIN_SIDE = 4


def channel_axis(shape: Sequence[int]) -> int | None:
    """The channel axis of an image batch, 1 (NCHW) or 3 (NHWC), or None for other arrays."""
    if len(shape) != 4 or shape[0] < 2:
        return None
    n, a, b, c = shape
    nchw = 2 <= a <= _MAX_CHANNELS and min(b, c) >= _MIN_SIDE
    nhwc = 2 <= c <= _MAX_CHANNELS and min(a, b) >= _MIN_SIDE
    if nchw and nhwc and a != c:  # (N, 16, 16, 4): the fewer are the channels
        return 1 if a < c else 3
    if nchw == nhwc:
        return None  # neither, or (N, 3, 8, 3): no honest guess
    return 1 if nchw else 3


# A table of examples by features is read as one when it has at most this many columns.
_MAX_COLUMNS = 4096


class _ChannelRanges:
    """The per-channel range of an image batch, or the per-column range of a table of
    examples by features, fed as flat chunks are: `constant` for the channels or columns
    that hold one value. Per-channel normalisation (`(x - mean[c]) / std[c]`, as
    torchvision's Normalize with statistics computed from the data) and per-feature
    standardisation divide by a zero std there. Reported only for an array that is finite
    and not constant as a whole (those are reported already)."""

    def __init__(self, shape: tuple, axis: int, order: str) -> None:
        self.table = len(shape) == 2
        self.rows = shape[0]
        self.axis = axis
        self.count = shape[axis]
        # Flat indices run through one channel `stride` at a time.
        self.stride = int(np.prod(shape[axis + 1:] if order == "C" else shape[:axis], dtype=np.int64))
        self.lo = np.full(self.count, np.inf)
        self.hi = np.full(self.count, -np.inf)

    @classmethod
    def of(cls, shape, dtype, order: str, columns: bool = False) -> "_ChannelRanges | None":
        axis = channel_axis(shape) if shape is not None else None
        if axis is None and columns and len(shape or ()) == 2 and shape[0] >= 2 and 2 <= shape[1] <= _MAX_COLUMNS:
            axis = 1
        if axis is None or dtype is None or dtype.kind not in "fiu" or order not in ("C", "F"):
            return None
        return cls(shape, axis, order)

    def feed(self, chunk: np.ndarray, offset: int) -> None:
        period = self.stride * self.count  # every channel once
        head = min(chunk.size, (-offset) % period)
        if head:
            self._feed_partly(chunk[:head], offset)
        body, start = chunk[head:], offset + head
        whole = body.size // period * period
        if whole:
            blocks = body[:whole].reshape(-1, self.count, self.stride)
            np.minimum(self.lo, blocks.min(axis=(0, 2)), out=self.lo)
            np.maximum(self.hi, blocks.max(axis=(0, 2)), out=self.hi)
        if whole < body.size:
            self._feed_partly(body[whole:], start + whole)

    def _feed_partly(self, values: np.ndarray, offset: int) -> None:
        channel = (np.arange(offset, offset + values.size, dtype=np.int64) // self.stride) % self.count
        np.minimum.at(self.lo, channel, values)
        np.maximum.at(self.hi, channel, values)

    def findings(self) -> list[Finding]:
        dead = [int(c) for c in np.flatnonzero(self.lo == self.hi)]
        if not dead:
            return []
        if self.table:
            values = ", ".join(f"column {c} is all {self.lo[c].item():g}" for c in dead[:4])
            return [Finding("constant", len(dead),
                            f"{values} (of {self.count} columns, over {self.rows} rows): standardising each feature "
                            f"by its std, `(x - x.mean(0)) / x.std(0)`, divides by zero (NaN)",
                            [(0, c) for c in dead[:5]])]
        layout = "NCHW" if self.axis == 1 else "NHWC"
        values = ", ".join(f"channel {c} is all {self.lo[c].item():g}" for c in dead[:4])
        return [Finding("constant", len(dead),
                        f"{values} (axis {self.axis} of {layout} images, {self.count} channels): normalising "
                        f"per channel by its std divides by zero (NaN)")]


def is_checkable(dtype: np.dtype) -> bool:
    """Numeric or bool: what the checks understand (strings, objects, records are skipped)."""
    return dtype.kind in "fiubc" and dtype.fields is None
