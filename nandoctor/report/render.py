"""The one shape every output format has, where its text goes, and `publish`.

A format is a `Renderer`: it turns either report, the run's (`RunReport`) or the data
check's (`DataReport`), into text. A `Destination` puts that text somewhere: a stream, a
file replaced atomically, a file appended to. An `Output` pairs the two, and `publish`
renders a report for each output of a command in turn. Adding a format is one module in
`nandoctor/report/` with a class that implements `Renderer`; nothing here changes.
"""
from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Protocol, TextIO, Union

from nandoctor.errors import UsageError
from nandoctor.report.model import RunReport

if TYPE_CHECKING:  # at run time only by duck type: `nandoctor run` never loads the data readers
    from nandoctor.datacheck.model import DataReport

Report = Union[RunReport, "DataReport"]


class Renderer(Protocol):
    """One output format, for both reports. Returns the whole text ('' for nothing)."""

    def render_run(self, report: RunReport) -> str: ...

    def render_data(self, report: DataReport) -> str: ...


def render(renderer: Renderer, report: Report) -> str:
    if isinstance(report, RunReport):
        return renderer.render_run(report)
    return renderer.render_data(report)


class Destination(Protocol):
    def write(self, text: str) -> None: ...


@dataclass(frozen=True)
class Stream:
    """A text stream (stderr, stdout), flushed after each text."""

    stream: TextIO

    def write(self, text: str) -> None:
        if text:
            self.stream.write(text)
            self.stream.flush()


@dataclass(frozen=True)
class AtomicFile:
    """A report file, replaced whole: a reader never sees half of it, also after Ctrl-C or a
    full disk. A path that cannot be written is the user's error (exit 2), one line."""

    path: Path

    def check(self) -> None:
        """Fail before the work (hours of training) rather than after it."""
        folder = self.path.parent
        problem = ("does not exist" if not folder.exists() else "is not a folder" if not folder.is_dir()
                   else "is not writable" if not os.access(folder, os.W_OK) else None)
        if problem:
            raise UsageError(f"cannot write report to {self.path}: folder {folder} {problem}")
        if self.path.is_dir():
            raise UsageError(f"cannot write report to {self.path}: it is a folder")

    def write(self, text: str) -> None:
        """Through the path, as `open(path, "w")` writes: a symlink's target is replaced (the
        link stays), and what is not a file of its own — a device (`/dev/null`), a FIFO, a
        file with other hard links — is written in place, never replaced by a new file."""
        target = Path(os.path.realpath(self.path))
        try:
            st = os.stat(target)
        except OSError:
            st = None
        try:
            if st is not None and (not stat.S_ISREG(st.st_mode) or st.st_nlink > 1):
                _write_in_place(target, text, fifo=stat.S_ISFIFO(st.st_mode))
            else:
                _replace(target, text)
        except OSError as exc:
            raise UsageError(f"cannot write report to {self.path}: {exc.strerror or exc}") from None


def _replace(path: Path, text: str) -> None:
    """Write a temporary file beside `path`, then rename it over `path` (one step)."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as handle:
            handle.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # as open() would make it; mkstemp makes it private
        os.replace(tmp, path)
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def _write_in_place(path: Path, text: str, fifo: bool) -> None:
    """A FIFO is opened without waiting: with no reader at its other end that is an error
    now (ENXIO), not a run that never ends."""
    fd = os.open(path, os.O_WRONLY | (os.O_NONBLOCK if fifo else os.O_TRUNC))
    if fifo:
        os.set_blocking(fd, True)
    with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as handle:
        handle.write(text)


@dataclass(frozen=True)
class AppendFile:
    """A file other steps write to as well ($GITHUB_STEP_SUMMARY): the text is added at its
    end. A failure goes to `on_error` when given (a warning, not a failed run), else exit 2."""

    path: Path
    on_error: Callable[[OSError], None] | None = None

    def write(self, text: str) -> None:
        try:
            with open(self.path, "a", encoding="utf-8", errors="backslashreplace") as handle:
                handle.write(text)
        except OSError as exc:
            if self.on_error is None:
                raise UsageError(f"cannot write to {self.path}: {exc.strerror or exc}") from None
            self.on_error(exc)


@dataclass(frozen=True)
class Output:
    renderer: Renderer
    destination: Destination


def publish(report: Report, outputs: Iterable[Output]) -> None:
    """Render `report` for every output, in order, and write each text to its destination."""
    for output in outputs:
        output.destination.write(render(output.renderer, report))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
