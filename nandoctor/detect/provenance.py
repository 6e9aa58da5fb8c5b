"""Where an op came from: the user's source line, the running module, and for backward ops
the forward line whose autograd node produced them.

Cheap by design: the hot path stores `(code object, line, module name)` per autograd node
and nothing else; a `Location` with the source text is only built for the report.
"""
from __future__ import annotations

import inspect
import linecache
import os
import re
import site
import sys
import sysconfig
import types
import weakref
from pathlib import Path

import torch
from torch.utils.weak import WeakIdKeyDictionary

from nandoctor.detect.compiled import compiling
from nandoctor.detect.records import storage_key
from nandoctor.detect.result import Location

# math.isfinite(x), np.isnan(x), torch.isinf(x), x.isfinite(): a call that tests finiteness
# A test of finiteness, or a function that leaves NaN out on purpose (`np.nanmean(v.numpy())`):
# what it reads, the script knows may be non-finite.
_FINITENESS_TEST = re.compile(
    r"\b(?:is(?:finite|nan|inf|posinf|neginf)|nan(?:mean|sum|std|var|max|min|median|percentile|quantile|prod"
    r"|argmax|argmin|cumsum|cumprod)|nan_to_num)\s*\(")


def _library_dirs() -> tuple[str, ...]:
    """Where library code lives: torch, nandoctor, the stdlib and every installed package
    (Lightning, transformers, Keras...). A user's line is never there: the line reported
    is the innermost frame of the user's own files (an editable install of the user's own
    package lives in their checkout, so it counts as theirs)."""
    paths = sysconfig.get_paths()
    dirs = {
        os.path.dirname(torch.__file__),  # torch itself, also when not in site-packages
        str(Path(__file__).resolve().parent.parent),  # nandoctor
        paths["stdlib"], paths["platstdlib"],  # contextlib, functools, runpy...
        paths["purelib"], paths["platlib"],  # this environment's site-packages
        *site.getsitepackages(),
    }
    if site.ENABLE_USER_SITE:
        dirs.add(site.getusersitepackages())
    return tuple(sorted({os.path.realpath(d) + os.sep for d in dirs if d}))


_LIBRARY_DIRS = _library_dirs()
# torch's own frames are never worth naming as the library that called an op.
_TORCH_DIR = os.path.realpath(os.path.dirname(torch.__file__)) + os.sep
_SITE_PACKAGES_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
# The Python code torch.compile generates (inductor's wrappers, run inside a compiled
# backward with the mode on): torch's code, written to its cache directory.
_GENERATED_MARKERS = tuple(m for m in (os.sep + "torchinductor_", os.environ.get("TORCHINDUCTOR_CACHE_DIR")) if m)
# Where Python hands a backward pass to the autograd engine: frames above it are the caller's.
_ENGINE_ENTRY = torch.autograd.graph._engine_run_backward.__code__


