"""`nandoctor check-data train.py:make_dataset`: check every sample of a Python dataset.

The target is `FILE.py:NAME` or `package.module:NAME` (NAME may be dotted). The file is
imported as an ordinary module, never as `__main__`, so the training code under
`if __name__ == "__main__":` does not run. NAME is a map-style or iterable torch Dataset
(any object with `__len__` and `__getitem__` will do), a DataLoader (its dataset is used),
or a callable returning one.

Problems are grouped per key (the nested path inside a sample, e.g. `[1]`, `['mask']`) and
check; positions start with the sample index.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from nandoctor.datacheck.checks import CheckOptions, Finding, check_array, is_checkable, looks_like_label
from nandoctor.datacheck.model import Problem
from nandoctor.datacheck.readers import _as_array, _one_line, iter_leaves
from nandoctor.errors import UsageError

_NAME = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_TARGET = re.compile(rf"(?P<source>.+):(?P<attr>{_NAME})")


@dataclass(frozen=True)
class Target:
    text: str  # as the user typed it; reported as the problem's file
    source: str  # a .py file or a dotted module name
    attr: str

    @property
    def is_file(self) -> bool:
        return self.source.endswith(".py") or os.sep in self.source or "/" in self.source


def parse_target(text: str) -> Target | None:
    """A `source:name` target, or None when `text` does not look like one."""
    match = _TARGET.fullmatch(text)
    if match is None:
        return None
    target = Target(text, match["source"], match["attr"])
    if target.is_file or re.fullmatch(_NAME, target.source):
        return target
    return None


# ---- loading ----------------------------------------------------------------------------


@contextmanager
def user_import_path(directory: str) -> Iterator[None]:
    """The user's folder first on sys.path (as `python train.py` would have it), and an argv
    without nandoctor's options, for the time the user's code runs; restored afterwards."""
    saved_path, saved_argv = list(sys.path), list(sys.argv)
    sys.path.insert(0, directory)
    try:
        yield
    finally:
        sys.path[:], sys.argv[:] = saved_path, saved_argv


def load_object(target: Target) -> Any:
    """Import the target's module (not as __main__) and return the named object."""
    if target.is_file:
        sys.argv[:] = [target.source]
        module = _import_file(target.source)
    else:
        sys.argv[:] = [target.source]
        module = _import_module(target.source)
    obj: Any = module
    for part in target.attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"{target.source} has no attribute '{target.attr}'") from None
    return obj


def _import_file(path: str):
    if not os.path.isfile(path):
        raise UsageError(f"no such file: {path}")
    stem = os.path.splitext(os.path.basename(path))[0]
    name = stem if stem.isidentifier() and stem not in sys.modules else f"_nandoctor_target_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {path}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickle look the module up by name
    try:
        spec.loader.exec_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit from module-level argparse too
        sys.modules.pop(name, None)
        raise UsageError(f"importing {path} failed: {_user_error(exc, path)}") from None
    return module


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise UsageError(f"no module named '{exc.name}' (looked in {os.getcwd()} and sys.path)") from None
        raise UsageError(f"importing {name} failed: {_user_error(exc, None)}") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        raise UsageError(f"importing {name} failed: {_user_error(exc, None)}") from None


def _user_error(exc: BaseException, path: str | None) -> str:
    """`TypeError: ... (train.py:12)`: the error and the deepest line of the user's code."""
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} ({exc.filename}:{exc.lineno})"
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r}) while being imported"
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if "importlib" not in f.filename and "nandoctor" not in f.filename]
    where = f" ({user[-1].filename}:{user[-1].lineno})" if user else ""
    return f"{_one_line(exc)}{where}"


def as_dataset(obj: Any, target: Target) -> Any:
    """The dataset behind the object: itself, a DataLoader's dataset, or a factory's result."""
    for _ in range(3):  # a factory may return a DataLoader; no deeper
        if _is_dataloader(obj):
            obj = obj.dataset
        if not isinstance(obj, type) and (_is_map_style(obj) or _is_iterable_dataset(obj)):
            return obj
        if not callable(obj):
            break
        try:
            obj = obj()
        except TypeError as exc:
            raise UsageError(f"{target.text}: calling it failed ({_one_line(exc)}); "
                             "give a dataset or a function that needs no arguments") from None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001
            raise UsageError(f"{target.text}: building the dataset failed: {_user_error(exc, None)}") from None
    raise UsageError(f"{target.text} is a {type(obj).__name__}, not a dataset "
                     "(expected __len__ and __getitem__, an IterableDataset, or a function returning one)")


def _is_dataloader(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.utils.data.DataLoader)


def _is_map_style(obj: Any) -> bool:
    return hasattr(type(obj), "__getitem__") and hasattr(type(obj), "__len__")


