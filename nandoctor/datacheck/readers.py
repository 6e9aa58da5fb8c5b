"""One reader per file format, registered by extension in `READERS`.

Each reader opens its file with the library made for the format and hands every numeric
array (or column) to the checks, chunk by chunk. Optional libraries (Pillow, safetensors,
pyarrow, h5py: the `nandoctor[data]` extra) are imported only when a file needs them; when
one is missing the file gets a `not_checked` problem instead of a crash.

Anything that can hold pickled code is read so that the code cannot run: `.npy`/`.npz`
without `allow_pickle`, `.pt` only through `torch.load(weights_only=True)`.
"""
from __future__ import annotations

import functools
import importlib
import math
import os
import re
import sys
import threading
import warnings
import zipfile
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from nandoctor.datacheck.checks import (
    ArrayChecker,
    CheckOptions,
    Finding,
    check_array,
    is_checkable,
    looks_like_label,
    row_chunks,
)
from nandoctor.datacheck.model import Problem

INSTALL_HINT = "pip install 'nandoctor[data]'"


class MissingLibrary(Exception):
    """An optional reader library is not installed: the file is reported `not_checked`."""


class Unreadable(Exception):
    """The file cannot be read safely or at all; the message is the problem's detail."""


@dataclass
class FileContext:
    """What a reader gets: the file, the options, and where findings go."""

    path: str  # as the user gave it, used both to open and to report
    options: CheckOptions = CheckOptions()
    on_bytes: Callable[[int], None] | None = None
    problems: list[Problem] = field(default_factory=list)
    _head: bytes | None = field(default=None, repr=False)

    def head(self) -> bytes:
        """The file's first bytes, read once: what a file that fails to read really is."""
        if self._head is None:
            self._head = read_head(self.path)
        return self._head

    def not_valid(self) -> Unreadable:
        """`not a valid .npy file (starts with the text 'hello')`: for a file that is not in
        the format its name says, whatever the library reading it would have called it."""
        ext = os.path.splitext(self.path)[1].lower()
        return Unreadable(f"not a valid {ext} file ({starts_with(self.head())})")

    def refused(self, looks_right: bool, library_error: str) -> Unreadable:
        """The error for a file its library refused: the library's words when the file starts
        like its format (then it is damaged, and they say how), else `not_valid()`."""
        return Unreadable(library_error) if looks_right else self.not_valid()

    def add(self, key: str | None, findings: list[Finding]) -> None:
        for f in findings:
            self.problems.append(Problem(self.path, key, f.check, f.count, f.detail, f.positions))

    def problem(self, key: str | None, check: str, detail: str, count: int = 1) -> None:
        self.problems.append(Problem(self.path, key, check, count, detail))

    def check_numpy(self, key: str | None, array: np.ndarray, *, label_name: str | None = None,
                    allow_constant: bool = True, label: bool = False, columns: bool = False) -> None:
        if not is_checkable(array.dtype):
            return
        self.add(key, check_array(array, options=self.options, on_bytes=self.on_bytes,
                                  is_label=label or looks_like_label(label_name or key),
                                  allow_constant=allow_constant, columns=columns))

    def check_rows(self, key: str | None, read_rows, shape, dtype: np.dtype, *,
                   allow_constant: bool = True, columns: bool = False) -> None:
        """Check a source that is read by slicing along axis 0 (HDF5, safetensors)."""
        checker = ArrayChecker(shape, dtype, options=self.options, is_label=looks_like_label(key),
                               allow_constant=allow_constant, columns=columns)
        for chunk, offset in row_chunks(read_rows, shape, dtype.itemsize, self.options.chunk_bytes):
            checker.feed(chunk, offset)
            if self.on_bytes is not None:
                self.on_bytes(chunk.nbytes)
        self.add(key, checker.findings())


Reader = Callable[[FileContext], None]
READERS: dict[str, Reader] = {}


def reader(*extensions: str) -> Callable[[Reader], Reader]:
    def register(fn: Reader) -> Reader:
        for ext in extensions:
            if ext in READERS:
                raise ValueError(f"two readers for {ext}")
            READERS[ext] = fn
        return fn
    return register


def reader_for(path: str) -> Reader | None:
    return READERS.get(os.path.splitext(path)[1].lower())