class SourceLocator:
    """Finds the innermost frame of user code (not torch, not nandoctor, not the stdlib)."""

    def __init__(self, display_root: str | None = None, main_file: str | None = None, main_display: str | None = None):
        # Keyed by id, holding the code object (so its id is never reused while here): a
        # code object's hash is computed from its constants at every lookup, ~0.4 µs, and
        # a walk up the stack looks up every frame's.
        self._is_user: dict[int, tuple[types.CodeType, bool]] = {}
        self._is_installed: dict[types.CodeType, bool] = {}
        self._display_root = display_root or os.getcwd()
        self._main_file = main_file
        self._main_display = main_display

    def is_user_code(self, code: types.CodeType) -> bool:
        """Is `code` the script's own (not the standard library's, an installed package's or
        generated code)? Cached per code object."""
        entry = self._is_user.get(id(code))
        if entry is not None:
            return entry[1]
        filename = code.co_filename
        resolved = filename if filename.startswith("<") else os.path.realpath(filename)
        known = not (
            resolved.startswith(_LIBRARY_DIRS)
            or filename.startswith("<frozen")
            or any(m in resolved for m in _SITE_PACKAGES_MARKERS)
            or any(m in resolved for m in _GENERATED_MARKERS)
        )
        self._is_user[id(code)] = (code, known)
        return known

    def user_frame(self, skip: int = 1) -> tuple[types.CodeType, int] | None:
        """(code, line) of the innermost user frame above the caller; None if there is none."""
        frame = sys._getframe(skip + 1)
        while frame is not None:
            code = frame.f_code
            if self.is_user_code(code):
                return code, frame.f_lineno
            frame = frame.f_back
        return None

    def preparing_data(self) -> bool:
        """Is the op preparing data: inside a `Dataset`'s `__init__` (normalising the data it
        will serve), or inside a generator function of the user's, between two of its yields
        (a sample or batch stream written by hand: `def batches(): ... yield x, y`)? Not a
        generator whose loop around the op trains (`def fit(): for ...: loss.backward();
        opt.step(); yield logs`): that is a training loop that reports as it goes. On the
        rare path only: one walk up the stack."""
        frame = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            if code.co_name == "__init__" and isinstance(frame.f_locals.get("self"), torch.utils.data.Dataset):
                return True
            if code.co_flags & inspect.CO_GENERATOR and self.is_user_code(code):
                return not _in_a_training_loop(linecache.getlines(code.co_filename), frame.f_lineno)
            frame = frame.f_back
        return False

    def in_training_loop(self) -> bool:
        """Does a user frame on the stack run inside a `for`/`while` loop whose body trains
        (`loss.backward()`, `opt.step()`, `train_one_epoch(...)`)? Targets encoded in the
        loop before the model's first forward are the step's; the same code run once
        before the loop prepares data. On the rare path only: one walk up the stack."""
        frame = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            if self.is_user_code(code) and _in_a_training_loop(linecache.getlines(code.co_filename), frame.f_lineno):
                return True
            frame = frame.f_back
        return False

    def library_frame(self, skip: int = 1) -> tuple[types.CodeType, int] | None:
        """(code, line) of the innermost frame of an installed framework (Keras, Lightning,
        transformers; not torch) between the op and the user's line, or None when the user's
        code called torch directly. On the rare path only: the lineage keeps it."""
        frame = sys._getframe(skip + 1)
        while frame is not None:
            code = frame.f_code
            if self.is_user_code(code):
                return None
            if self._installed_code(code):
                return code, frame.f_lineno
            frame = frame.f_back
        return None

    def _installed_code(self, code: types.CodeType) -> bool:
        known = self._is_installed.get(code)
        if known is None:  # (realpath is a system call per path component: once per code object)
            filename = code.co_filename
            known = self._is_installed[code] = not filename.startswith("<") and _is_installed(os.path.realpath(filename))
        return known

    def in_own_optimizer(self) -> bool:
        """Is the innermost user frame the script's own code inside a step: a method of an
        optimizer the user wrote (its own `step()`: LARS, SAM by hand), or code a library
        optimizer's step called back (a step hook, a Keras weight constraint), rather than
        the line that called a library optimizer's step?"""
        frame = sys._getframe(1)
        while frame is not None and not self.is_user_code(frame.f_code):
            frame = frame.f_back
        if frame is None:
            return False
        if _an_optimizer(frame.f_locals.get("self")):
            return True
        caller = frame.f_back
        while caller is not None and not self.is_user_code(caller.f_code):
            if _an_optimizer(caller.f_locals.get("self")):
                return True  # (a library optimizer's frame below the user's: it called the user's code)
            caller = caller.f_back
        return False

    def user_frame_inside_backward(self, skip: int = 1) -> tuple[types.CodeType, int] | None:
        """(code, line) of the user's own code running inside backward — a custom
        `Function.backward`, a tensor or module hook — or None when the autograd engine
        runs a built-in formula (the innermost frames below the engine are torch's)."""
        frame = sys._getframe(skip + 1)
        while frame is not None:
            code = frame.f_code
            if code is _ENGINE_ENTRY:
                return None
            if self.is_user_code(code):
                return code, frame.f_lineno
            frame = frame.f_back
        return None

    def location(self, where: tuple[types.CodeType, int] | None) -> Location | None:
        if where is None:
            return None
        code, line = where
        return Location(
            file=self.display_path(code.co_filename),
            line=line,
            function=code.co_name,
            code=linecache.getline(code.co_filename, line).strip(),
        )

    def tests_finiteness(self, where: tuple[types.CodeType, int] | None) -> bool:
        """Does the line test a value's finiteness (`if not math.isfinite(loss.item()):`), run
        in a branch such a test guards (`print(f"skipping: norm {norm.item()}")` under it, or
        under its `else`), or read a value the next lines test (`l = loss.item()`, then `if
        not math.isfinite(l): continue`)? A value read there is read to be checked or
        reported on the way to being discarded, not used."""
        if where is None:
            return False
        code, line = where
        lines = linecache.getlines(code.co_filename)
        return _FINITENESS_TEST.search(linecache.getline(code.co_filename, line)) is not None \
            or _guarded_by_a_finiteness_test(lines, line) or _tested_right_after(lines, line)

    def display_path(self, filename: str) -> str:
        """The path as the user would write it: the script as typed, others relative to cwd."""
        if self._main_file and filename == self._main_file:
            return self._main_display or filename
        for marker in _SITE_PACKAGES_MARKERS:  # an installed package: from its import name
            if marker in filename:
                return filename.rsplit(marker, 1)[1]
        try:
            rel = os.path.relpath(filename, self._display_root)
        except ValueError:
            return filename
        return filename if rel.startswith("..") else rel


