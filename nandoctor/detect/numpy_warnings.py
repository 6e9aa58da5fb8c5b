"""Where numpy made a non-finite value, from the warning it gives.

numpy computes outside torch, so no op of it is seen; but its ufuncs warn when they make
a NaN or an Inf ("divide by zero encountered in log", "invalid value encountered in
divide", "overflow encountered in exp"), from the script's line that called them. When a
non-finite value then enters torch (`torch.from_numpy(feats)`), the line that made it is
the one numpy warned at, not the one that wrapped the array: that is what the report names.

Only warnings Python shows are seen (the first at each line, under the default filter),
which is the first non-finite value each line makes; a script that silences them keeps
the wrapping line as the answer. Nothing is changed about how warnings are shown.
"""
from __future__ import annotations

import collections
import contextlib
import sys
import warnings
from dataclasses import dataclass

from nandoctor.detect.provenance import SourceLocator

# What each warning says a ufunc made: "divide by zero" and "overflow" an Inf, "invalid
# value" a NaN (0/0, log of a negative, inf - inf).
_MAKES = {"divide by zero": "inf", "overflow": "inf", "invalid value": "nan"}
_KEPT = 16


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
        self._shown = None

    def install(self) -> None:
        shown = self._shown = getattr(warnings, "_showwarnmsg", None)  # (what the C warnings code calls to show one)
        if shown is None:
            return  # (a Python whose warnings module shows them otherwise: the wrapping line is the answer)

        def show(msg):
            try:
                self._note(msg)
            finally:
                shown(msg)

        warnings._showwarnmsg = show

    def uninstall(self) -> None:
        if self._shown is not None:
            warnings._showwarnmsg = self._shown
            self._shown = None

    def _note(self, msg) -> None:
        text = str(msg.message)
        if not issubclass(msg.category, RuntimeWarning) or " encountered in " not in text:
            return
        makes = next((v for k, v in _MAKES.items() if text.startswith(k)), None)
        where = self._locator.user_frame(2)
        if makes is None or where is None or where[0].co_filename != msg.filename or where[1] != msg.lineno:
            return  # (not numpy's, or not from the script's own line)
        self._seen.append(NumpyWarning(where, text, makes, self._step_now()))

    @contextlib.contextmanager
    def caught(self):
        """numpy's floating-point errors noted however the script filters warnings: while
        nandoctor fetches a bad sample again (its own re-run), numpy calls back instead of
        warning (`np.errstate(..., "call")`), so a notebook's `filterwarnings("ignore")` hides
        nothing there. Not during the script's own run: its warnings are its output."""
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
        """The latest warning of this step that says numpy made what a value holds: a NaN
        (`nan`) or only infinities."""
        wanted = "nan" if nan else "inf"
        return next((w for w in reversed(self._seen) if w.makes == wanted and w.step == step), None)
