"""Where numpy made a non-finite value, from the floating-point errors it reports.

numpy computes outside torch, so no op of it is seen; but its ufuncs report when they make
a NaN or an Inf ("divide by zero encountered in log", "invalid value encountered in
divide", "overflow encountered in exp"), from the script's line that called them. When a
non-finite value then enters torch (`torch.from_numpy(feats)`), the line that made it is
the one numpy reported at, not the one that wrapped the array: that is what the report names.

Scripts silence these reports as often as not, and the line is wanted most then. Two ways
of silencing are seen through, neither changing what the script shows or computes:
- a warnings filter (`warnings.simplefilter("ignore")`, `catch_warnings`): the warning is
  read before the filters decide, by an entry kept first in `warnings.filters` that matches
  nothing (Python asks each entry's message pattern in turn until one matches);
- `np.errstate(divide="ignore", ...)`: inside the block numpy writes its report to a log
  object instead of dropping it (its `"log"` mode), whose `write` only takes note.
  `np.geterr()` inside such a block reads "log" where the script asked for "ignore": the
  one thing a script could notice.
Only the script's own lines count (the first Python frame above the ufunc and numpy's own
Python code, such as the division of `arr.mean()` of an empty selection, is the script's),
not pandas' or scipy's internals, which make and handle NaN on purpose. Under the default
filter a line's repeated warning is not raised again, so a line is noted the first time it
makes a NaN or an Inf; `np.seterr` set for the whole script is not seen through.
"""
from __future__ import annotations

import collections
import contextlib
import sys
import warnings
from dataclasses import dataclass

from nandoctor.detect.imports import ImportPatches
from nandoctor.detect.provenance import SourceLocator

# What each report says a ufunc made: "divide by zero" and "overflow" an Inf, "invalid
# value" a NaN (0/0, log of a negative, inf - inf).
_MAKES = {"divide by zero": "inf", "overflow": "inf", "invalid value": "nan"}
_KEPT = 16
# ufuncs whose "invalid value" needs an infinite operand (inf - inf, 0 * inf, a sum over
# +inf and -inf): from finite operands they make no NaN. (divide's 0/0, log's and sqrt's
# negatives, arccos' |x| > 1 do.)
_NAN_ONLY_FROM_INFINITIES = {"add", "subtract", "multiply", "reduce", "scalar add", "scalar subtract",
                             "scalar multiply"}
_SEEN_THROUGH = ("divide", "over", "invalid")  # errstate's categories that can make NaN or Inf


@dataclass(frozen=True)
class NumpyWarning:
    where: tuple  # (code, line) of the script's line that called numpy
    message: str  # "divide by zero encountered in log"
    makes: str  # "nan" or "inf"
    step: int | None  # the training step it came in


class NumpyWarnings:
    def __init__(self, locator: SourceLocator, step_now) -> None:
        self._locator = locator
        self._step_now = step_now
        self._seen: collections.deque[NumpyWarning] = collections.deque(maxlen=_KEPT)
        self._tap = _FilterTap(self._note)
        self._imports = ImportPatches()
        self._errstate = None  # (numpy module, its own errstate) while ours stands in for it

    def install(self) -> None:
        self._tap.install()
        self._imports.when_imported("numpy", self._see_through_errstate)

    def uninstall(self) -> None:
        self._tap.uninstall()
        self._imports.uninstall()
        if self._errstate is not None:
            numpy, errstate = self._errstate
            numpy.errstate = errstate
            self._errstate = None

    def _note(self, text: str, frame) -> None:
        """numpy reported `text` from `frame`'s line: noted when that line is the script's."""
        makes = next((v for k, v in _MAKES.items() if text.startswith(k)), None)
        if makes is None or " encountered" not in text:
            return
        frame = _above_numpy(frame)
        if frame is None or not self._locator.is_user_code(frame.f_code):
            return
        self._seen.append(NumpyWarning((frame.f_code, frame.f_lineno), text, makes, self._step_now()))

    def _see_through_errstate(self, numpy) -> None:
        errstate = getattr(numpy, "errstate", None)
        if not isinstance(errstate, type) or self._errstate is not None:
            return
        noted = _NoteLog(self._note)

        class errstate_seen(errstate):  # (the name numpy's own repr and errors use)
            __slots__ = ()

            def __init__(self, *, call=_UNSET, all=None, **categories):
                if call is _UNSET:  # (a block with its own callback is the script's own business)
                    call = _log_ignored(categories, all, noted)
                if call is _UNSET:
                    super().__init__(all=all, **categories)
                else:
                    super().__init__(call=call, all=all, **categories)

        errstate_seen.__name__ = errstate_seen.__qualname__ = errstate.__name__
        errstate_seen.__module__ = errstate.__module__
        errstate_seen.__doc__ = errstate.__doc__
        self._errstate = (numpy, errstate)
        numpy.errstate = errstate_seen

    @contextlib.contextmanager
    def caught(self):
        """numpy's floating-point errors noted however the script silenced them, while
        nandoctor fetches a bad sample again (its own re-run, where numpy may be told to
        call back for every category: `np.seterr` included)."""
        numpy = sys.modules.get("numpy")
        if numpy is None:
            yield
            return
        previous = numpy.geterrcall()
        numpy.seterrcall(self._called)
        try:
            with numpy.errstate(divide="call", invalid="call", over="call"):
                yield
        finally:
            numpy.seterrcall(previous)

    def _called(self, kind: str, flag: int) -> None:
        makes = _MAKES.get(kind)
        where = self._locator.user_frame(1)
        if makes is not None and where is not None:
            self._seen.append(NumpyWarning(where, f"{kind} encountered", makes, self._step_now()))

    def made(self, nan: bool, step: int | None) -> NumpyWarning | None:
        """The latest report of this step that says numpy made what a value holds: a NaN
        (`nan`) or only infinities. A NaN that only infinities can make (`inf - inf` in
        `(x - x.mean()) / x.std()` over a column of `log(0)`) is where an Inf went on: the
        line that made the Inf, reported before it in the step, is the one to change."""
        wanted = "nan" if nan else "inf"
        this_step = [w for w in self._seen if w.step == step]
        index = next((i for i in reversed(range(len(this_step))) if this_step[i].makes == wanted), None)
        if index is None:
            return None
        found = this_step[index]
        if nan and found.message.rpartition(" encountered in ")[2] in _NAN_ONLY_FROM_INFINITIES:
            return next((w for w in reversed(this_step[:index]) if w.makes == "inf"), found)
        return found