_NAME = re.compile(r"[A-Za-z_]\w*")
_LINES_AFTER = 8  # a test of what was read comes soon after the read, or it is not one


def _tested_right_after(lines: list[str], line: int) -> bool:
    """Do the next few lines of the block, before anything trains (`backward()`, a step),
    test the finiteness of a name the read line mentions (`l = loss.item()` then `if not
    math.isfinite(l):`; a running average of `loss.item()` before `if not
    math.isfinite(loss.item()): break`), or skip the batch over the value read (`v =
    loss.item()` then `if v > 20 * ema: continue`: an Inf is above any threshold)?"""
    if not 0 < line <= len(lines):
        return False
    read = lines[line - 1].split("#", 1)[0]
    names = set(_NAME.findall(read)) - _NOT_VALUES
    assigned = set(_NAME.findall(read.split("=", 1)[0])) - _NOT_VALUES if _ASSIGNS.match(read) else set()
    indent, looked = _indent_of(lines[line - 1]), 0
    for index in range(line, len(lines)):
        text = lines[index]
        stripped = text.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if _indent_of(text) < indent or looked >= _LINES_AFTER or _TRAINS.search(stripped):
            return False
        looked += 1
        for test in _FINITENESS_TEST.finditer(stripped):
            if names & set(_NAME.findall(_call_argument(stripped, test.end()))):
                return True
        if assigned and stripped.startswith(("if ", "elif ")) and assigned & set(_NAME.findall(stripped)) \
                and _skips(lines, index):
            return True
    return False


# `v = loss.item()`, `loss_val, n = loss.item(), len(x)`: a read whose value is kept in a name.
_ASSIGNS = re.compile(r"\s*[A-Za-z_][\w, ]*=(?!=)")
_SKIP = re.compile(r"^(continue|break|return)\b")


def _skips(lines: list[str], header: int) -> bool:
    """Does the block under the `if` at index `header` (0-based) leave the iteration
    (`continue`, `break`, `return`), on its own line or after `:` on the header's?"""
    text = lines[header].split("#", 1)[0].rstrip()
    if not text.endswith(":"):  # `if v > t: skipped += 1; continue`, all on the header's line
        return any(_SKIP.match(part.strip()) for part in text.rsplit(":", 1)[-1].split(";"))
    indent = _indent_of(lines[header])
    for text in lines[header + 1:]:
        stripped = text.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if _indent_of(text) <= indent:
            return False
        if any(_SKIP.match(part.strip()) for part in stripped.split(";")):
            return True
    return False


# Words of a read line that name no value tested after it.
_NOT_VALUES = frozenset({"item", "tolist", "numpy", "float", "detach", "cpu", "print", "math", "np", "torch", "self",
                         "if", "not", "and", "or", "is", "in", "None", "True", "False"})


def _call_argument(text: str, start: int) -> str:
    """The text of a call's argument, from just after its `(` to the matching `)`."""
    depth = 1
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return text[start:]


_BRANCH = ("if ", "elif ", "while ")
_SCOPE = ("def ", "async def ", "class ")
_HEADERS_LOOKED_AT = 4  # enclosing blocks: the guard is close to the read, or it is not one


def _guarded_by_a_finiteness_test(lines: list[str], line: int) -> bool:
    """Is source line `line` (1-based) inside an `if`/`elif`/`while` block, or the `else`
    of one, whose condition tests finiteness? Read from the indentation of the lines
    above, up to the enclosing function."""
    if not 0 < line <= len(lines):
        return False
    indent, headers = _indent_of(lines[line - 1]), 0
    for text in reversed(lines[:line - 1]):
        stripped = text.strip()
        if not stripped or stripped.startswith("#") or _indent_of(text) >= indent:
            continue
        indent, headers = _indent_of(text), headers + 1
        if stripped.startswith(_BRANCH) and _FINITENESS_TEST.search(stripped):
            return True
        if stripped.startswith(_SCOPE) or headers >= _HEADERS_LOOKED_AT:
            return False
        if stripped.startswith(("else", "elif ")):
            indent += 1  # (the `if` it belongs to is at its own indentation, above it)
    return False