def _is_iterable_dataset(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.utils.data.IterableDataset):
        return True
    return hasattr(type(obj), "__iter__") and not isinstance(obj, (str, bytes, dict))


# ---- checking ---------------------------------------------------------------------------


@dataclass
class _Group:
    """Findings of one (key, check) across samples."""

    count: int = 0
    samples: list[int] = field(default_factory=list)
    positions: list[tuple[int, ...]] = field(default_factory=list)
    first_detail: str = ""


@dataclass
class SampleChecker:
    target: Target
    options: CheckOptions
    groups: dict[tuple[str | None, str], _Group] = field(default_factory=dict)
    failures: list[tuple[int, str]] = field(default_factory=list)
    failed: int = 0
    total: int = 0

    def check_sample(self, index: int, sample: Any) -> None:
        self.total += 1
        for key, leaf in iter_leaves(sample):
            array = _as_array(leaf)
            if array is None or not is_checkable(array.dtype) or array.size == 0:
                continue  # a zero-size tensor (no boxes in this image) is normal in a sample
            label = looks_like_label(key) or _is_last_of_pair(sample, key, array)
            for finding in check_array(array, options=self.options, is_label=label):
                self._add(key or None, finding, index)

    def sample_failed(self, index: int, exc: BaseException) -> None:
        self.total += 1
        self.failed += 1
        if len(self.failures) < self.options.max_positions:
            self.failures.append((index, _user_error(exc, None)))

    def _add(self, key: str | None, finding: Finding, index: int) -> None:
        group = self.groups.setdefault((key, finding.check), _Group(first_detail=finding.detail))
        group.count += finding.count
        group.samples.append(index)
        room = self.options.max_positions - len(group.positions)
        group.positions.extend((index, *p) for p in (finding.positions or [()])[:max(room, 0)])

    def problems(self) -> list[Problem]:
        found = [self._problem(key, check, group) for (key, check), group in self.groups.items()]
        if self.failed:
            first_index, first_error = self.failures[0]
            found.append(Problem(
                self.target.text, None, "unreadable", self.failed,
                f"{self.failed:,} of {self.total:,} samples raised an exception; "
                f"sample {first_index}: {first_error}",
                [(i,) for i, _ in self.failures]))
        if self.total == 0:
            found.append(Problem(self.target.text, None, "empty", 1, "the dataset has no samples"))
        return found

    def _problem(self, key: str | None, check: str, group: _Group) -> Problem:
        shown = ", ".join(str(i) for i in group.samples[:self.options.max_positions])
        more = ", ..." if len(group.samples) > self.options.max_positions else ""
        detail = (f"{check} in {len(group.samples):,} of {self.total:,} samples (samples {shown}{more}); "
                  f"first: {group.first_detail}")
        return Problem(self.target.text, key, check, group.count, detail, group.positions)


def _is_last_of_pair(sample: Any, key: str, array: np.ndarray) -> bool:
    """`(input, label)` samples: an integer last element of a tuple/list is the label."""
    if not isinstance(sample, (tuple, list)) or len(sample) < 2 or array.dtype.kind not in "iu":
        return False
    return key == f"[{len(sample) - 1}]"


def check_dataset(target: Target, options: CheckOptions,
                  on_sample: Callable[[int, int | None], None] | None = None) -> list[Problem]:
    """Load the target and check every sample; user errors become UsageError."""
    directory = os.path.dirname(os.path.abspath(target.source)) if target.is_file else os.getcwd()
    with user_import_path(directory):
        dataset = as_dataset(load_object(target), target)
        checker = SampleChecker(target, options)
        for index, sample in _samples(dataset, checker, target):
            checker.check_sample(index, sample)
            if on_sample is not None:
                on_sample(index, checker.total)
    return checker.problems()


def _samples(dataset: Any, checker: SampleChecker, target: Target) -> Iterator[tuple[int, Any]]:
    if _is_map_style(dataset):
        try:
            size = len(dataset)
        except Exception as exc:  # noqa: BLE001
            raise UsageError(f"{target.text}: len(dataset) failed: {_user_error(exc, None)}") from None
        for index in range(size):
            try:
                sample = dataset[index]
            except Exception as exc:  # noqa: BLE001 - a broken sample is a finding, not the end
                checker.sample_failed(index, exc)
                continue
            yield index, sample
        return
    iterator = iter(dataset)
    index = 0
    while True:
        try:
            sample = next(iterator)
        except StopIteration:
            return
        except Exception as exc:  # noqa: BLE001 - an iterator cannot go on after raising
            checker.sample_failed(index, exc)
            return
        yield index, sample
        index += 1