_UNSET = object()


def _above_numpy(frame):
    """The first frame above numpy's own Python code: `ratings[empty].mean()` divides by
    the count 0 in numpy's `_methods.py`, called from the script's line, which made the NaN.
    (A frame of another library above numpy, pandas' or scipy's, is not the script's.)"""
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "numpy":
        frame = frame.f_back
    return frame


def _log_ignored(categories: dict, all, log):
    """For `np.errstate(**categories, all=all)`: the categories it ignores that can make a
    NaN or an Inf are turned to "log" in `categories`, and `log` returned as the object
    numpy writes to; `_UNSET` when it ignores none of them."""
    ignored = [c for c in _SEEN_THROUGH if categories.get(c, all) == "ignore"]
    for category in ignored:
        categories[category] = "log"
    if ignored and all is not None:  # (`all` still sets what no category names: underflow)
        categories.setdefault("under", all)
    return log if ignored else _UNSET


class _NoteLog:
    """What numpy's "log" mode writes to: "Warning: divide by zero encountered in log\n",
    from the ufunc's caller's line (the frame above)."""

    def __init__(self, note) -> None:
        self._note = note

    def write(self, message: str) -> None:
        self._note(message.removeprefix("Warning: ").strip(), sys._getframe(1))


class _FilterTap:
    """An entry kept first in `warnings.filters` whose message pattern matches nothing and
    hands every warning's text to `note`, with the frame it is raised from, before the
    script's filters decide whether to show it."""

    def __init__(self, note) -> None:
        self._note = note
        self._entry = ("default", self, Warning, None, 0)
        self._mutated = None  # (name, warnings' own function) while wrapped

    def match(self, text: str):
        if " encountered" in text:  # (cheap: numpy's floating-point reports only)
            try:
                self._note(text, sys._getframe(1))  # (the C warning code has no frame of its own)
            except Exception:  # noqa: BLE001  (never let a warning of the script's fail in here)
                pass
        return None

    def install(self) -> None:
        """After every change to the filters (`simplefilter` inserts the script's first;
        `catch_warnings` swaps the list) the entry is moved first again: warnings' module
        calls its `_filters_mutated` hook after each."""
        name = next((n for n in ("_filters_mutated_lock_held", "_filters_mutated") if hasattr(warnings, n)), None)
        if name is None or not isinstance(warnings.filters, list):
            return  # (a Python whose warnings work otherwise: silenced reports stay unseen)
        mutated = getattr(warnings, name)

        def keep_first(*args, **kwargs):
            self._to_front()
            return mutated(*args, **kwargs)

        self._mutated = (name, mutated)
        setattr(warnings, name, keep_first)
        self._to_front()

    def uninstall(self) -> None:
        if self._mutated is None:
            return
        name, mutated = self._mutated
        setattr(warnings, name, mutated)
        self._mutated = None
        filters = warnings.filters
        if isinstance(filters, list):
            filters[:] = [f for f in filters if f is not self._entry]

    def _to_front(self) -> None:
        filters = warnings.filters
        if not isinstance(filters, list) or (filters and filters[0] is self._entry):
            return
        filters[:] = [self._entry] + [f for f in filters if f is not self._entry]