_LOOP = ("for ", "while ", "async for ")
# A call that trains: backward, an optimizer's or scheduler's step, a train/fit function.
_TRAINS = re.compile(r"\bbackward\(|\.step\(|\btrain\w*\(|\bfit\(")


def _in_a_training_loop(lines: list[str], line: int) -> bool:
    """Is source line `line` (1-based) inside a `for`/`while` loop, up to the enclosing
    function, whose body calls something that trains (see `_TRAINS`)?"""
    if not 0 < line <= len(lines):
        return False
    indent = _indent_of(lines[line - 1])
    for index in range(line - 2, -1, -1):
        stripped = lines[index].strip()
        if not stripped or stripped.startswith("#") or _indent_of(lines[index]) >= indent:
            continue
        indent = _indent_of(lines[index])
        if stripped.startswith(_LOOP) and any(_TRAINS.search(text) for text in _body(lines, index)):
            return True
        if stripped.startswith(_SCOPE):
            return False
    return False


def _body(lines: list[str], header: int):
    """The lines of the block that line index `header` opens."""
    indent = _indent_of(lines[header])
    for text in lines[header + 1:]:
        if text.strip() and not text.strip().startswith("#") and _indent_of(text) <= indent:
            return
        yield text


def _indent_of(text: str) -> int:
    return len(text) - len(text.lstrip())


def _is_installed(resolved: str) -> bool:
    return not resolved.startswith(_TORCH_DIR) and any(m in resolved for m in _SITE_PACKAGES_MARKERS)


class ModuleTracker:
    """Names the innermost running nn.Module from global hooks, with no reference to the model.

    A module's qualified name is learnt the first time it (or a parent) runs: a parent names
    all of its descendants (`encoder.layers.0.self_attn`); a module first seen on its own
    is named by its class.
    """

    def __init__(self) -> None:
        self._names: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()
        self._parameter_names = WeakIdKeyDictionary()
        # Modules called on their own that hold no parameter: a metric (torchmetrics'
        # PearsonCorrCoef), a loss module. What they make is not the model's.
        self._parameter_free_roots: set[str] = set()
        self._stack: list[str] = []
        self._handles: list = []
        self.loading_state = 0  # > 0 inside Module.load_state_dict
        self.ran = False  # a module's forward has run (the model is being trained or used)

    def install(self) -> None:
        from torch.nn.modules import module as nn_module

        self._handles = [
            nn_module.register_module_forward_pre_hook(self._enter),
            nn_module.register_module_forward_hook(self._leave, always_call=True),
        ]
        # A checkpoint is often loaded before the model ever runs: name its parameters
        # then, so a bad value written by load_state_dict is reported by name.
        original = torch.nn.Module.load_state_dict
        tracker = self

        def load_state_dict(module, *args, **kwargs):
            if module not in tracker._names:
                tracker._name_tree(module)
            tracker.loading_state += 1
            try:
                return original(module, *args, **kwargs)
            finally:
                tracker.loading_state -= 1

        torch.nn.Module.load_state_dict = load_state_dict
        self._restore_load = lambda: setattr(torch.nn.Module, "load_state_dict", original)

    def uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._stack.clear()
        restore = getattr(self, "_restore_load", None)
        if restore is not None:
            restore()
            self._restore_load = None

    def parameter_name(self, tensor: torch.Tensor) -> str | None:
        """`encoder.layers.0.linear1.weight` for a parameter or buffer of a module that ran."""
        return self._parameter_names.get(tensor)

    def holds_gradient(self, tensors) -> bool:
        """Is one of `tensors` (or what it views) the `.grad` of a parameter of a module that
        ran? On the rare path only: it looks at every parameter."""
        storages = {storage_key(t) for t in tensors} - {None}
        if not storages:
            return False
        for p in list(self._parameter_names.keys()):
            grad = getattr(p, "grad", None)
            if isinstance(grad, torch.Tensor) and storage_key(grad) in storages:
                return True
        return False

    def building(self) -> bool:
        """Is a module being set up: loading a state dict, or inside an nn.Module's
        `__init__` (on the rare path only: it looks at the Python stack)?"""
        if self.loading_state:
            return True
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_name == "__init__" and isinstance(frame.f_locals.get("self"), torch.nn.Module):
                return True
            frame = frame.f_back
        return False

    def holds_no_parameters(self, name: str) -> bool:
        """Is `name` a module called on its own that holds no parameter (a metric, a loss)?"""
        return name in self._parameter_free_roots

    @property
    def current(self) -> str | None:
        return self._stack[-1] if self._stack else None

    def _enter(self, module: torch.nn.Module, args) -> None:
        if compiling():  # Dynamo traces this hook into the user's graph: leave no trace
            return
        name = self._names.get(module)
        if name is None:
            name = self._name_tree(module)
        self._stack.append(name)
        self.ran = True

    def _leave(self, module, args, output) -> None:
        if self._stack and not compiling():
            self._stack.pop()

    def _name_tree(self, root: torch.nn.Module) -> str:
        compiled = getattr(root, "_orig_mod", None) if type(root).__name__ == "OptimizedModule" else None
        root_name = _keras_layer_name(root) or type(compiled if isinstance(compiled, torch.nn.Module) else root).__name__
        for qualname, sub in root.named_modules():
            if sub is not root:
                self._names[sub] = _without_compile_wrappers(qualname) or root_name
        self._names[root] = root_name
        if next(root.parameters(), None) is None:
            self._parameter_free_roots.add(root_name)
        for qualname, tensor in (*root.named_parameters(), *root.named_buffers()):
            self._parameter_names[tensor] = _without_compile_wrappers(qualname)
        return root_name