def optional(module: str, package: str) -> Any:
    """Import an optional reader library, or raise MissingLibrary naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingLibrary(f"{package} is not installed, so this file was not checked: "
                             f"{INSTALL_HINT}") from None


# ---- what a file really is --------------------------------------------------------------

# Enough for every signature below and for a Git LFS pointer's first lines.
HEAD_BYTES = 1024
_LFS_POINTER = (b"version https://git-lfs.github.com/spec/v1", b"version https://hawser.github.com/spec/v1")
_HTML = re.compile(rb"\s*<(?:!doctype\s+html|html[\s>])", re.IGNORECASE)
_NPY_MAGIC = b"\x93NUMPY"
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
# What a file that fails to read as its extension says often is instead; named in the problem.
_SIGNATURES = (
    (_NPY_MAGIC, "a NumPy .npy array"),
    (b"PK\x03\x04", "a zip archive"),
    (b"PK\x05\x06", "an empty zip archive"),
    (b"\x1f\x8b", "gzip-compressed data"),
    (b"BZh", "bzip2-compressed data"),
    (b"\xfd7zXZ\x00", "xz-compressed data"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed data"),
    (_HDF5_MAGIC, "an HDF5 file"),
    (b"PAR1", "a Parquet file"),
    (b"ARROW1", "an Arrow/Feather file"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
)


def read_head(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(HEAD_BYTES)
    except OSError:
        return b""


def not_data(head: bytes) -> str | None:
    """What a file under a data name is when it holds no data at all, whatever its format: a
    Git LFS pointer (cloned without `git lfs pull`) or an HTML page (a download that fetched
    an error or sign-in page). None for anything else."""
    if head.startswith(_LFS_POINTER):
        size = re.search(rb"^size (\d+)\r?$", head, re.MULTILINE)
        real = f" (the real file is {int(size[1]):,} bytes)" if size else ""
        return f"a Git LFS pointer, not the data{real}: run `git lfs pull`"
    if _HTML.match(head.removeprefix(b"\xef\xbb\xbf")):
        return "an HTML page, not the data (a download that fetched an error or sign-in page?)"
    return None


def starts_with(head: bytes) -> str:
    """`starts with the text 'id,x,y'` or `starts with bytes 1f 8b 08 00 ...: gzip-compressed data`."""
    if not head:
        return "it is empty"
    kind = _signature(head)
    text = _as_text(head) if kind is None else None
    if text is not None:
        lines = text.strip().splitlines()
        line = lines[0] if lines else text
        shown = line[:40] + ("..." if len(line) > 40 else "")
        return f"starts with the text {shown!r}"
    shown = " ".join(f"{byte:02x}" for byte in head[:8]) + (" ..." if len(head) > 8 else "")
    return f"starts with bytes {shown}" + (f": {kind}" if kind else "")


def looks_binary(head: bytes) -> bool:
    """NUL bytes or a known binary signature: not a text file in any 8-bit encoding."""
    return b"\x00" in head or _signature(head) is not None


def _signature(head: bytes) -> str | None:
    kind = next((what for magic, what in _SIGNATURES if head.startswith(magic)), None)
    if kind is None and _is_pickle(head):
        kind = "a Python pickle"
    return kind


def _is_pickle(head: bytes) -> bool:
    return len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5  # PROTO 2..5


def _as_text(head: bytes) -> str | None:
    """The head as printable UTF-8 text, or None for binary."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:
            return None
        text = head[:exc.start].decode("utf-8")  # the head cut a character in two
    text = text.removeprefix("\ufeff")
    return text if all(c.isprintable() or c in "\t\n\r" for c in text) else None


# ---- numpy ------------------------------------------------------------------------------