def _keras_layer_name(module: torch.nn.Module) -> str | None:
    """A Keras 3 layer's own name (`gem`, `dense_1`) on the torch backend: its layers are
    torch modules a functional Model keeps in its own lists, not as submodules, so each
    is a root of its own; the name the user gave or sees in `model.summary()` says which."""
    name = getattr(module, "name", None)
    keras = any(cls.__module__.startswith("keras.") for cls in type(module).__mro__)
    return name if keras and isinstance(name, str) and name else None


def _without_compile_wrappers(qualname: str) -> str:
    """The name the user knows: torch.compile(module) wraps it, and the wrapper's attribute
    `_orig_mod` is not in the user's code (`_orig_mod.norm` is `norm`)."""
    return ".".join(part for part in qualname.split(".") if part != "_orig_mod")


class NodeSites:
    """Autograd node (by sequence number) -> the forward (code, line, module) that created it.

    During a forward op, autograd has already numbered the node it is building, so
    `_get_sequence_nr() - 1` is that node's number whenever the counter moved since the
    previous op. Two generations are kept (the graph being built and the one being
    differentiated), so memory does not grow with the number of steps.
    """

    limit = 500_000  # nodes per generation; a generation is usually one training step

    def __init__(self) -> None:
        self._current: dict[int, tuple] = {}
        self._previous: dict[int, tuple] = {}
        self.last_seq = -1  # the counter when the last node was noted (read by the hot path)

    def note(self, seq_now: int, site: tuple) -> None:
        # Every node numbered since the last op (a composite op can build several) gets the site.
        for seq in range(max(self.last_seq, seq_now - 4), seq_now):
            self._current[seq] = site
        self.last_seq = seq_now
        if len(self._current) > self.limit:  # graphs built and never differentiated (eval with grad on)
            self.new_generation()

    def note_range(self, first: int, end: int, site: tuple) -> None:
        """Nodes `first`..`end - 1` were all built at `site` (a module region: regions.py)."""
        current = self._current
        for seq in range(first, end):
            current[seq] = site
        self.last_seq = end
        if len(current) > self.limit:
            self.new_generation()

    def __len__(self) -> int:
        return len(self._current) + len(self._previous)

    def get(self, seq: int) -> tuple | None:
        return self._current.get(seq) or self._previous.get(seq)

    def new_generation(self) -> None:
        self._previous, self._current = self._current, {}


def _an_optimizer(obj) -> bool:
    """A torch optimizer, or another framework's (Keras's `BaseOptimizer`), by its classes."""
    if obj is None:
        return False
    return isinstance(obj, torch.optim.Optimizer) or any(c.__name__ in ("Optimizer", "BaseOptimizer")
                                                         for c in type(obj).__mro__[:-1])