@reader(".npy")
def read_npy(ctx: FileContext) -> None:
    if not ctx.head().startswith(_NPY_MAGIC):
        # np.load would try anything else as a pickle and call it "pickled objects".
        raise ctx.not_valid()
    try:
        # mmap: the checks walk the file in chunks, so memory stays bounded for any size.
        array = np.load(ctx.path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise Unreadable(_numpy_refusal(exc)) from None
    stem = os.path.splitext(os.path.basename(ctx.path))[0]
    _check_numpy_or_fields(ctx, None, array, label_name=stem)


def _check_numpy_or_fields(ctx: FileContext, key: str | None, array: np.ndarray, label_name: str | None) -> None:
    if array.dtype.fields is None:  # (a 2-D array of a data file: examples by features)
        ctx.check_numpy(key, array, label_name=label_name, columns=True)
        return
    for name in array.dtype.names:  # a record array: each field is its own array
        ctx.check_numpy(f"{key}.{name}" if key else name, array[name], label_name=name)


def _numpy_refusal(exc: Exception) -> str:
    text = str(exc)
    if "allow_pickle" in text or "Python objects" in text:
        return "holds pickled Python objects (object dtype); not loaded, since unpickling can run code"
    return f"not a valid .npy array: {text}"


@reader(".npz")
def read_npz(ctx: FileContext) -> None:
    try:
        archive = zipfile.ZipFile(ctx.path)
    except zipfile.BadZipFile as exc:
        raise ctx.refused(ctx.head().startswith(b"PK"), f"not a valid .npz (zip) archive: {exc}") from None
    with archive:
        members = [m for m in archive.infolist() if not m.is_dir()]
        if not members:
            ctx.problem(None, "empty", "the archive holds no arrays")
        for member in members:
            key = member.filename[:-4] if member.filename.endswith(".npy") else member.filename
            try:
                _check_npz_member(ctx, archive, member, key)
            except Exception as exc:  # a bad member must not hide the others
                ctx.problem(key, "unreadable", f"member cannot be read: {_one_line(exc)}")


def _check_npz_member(ctx: FileContext, archive: zipfile.ZipFile, member: zipfile.ZipInfo, key: str) -> None:
    """Stream one member: numpy's own header reader, then the data in chunks (no full load)."""
    fmt = np.lib.format
    with archive.open(member) as stream:
        version = fmt.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(stream)
        else:
            shape = None
        if shape is not None and dtype.hasobject:
            raise Unreadable(_numpy_refusal(ValueError("allow_pickle")))
        if shape is None or dtype.fields is not None:
            stream.close()
            with archive.open(member) as again:  # rare layouts: let numpy read it whole
                _check_numpy_or_fields(ctx, key, np.load(again, allow_pickle=False), label_name=key)
            return
        if not is_checkable(dtype):
            return
        checker = ArrayChecker(shape, dtype, order="F" if fortran else "C", options=ctx.options,
                               is_label=looks_like_label(key), columns=True)
        for chunk, offset in _stream_chunks(stream, dtype, int(np.prod(shape, dtype=np.int64)), ctx.options.chunk_bytes):
            checker.feed(chunk, offset)
            if ctx.on_bytes is not None:
                ctx.on_bytes(chunk.nbytes)
        ctx.add(key, checker.findings())


def _stream_chunks(stream, dtype: np.dtype, count: int, chunk_bytes: int) -> Iterator[tuple[np.ndarray, int]]:
    per_chunk = max(1, chunk_bytes // dtype.itemsize)
    done = 0
    while done < count:
        want = min(per_chunk, count - done)
        data = stream.read(want * dtype.itemsize)
        if len(data) < want * dtype.itemsize:
            raise Unreadable(f"truncated: {count - done:,} of {count:,} values missing")
        yield np.frombuffer(data, dtype=dtype), done
        done += want


# ---- torch ------------------------------------------------------------------------------


@reader(".pt", ".pth")
def read_torch(ctx: FileContext) -> None:
    import pickle

    import torch

    try:
        obj = _torch_load(torch, ctx.path)
    except Exception as exc:  # sorted below; anything else goes on up
        if not _looks_like_torch(ctx.head()):
            raise ctx.not_valid() from None
        if isinstance(exc, pickle.UnpicklingError):
            raise Unreadable(_weights_only_refusal(exc)) from None
        if isinstance(exc, (RuntimeError, EOFError, ValueError)):
            raise Unreadable(f"torch.load failed: {_one_line(exc)}") from None
        raise
    leaves = 0
    for key, value in iter_leaves(obj):
        leaves += 1
        check_leaf(ctx, key, value, weights_file=True)
    if leaves == 0:
        ctx.problem(None, "empty", "the file holds no tensors or numbers")


def _looks_like_torch(head: bytes) -> bool:
    """torch.save's zip format, a legacy pickle, or the oldest tar format."""
    return head.startswith(b"PK\x03\x04") or _is_pickle(head) or head[257:262] == b"ustar"


# The allow-list of safe globals and the warning filters are process-wide, so one thread at
# a time loads a .pt file; the checks of what it holds still run in parallel.
_TORCH_LOAD = threading.Lock()


def _torch_load(torch, path: str):
    # weights_only=True: only tensors, containers, plain values and (with the allow-list
    # below) numpy arrays are rebuilt; any other pickled object is refused before it is
    # created, so nothing in the file runs.
    # mmap=True keeps big checkpoints out of memory; old (non-zip) files do not support it.
    with _TORCH_LOAD, warnings.catch_warnings(), torch.serialization.safe_globals(numpy_safe_globals()):
        # Rebuilding some tensors makes torch warn about itself (TypedStorage deprecated,
        # ComplexHalf or sparse CSR "experimental", a non-writable numpy array): not about the
        # data, and not the user's to act on.
        warnings.simplefilter("ignore", UserWarning)
        try:
            return torch.load(path, weights_only=True, map_location="cpu", mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            return torch.load(path, weights_only=True, map_location="cpu")


@functools.lru_cache(maxsize=1)
def numpy_safe_globals() -> list[tuple[Any, str]]:
    """What torch's weights_only unpickler needs to rebuild numpy arrays and scalars, under
    the names numpy 2 (`numpy._core`) and numpy 1 (`numpy.core`) pickle them with.

    None of them runs code from the file: `_reconstruct` makes an empty array of a given
    shape, `ndarray.__setstate__` copies raw bytes into it, `scalar` reads one value from
    bytes, `dtype` parses a type code. The dtype of Python objects is left off, so an array
    of objects is refused (and any object inside one would meet the same allow-list).
    """
    try:
        multiarray = importlib.import_module("numpy._core.multiarray")
    except ImportError:  # numpy 1.x
        multiarray = importlib.import_module("numpy.core.multiarray")
    allowed: list[tuple[Any, str]] = [(np.ndarray, "numpy.ndarray"), (np.dtype, "numpy.dtype")]
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        allowed += [(multiarray._reconstruct, f"{module}._reconstruct"), (multiarray.scalar, f"{module}.scalar")]
    for code in "?bhilqpBHILQPefdgFDGSUVMm":  # every dtype kind but O (Python objects)
        cls = type(np.dtype(code))
        allowed.append((cls, f"{cls.__module__}.{cls.__qualname__}"))
    return list(dict.fromkeys(allowed))


def _weights_only_refusal(exc: Exception) -> str:
    text = str(exc)
    if "ObjectDType" in text:
        return ("holds a numpy array of Python objects (object dtype); not loaded, since unpickling "
                "can run code")
    culprit = next((line.strip() for line in text.splitlines() if "Unsupported" in line or "GLOBAL" in line), "")
    culprit = culprit.split(" Please")[0].rstrip(".") if culprit else "it is not a plain tensor checkpoint"
    return (f"refused by torch.load(weights_only=True): {culprit}. Nothing in it was run; "
            f"load it yourself only if you trust its source")


def iter_leaves(obj: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """(path, leaf) for the tensors, arrays and numbers in nested dicts/lists/tuples.

    The path reads like Python: `['model']['w']`, `[1]`, `['layers'][0]`.
    """
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from iter_leaves(v, f"{key}[{k!r}]")
    elif isinstance(obj, (list, tuple)) and not _is_namedtuple_size(obj):
        for i, v in enumerate(obj):
            yield from iter_leaves(v, f"{key}[{i}]")
    elif _as_array(obj) is not None:
        yield key, obj


def _is_namedtuple_size(obj: Any) -> bool:
    # torch.Size is a tuple of ints that describes a shape, not data.
    return type(obj).__name__ == "Size"


def _as_array(value: Any) -> np.ndarray | None:
    """A numpy view of a leaf worth checking, or None (strings, None, dtypes, ...)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (bool, int, float, complex, np.number, np.bool_)):
        return np.asarray(value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return tensor_to_numpy(value)
    if hasattr(value, "__array_interface__"):  # PIL images and other array-likes
        return np.asarray(value)
    return None


def tensor_to_numpy(tensor) -> np.ndarray | None:
    import torch

    # Not plain strided memory: no numpy view (and touching a nested tensor warns that its
    # API is a prototype).
    if tensor.layout != torch.strided or tensor.is_nested or tensor.is_quantized or tensor.is_meta:
        return None
    tensor = tensor.detach().cpu()
    if tensor.dtype in (torch.bfloat16,) or "float8" in str(tensor.dtype):
        tensor = tensor.float()  # numpy has no such dtype; float32 holds every value exactly
    elif tensor.dtype == torch.complex32:
        tensor = tensor.to(torch.complex64)
    try:
        return tensor.numpy()
    except (TypeError, RuntimeError):
        return None


def check_leaf(ctx: FileContext, key: str, value: Any, *, weights_file: bool = False) -> None:
    array = _as_array(value)
    if array is None:
        return
    # In a checkpoint, 1-D constants are biases, norm scales and running stats at their
    # initial values: normal, so `constant` is only asked of 2-D and larger tensors there.
    allow_constant = not (weights_file and array.ndim <= 1)
    ctx.check_numpy(key or None, array, allow_constant=allow_constant)


# ---- safetensors ------------------------------------------------------------------------


@reader(".safetensors")
def read_safetensors(ctx: FileContext) -> None:
    optional("safetensors", "safetensors")
    from safetensors import safe_open

    try:
        handle = safe_open(ctx.path, framework="pt", device="cpu")
    except Exception as exc:  # safetensors raises its own SafetensorError for a bad header
        # A safetensors file starts with its header's length (8 bytes) and the JSON header.
        raise ctx.refused(ctx.head()[8:9] == b"{",
                          f"not a valid safetensors file: {_one_line(exc)}") from None
    with handle:
        names = list(handle.keys())
        if not names:
            ctx.problem(None, "empty", "the file holds no tensors")
        for name in names:
            _check_safetensor(ctx, handle, name)


def _check_safetensor(ctx: FileContext, handle, name: str) -> None:
    sliced = handle.get_slice(name)
    shape = tuple(sliced.get_shape())
    if len(shape) == 0:
        check_leaf(ctx, name, handle.get_tensor(name), weights_file=True)
        return

    def read_rows(start, stop):
        return tensor_to_numpy(sliced[start:stop])

    probe = tensor_to_numpy(sliced[0:0])
    if probe is None or not is_checkable(probe.dtype):
        return
    ctx.check_rows(name, read_rows, shape, probe.dtype, allow_constant=len(shape) > 1)


# ---- images -----------------------------------------------------------------------------


@reader(".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
def read_image(ctx: FileContext) -> None:
    optional("PIL", "Pillow")
    from PIL import Image, ImageSequence, UnidentifiedImageError

    try:
        with Image.open(ctx.path) as image:
            frames = getattr(image, "n_frames", 1)
            for index, frame in enumerate(ImageSequence.Iterator(image)):
                frame.load()  # decode everything: a truncated file fails here, not later
                key = f"frame {index}" if frames > 1 else None
                ctx.check_numpy(key, _image_array(frame), label=_is_label_image(ctx, frame))
    except UnidentifiedImageError:
        raise ctx.not_valid() from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise Unreadable(f"image cannot be decoded: {_one_line(exc)}") from None


def _image_array(frame) -> np.ndarray:
    return np.asarray(frame)


# Pillow modes of one integer channel: what a class-index mask is saved as.
_INDEX_MODES = ("L", "P", "I", "I;16")


def _is_label_image(ctx: FileContext, frame) -> bool:
    """With `--num-classes`: is this a class-index mask, a single-channel integer image whose
    name or folder reads like a label (`labels/0001.png`, `0001_gt.png`)? Its values are
    then checked. (Without it an image is only an image: a blank one stays a `constant`
    warning.)"""
    if ctx.options.num_classes is None or frame.mode not in _INDEX_MODES:
        return False
    folder, name = os.path.split(ctx.path)
    return looks_like_label(os.path.splitext(name)[0]) or os.path.basename(folder).lower() in _LABEL_FOLDERS


# Folders whose images are class-index masks (the whole name: `test_class_data` is not one).
_LABEL_FOLDERS = {"label", "labels", "target", "targets", "gt", "gts", "ground_truth", "groundtruth",
                  "segmentationclass", "segmentationclassaug", "label_ids", "labelids"}


# ---- tables -----------------------------------------------------------------------------


@reader(".csv", ".tsv")
def read_csv(ctx: FileContext) -> None:
    if looks_binary(ctx.head()):  # a compressed or binary file would be read as one odd column
        raise ctx.not_valid()
    delimiter = "\t" if ctx.path.lower().endswith(".tsv") else ","
    try:
        importlib.import_module("pyarrow.csv")
    except ImportError:
        _read_csv_stdlib(ctx, delimiter)
        return
    _read_csv_arrow(ctx, delimiter)


def _read_csv_arrow(ctx: FileContext, delimiter: str) -> None:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    parse = pacsv.ParseOptions(delimiter=delimiter)
    try:
        _check_batches(ctx, pacsv.open_csv(ctx.path, parse_options=parse))
    except pa.ArrowInvalid as exc:
        if "conversion error" not in str(exc):
            raise ctx.refused(not looks_binary(ctx.head()), f"not a valid table: {_one_line(exc)}") from None
        # The streaming reader guesses column types from the first block; a later block
        # that disagrees (1.5 in a column of ints) is read again with ints widened to float;
        # one that still disagrees (a stray `?` in a column of floats) as text, every
        # column, each then read as numbers where it holds numbers (see _NumbersInText).
        ctx.problems.clear()
        try:
            _check_batches(ctx, pacsv.open_csv(ctx.path, parse_options=parse,
                                               convert_options=_widened_types(ctx.path, parse)))
        except pa.ArrowInvalid as again:
            if "conversion error" not in str(again):
                raise
            ctx.problems.clear()
            names = pacsv.open_csv(ctx.path, parse_options=parse).schema.names
            as_text = pacsv.ConvertOptions(column_types={name: pa.string() for name in names})
            _check_batches(ctx, pacsv.open_csv(ctx.path, parse_options=parse, convert_options=as_text))


def _widened_types(path: str, parse):
    import pyarrow as pa
    import pyarrow.csv as pacsv

    schema = pacsv.open_csv(path, parse_options=parse).schema
    types = {f.name: pa.float64() for f in schema if pa.types.is_integer(f.type)}
    return pacsv.ConvertOptions(column_types=types)


def _check_batches(ctx: FileContext, batches) -> None:
    """Check each numeric column of a stream of record batches with one checker per column,
    nested ones included: a struct's fields (`meta.score`) and the values of a list column
    (`embedding[]`, an embedding stored per row), each a column of its own."""
    import pyarrow as pa

    schema = batches.schema
    checkers: dict[str, ArrayChecker] = {}
    offsets: dict[str, int] = {}
    texts: dict[str, _NumbersInText] = {}
    rows = 0
    for batch in batches:
        for arrow_field, column in zip(schema, batch.columns):
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                text = texts.get(arrow_field.name)
                if text is None:
                    text = texts[arrow_field.name] = _NumbersInText(arrow_field.name, ctx.options)
                if not text.is_text:  # (a column found to be text is not converted again)
                    text.feed(column)
                continue
            for key, values in _leaf_columns(column, arrow_field.name):
                checker = checkers.get(key)
                if checker is None:
                    checker = checkers[key] = ArrayChecker(None, _numpy_dtype(values.type), options=ctx.options,
                                                           is_label=looks_like_label(key))
                # (a top-level column's positions are rows; a nested one's count its values)
                offset = offsets.get(key, rows if key == arrow_field.name else 0)
                _feed_column(checker, values, offset)
                offsets[key] = offset + len(values)
        rows += batch.num_rows
        if ctx.on_bytes is not None:
            ctx.on_bytes(batch.nbytes)
    if rows == 0:
        ctx.problem(None, "empty", f"the table has {len(schema)} columns and no rows")
        return
    for name, checker in checkers.items():
        ctx.add(name, checker.findings())
    for name, text in texts.items():
        ctx.add(name, text.findings())


class _NumbersInText:
    """A text column that holds numbers but for a few cells (`?`, `n/a*`, `1,5`): pandas
    reads it as text (object), and the script's `astype(float)` raises on those cells, or
    `pd.to_numeric(errors="coerce")` makes NaN of them. Its cells are read as numbers one
    by one (empty cells and NA markers are missing values, NaN, as in a numeric column),
    the numbers checked as a numeric column's are, and the cells that are no number are
    `non_numeric`. A column where more than a tenth of the cells (and more than one) are
    no number is text: given up on (from its first thousand cells on, so a long text
    column costs little)."""

    _TEXT_SHARE = 0.1
    _DECIDE_AFTER = 1000

    def __init__(self, key: str, options: CheckOptions) -> None:
        self.key, self.options = key, options
        self.checker = ArrayChecker(None, np.dtype(np.float64), options=options, is_label=looks_like_label(key))
        self.offset = self.numbers = self.bad = 0
        self.bad_positions: list[tuple[int]] = []
        self.examples: list[str] = []
        self.is_text = False

    def feed(self, column) -> None:
        """The column's next cells (an Arrow string array), a thousand at a time until it
        is decided, so a text column is given up on after its first thousand."""
        step = max(1, len(column) if self.offset >= self._DECIDE_AFTER else self._DECIDE_AFTER)
        for start in range(0, len(column), step):
            if self.is_text:
                return
            self._feed_cells(column.slice(start, step).to_pylist())

    def _feed_cells(self, cells: list) -> None:
        values = np.empty(len(cells), dtype=np.float64)
        for i, cell in enumerate(cells):
            number = _number_in(cell)
            if number is None:
                self._not_a_number(cell, self.offset + i)
                number = 0.0  # (a finite stand-in keeps the other cells' positions)
            else:
                self.numbers += 1
            values[i] = number
        self.checker.feed(values, self.offset)
        self.offset += len(cells)
        if self.offset >= self._DECIDE_AFTER and self._mostly_text():
            self.is_text = True

    def _mostly_text(self) -> bool:
        return self.bad > max(1, self._TEXT_SHARE * self.offset)

    def _not_a_number(self, cell, position: int) -> None:
        self.bad += 1
        if len(self.bad_positions) < self.options.max_positions:
            self.bad_positions.append((position,))
        if len(self.examples) < 3 and repr(cell) not in self.examples:
            self.examples.append(repr(cell))

    def findings(self) -> list[Finding]:
        if self.is_text or not self.numbers or self._mostly_text():
            return []
        found = self.checker.findings()
        if self.bad:
            found.append(Finding(
                "non_numeric", self.bad,
                f"{self.bad} of {self.offset} cells are not numbers in a column of numbers ({', '.join(self.examples)}): "
                "pandas reads the column as text; `astype(float)` raises on them, `pd.to_numeric(errors='coerce')` "
                "makes them NaN", self.bad_positions))
        return found


def _number_in(cell) -> float | None:
    """A CSV cell as a number (NaN for an empty cell or an NA marker), or None."""
    text = (cell or "").strip()
    if not text or text.upper() in ("NA", "N/A", "NULL", "NONE"):
        return math.nan
    try:
        return float(text)
    except ValueError:
        return None


def _leaf_columns(column, key: str):
    """(key, numeric array) for `column` and whatever it nests: struct fields by name, the
    values of list, large-list and fixed-size-list columns under `key[]`."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_struct(kind):
        for i in range(kind.num_fields):
            yield from _leaf_columns(column.field(i), f"{key}.{kind.field(i).name}")
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        yield from _leaf_columns(column.flatten(), f"{key}[]")
    elif _numpy_dtype(kind) is not None:
        yield key, column


def _numpy_dtype(arrow_type) -> np.dtype | None:
    import pyarrow as pa

    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or pa.types.is_boolean(arrow_type):
        return np.dtype(arrow_type.to_pandas_dtype())
    if pa.types.is_null(arrow_type):
        # Every cell empty or NaN: Arrow cannot tell its type, pandas reads a float column of NaN.
        return np.dtype(np.float64)
    return None


def _feed_column(checker: ArrayChecker, column, row_offset: int) -> None:
    if column.null_count:
        # Missing cells become NaN wherever the table is loaded (pandas, to_numpy): count them as NaN.
        checker.feed_missing(column.null_count)
        values = column.cast("float64").to_numpy(zero_copy_only=False)
    else:
        values = column.to_numpy(zero_copy_only=False)
    checker.feed(np.ascontiguousarray(values), row_offset)


def _read_csv_stdlib(ctx: FileContext, delimiter: str) -> None:
    """Fallback without pyarrow: the csv module, one float conversion per cell."""
    import csv

    with open(ctx.path, newline="", encoding="utf-8", errors="replace") as handle:
        rows = csv.reader(handle, delimiter=delimiter)
        header = next(rows, None)
        if header is None:
            ctx.problem(None, "empty", "the table has no header and no rows")
            return
        columns: list[list[float]] = [[] for _ in header]
        numeric = [True] * len(header)
        count = 0
        for row in rows:
            count += 1
            for i, cell in enumerate(row[:len(header)]):
                if numeric[i]:
                    numeric[i] = _append_float(columns[i], cell)
    if count == 0:
        ctx.problem(None, "empty", f"the table has {len(header)} columns and no rows")
        return
    for name, values, ok in zip(header, columns, numeric):
        if ok and values:
            ctx.check_numpy(name, np.asarray(values, dtype=np.float64))


def _append_float(values: list[float], cell: str) -> bool:
    text = cell.strip()
    try:
        values.append(float(text) if text and text.upper() not in ("NA", "N/A", "NULL") else float("nan"))
        return True
    except ValueError:
        return False


@reader(".jsonl", ".ndjson")
def read_json_lines(ctx: FileContext) -> None:
    """One JSON record per line (Python's json reads NaN, Infinity and -Infinity, as pandas
    and json.dumps write them). Every numeric field is a column, named by its path in the
    record (`label`, `meta.score`); a list of numbers is one column of all its values."""
    if looks_binary(ctx.head()):
        raise ctx.not_valid()
    import json

    def records():
        with open(ctx.path, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except ValueError as exc:
                    raise Unreadable(f"line {number} is not JSON: {_one_line(exc)}") from None

    _check_json_records(ctx, records())


@reader(".json")
def read_json(ctx: FileContext) -> None:
    """A JSON document: a list of records (`df.to_json(orient="records")`, exported
    datasets) is read as JSON lines are; an object, as one record whose fields are the
    columns (`{"x": [[...], ...], "y": [...]}`, or `{"train": [records...]}`)."""
    if looks_binary(ctx.head()):
        raise ctx.not_valid()
    import json

    try:
        with open(ctx.path, encoding="utf-8", errors="replace") as handle:
            document = json.load(handle)
    except ValueError as exc:
        raise Unreadable(f"not JSON: {_one_line(exc)}") from None
    _check_json_records(ctx, document if isinstance(document, list) else [document])


def _check_json_records(ctx: FileContext, records) -> None:
    """Every numeric field of the records is a column, checked in chunks."""
    columns: dict[str, _JsonColumn] = {}
    count = 0
    for record in records:
        count += 1
        for key, value in _json_numbers(record, ""):
            column = columns.get(key)
            if column is None:
                column = columns[key] = _JsonColumn(ArrayChecker(None, np.dtype(np.float64), options=ctx.options,
                                                                 is_label=looks_like_label(key), allow_constant=False))
            column.add(value)
    if count == 0:
        ctx.problem(None, "empty", "the file holds no JSON records")
        return
    for key, column in columns.items():
        column.flush()
        ctx.add(key, column.checker.findings())


class _JsonColumn:
    """The numbers of one field, fed to its checker in chunks (memory stays bounded)."""

    def __init__(self, checker: ArrayChecker) -> None:
        self.checker, self.values, self.offset = checker, [], 0

    def add(self, values: list[float]) -> None:
        self.values += values
        if len(self.values) >= 65536:
            self.flush()

    def flush(self) -> None:
        if self.values:
            self.checker.feed(np.asarray(self.values, dtype=np.float64), self.offset)
            self.offset += len(self.values)
            self.values = []


def _json_numbers(value: Any, key: str) -> Iterator[tuple[str, list[float]]]:
    """(field path, its numbers) for each numeric field of a JSON record."""
    if isinstance(value, dict):
        for name, inner in value.items():
            yield from _json_numbers(inner, f"{key}.{name}" if key else str(name))
    elif isinstance(value, list):
        numbers = [_as_float(v) for v in value if _is_number(v)]
        if numbers:
            yield key or "[]", numbers
        for inner in value:
            if isinstance(inner, (dict, list)):
                yield from _json_numbers(inner, key)
    elif _is_number(value):
        yield key or "value", [_as_float(value)]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer beyond float64: Inf once a loader turns it into floats
        return math.inf if value > 0 else -math.inf


@reader(".parquet")
def read_parquet(ctx: FileContext) -> None:
    optional("pyarrow", "pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(ctx.path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ctx.refused(ctx.head().startswith(b"PAR1"),
                          f"not a valid parquet file: {_one_line(exc)}") from None
    with parquet:
        _check_batches(ctx, _BatchStream(parquet.schema_arrow, parquet.iter_batches(batch_size=65536)))


@reader(".feather", ".arrow", ".ipc")
def read_arrow(ctx: FileContext) -> None:
    optional("pyarrow", "pyarrow")
    import pyarrow as pa
    import pyarrow.ipc as ipc

    with pa.memory_map(ctx.path, "r") as source:
        try:
            reader_ = ipc.open_file(source)
            batches = _BatchStream(reader_.schema, (reader_.get_batch(i) for i in range(reader_.num_record_batches)))
        except pa.ArrowInvalid:
            source.seek(0)
            try:
                batches = ipc.open_stream(source)  # the Arrow streaming format
            except (pa.ArrowInvalid, OSError) as exc:
                # The file format starts with ARROW1, the stream format with a 0xFFFFFFFF marker.
                looks_right = ctx.head().startswith((b"ARROW1", b"\xff\xff\xff\xff"))
                raise ctx.refused(looks_right, f"not an Arrow/Feather v2 file: {_one_line(exc)}") from None
        _check_batches(ctx, batches)


@dataclass
class _BatchStream:
    schema: Any
    batches: Any

    def __iter__(self):
        return iter(self.batches)


# ---- HDF5 -------------------------------------------------------------------------------


@reader(".h5", ".hdf5")
def read_hdf5(ctx: FileContext) -> None:
    h5py = optional("h5py", "h5py")
    try:
        handle = h5py.File(ctx.path, "r")
    except OSError as exc:
        head = ctx.head()  # the signature is at 0, or at 512 after a user block
        looks_right = head.startswith(_HDF5_MAGIC) or head[512:520] == _HDF5_MAGIC
        raise ctx.refused(looks_right, f"not a valid HDF5 file: {_one_line(exc)}") from None
    with handle:
        datasets: list[Any] = []
        handle.visititems(lambda name, obj: datasets.append(obj) if isinstance(obj, h5py.Dataset) else None)
        if not datasets:
            ctx.problem(None, "empty", "the file holds no datasets")
        for dataset in datasets:
            try:
                _check_h5_dataset(ctx, dataset)
            except Exception as exc:  # one broken dataset must not hide the others
                ctx.problem(dataset.name, "unreadable", f"dataset cannot be read: {_one_line(exc)}")


def _check_h5_dataset(ctx: FileContext, dataset) -> None:
    if dataset.dtype.fields is not None:
        _check_h5_fields(ctx, dataset)
        return
    if not is_checkable(dataset.dtype):
        return
    if dataset.shape is None:  # an HDF5 "null" dataspace: no data at all
        ctx.problem(dataset.name, "empty", "dataset has a null dataspace")
        return

    def read_rows(start, stop):
        return dataset[()] if start is None else dataset[start:stop]

    ctx.check_rows(dataset.name, read_rows, dataset.shape, dataset.dtype, columns=True)


def _check_h5_fields(ctx: FileContext, dataset) -> None:
    """A compound dataset (a table of records, as pandas' and PyTables' writers store
    them): each numeric field is its own array, `/table.x`, as a structured .npy's are."""
    if dataset.shape is None:
        ctx.problem(dataset.name, "empty", "dataset has a null dataspace")
        return
    for name in dataset.dtype.names:
        field = dataset.dtype.fields[name][0]  # (a field may hold a subarray: `('x', 'f4', (3,))`)
        if not is_checkable(field.base):
            continue

        def read_rows(start, stop, name=name):
            return np.asarray((dataset[()] if start is None else dataset[start:stop])[name])

        ctx.check_rows(f"{dataset.name}.{name}", read_rows, dataset.shape + field.shape, field.base)


# ---- helpers ----------------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    text = text if len(text) <= 200 else text[:197] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
