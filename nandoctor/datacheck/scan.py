"""Walk the paths, check the files in parallel, collect one `DataReport`.

Files are checked on a thread pool: the work is numpy reductions, zip/image decoding and
Arrow reads, which release the GIL, so threads use the cores without the cost of sending
arrays between processes (measured with bench/bench_check_data.py).

Nothing found on the way is fatal: a symlink loop, a folder that cannot be listed or a file
that cannot be opened becomes a problem of the report. A path that does not exist, and one
with nothing to check in it (an empty folder: a dataset that was never fetched), are the
user's mistake (UsageError); the second one only unless `allow_empty`.
"""
from __future__ import annotations

import errno
import os
import stat
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from nandoctor.datacheck.checks import CheckOptions
from nandoctor.datacheck.model import SKIPPED_LISTED, DataReport, Problem, apply_severity
from nandoctor.datacheck.pydataset import Target, check_dataset, parse_target
from nandoctor.datacheck.readers import (
    READERS,
    FileContext,
    MissingLibrary,
    Unreadable,
    _one_line,
    not_data,
    reader_for,
)
from nandoctor.errors import UsageError


@dataclass
class Inventory:
    """What the walk found: files to check, datasets to load, problems met on the way."""

    files: list[str] = field(default_factory=list)
    datasets: list[Target] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # regular files no reader knows, fifos, devices
    seen_dirs: set = field(default_factory=set)  # (device, inode): a folder reached twice is walked once
    seen_files: set = field(default_factory=set)  # and a file named twice (a folder and its parent) checked once
    seen_again: int = 0  # data files and folders met a second time

    def found(self) -> int:
        """Files to check and problems so far, counting those met again (not a path with nothing in it)."""
        return len(self.files) + len(self.problems) + self.seen_again
    empty: list[str] = field(default_factory=list)  # "PATH: why", one per path with nothing to check


class NothingToCheck(UsageError):
    """A path the user named holds no file nandoctor can check."""


# ---- walking ----------------------------------------------------------------------------


def collect(paths: Sequence[str]) -> Inventory:
    inventory = Inventory()
    for path in paths:
        if os.path.lexists(path):
            if os.path.islink(path) and _stat_errno(path) in (errno.ENOENT, errno.ENOTDIR):
                raise UsageError(f"no such file or directory: {path} "
                                 f"(a broken symbolic link to {os.readlink(path)})")
            found, skipped = inventory.found(), len(inventory.skipped)
            _collect_path(path, inventory, ancestors=set())
            if inventory.found() == found:
                inventory.empty.append(f"{path}: {_why_nothing(path, len(inventory.skipped) - skipped)}")
            continue
        target = parse_target(path)
        if target is None:
            raise UsageError(f"no such file or directory: {path}")
        inventory.datasets.append(target)
    return inventory


def _stat_errno(path: str) -> int | None:
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno
    return None


def _why_nothing(path: str, skipped: int) -> str:
    """Why a path the user named gave no file to check (it exists and is readable)."""
    if os.path.isdir(path):
        if skipped == 0:
            return "the folder has no files"
        noun = "file" if skipped == 1 else "files"
        return f"the folder has no data files ({skipped} {noun} in other formats)"
    if os.path.isfile(path):
        return f"not a data format nandoctor reads ({' '.join(sorted(READERS))})"
    return "not a regular file or folder"


def _collect_path(path: str, inventory: Inventory, ancestors: set) -> None:
    try:
        info = os.stat(path)  # follows symlinks: a linked data folder is scanned like any other
    except OSError as exc:
        _note_unstattable(path, exc, inventory)
        return
    identity = (info.st_dev, info.st_ino)
    if stat.S_ISDIR(info.st_mode):
        _collect_dir(path, identity, inventory, ancestors)
        return
    if identity in inventory.seen_files:
        inventory.seen_again += reader_for(path) is not None
        return
    inventory.seen_files.add(identity)
    if stat.S_ISREG(info.st_mode) and reader_for(path) is not None:
        inventory.files.append(path)
    else:
        # Another format, or a socket, fifo or device (opening a fifo would block): said,
        # not checked.
        inventory.skipped.append(path)


def _note_unstattable(path: str, exc: OSError, inventory: Inventory) -> None:
    if exc.errno == errno.ELOOP:
        inventory.problems.append(Problem(path, None, "unreadable", 1,
                                          "symbolic link loop: the link points back to itself"))
    elif os.path.islink(path):
        if reader_for(path) is not None:
            inventory.problems.append(Problem(path, None, "unreadable", 1,
                                              f"broken symbolic link to {os.readlink(path)}"))
    else:
        inventory.problems.append(Problem(path, None, "unreadable", 1, f"cannot be read: {exc.strerror}"))


def _collect_dir(path: str, identity: tuple[int, int], inventory: Inventory, ancestors: set) -> None:
    if identity in ancestors:
        inventory.problems.append(Problem(path, None, "unreadable", 1,
                                          "symbolic link loop: this folder links back to one that contains it"))
        return
    if identity in inventory.seen_dirs:
        inventory.seen_again += 1
        return  # reached again through another link or path: checked once is enough
    inventory.seen_dirs.add(identity)
    try:
        with os.scandir(path) as entries:
            names = sorted(entry.name for entry in entries)
    except OSError as exc:
        inventory.problems.append(Problem(path, None, "unreadable", 1,
                                          f"folder cannot be listed: {exc.strerror}"))
        return
    for name in names:
        _collect_path(os.path.join(path, name), inventory, ancestors | {identity})


# ---- checking one file ------------------------------------------------------------------


def check_file(path: str, options: CheckOptions, on_bytes: Callable[[int], None] | None = None) -> list[Problem]:
    """Every problem of one file; never raises for a problem of the file itself."""
    ctx = FileContext(path, options, on_bytes)
    try:
        if not os.access(path, os.R_OK):
            # Asked first: some readers would word a refused open as a corrupt file.
            ctx.problem(None, "unreadable", "permission denied: the file cannot be opened")
        elif os.path.getsize(path) == 0:
            ctx.problem(None, "empty", "the file is empty (0 bytes)")
        elif (what := not_data(ctx.head())) is not None:
            ctx.problem(None, "unreadable", what)
        else:
            reader_for(path)(ctx)
    except MissingLibrary as exc:
        ctx.problem(None, "not_checked", str(exc))
    except Unreadable as exc:
        ctx.problem(None, "unreadable", str(exc))
    except PermissionError:
        ctx.problem(None, "unreadable", "permission denied: the file cannot be opened")
    except MemoryError:
        ctx.problem(None, "unreadable", "ran out of memory while reading the file")
    except Exception as exc:  # noqa: BLE001 - a corrupt file must not stop the scan
        ctx.problem(None, "unreadable", f"cannot be read: {_one_line(exc)}")
    return ctx.problems


# ---- the whole scan ---------------------------------------------------------------------


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def scan(paths: Sequence[str], *, errors: Sequence[str], options: CheckOptions = CheckOptions(),
         workers: int = 0, progress: bool | None = None, warnings: Sequence[str] | None = None,
         allow_empty: bool = False) -> DataReport:
    """Check every file and dataset named by `paths`; severities follow `errors` and
    `warnings` (see `apply_severity`). A path with nothing to check in it raises
    NothingToCheck unless `allow_empty`."""
    inventory = collect(paths)
    if inventory.empty and not allow_empty:
        raise NothingToCheck("nothing to check in " + "; ".join(inventory.empty))
    show = sys.stderr.isatty() if progress is None else progress
    with _Progress(inventory.files, show, has_datasets=bool(inventory.datasets)) as bar:
        problems = list(inventory.problems)
        problems += _check_files(inventory.files, options, workers or default_workers(), bar)
        for target in inventory.datasets:
            problems += check_dataset(target, options, bar.sample_done)
    return DataReport(
        files_scanned=len(inventory.files) + len(inventory.datasets),
        files_skipped=len(inventory.skipped),
        skipped=inventory.skipped[:SKIPPED_LISTED],
        problems=apply_severity(problems, errors, warnings),
    )


def _check_files(files: list[str], options: CheckOptions, workers: int, bar: "_Progress") -> list[Problem]:
    def one(path: str) -> list[Problem]:
        found = check_file(path, options, bar.bytes_reader(path))
        bar.file_done(path)
        return found

    if workers == 1 or len(files) <= 1:
        results: Iterator[list[Problem]] = map(one, files)
        return [p for found in results for p in found]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nandoctor-check") as pool:
        # map keeps the input order, so the report is the same whatever finishes first.
        return [p for found in pool.map(one, files) for p in found]


class _Progress:
    """A rich progress bar (files and bytes) on stderr, or nothing when stderr is not a TTY."""

    def __init__(self, files: list[str], show: bool, has_datasets: bool = False) -> None:
        self.show = show and (bool(files) or has_datasets)
        self.files_total = len(files)
        self.files_done = 0
        self.sizes = {path: _size(path) for path in files} if self.show else {}
        self.counted: dict[str, int] = {}
        self.lock = threading.Lock()
        self.bar = None

    def __enter__(self) -> "_Progress":
        if self.show:
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                       TimeRemainingColumn, TransferSpeedColumn)

            from nandoctor.console import stderr_console

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                TransferSpeedColumn(), TimeRemainingColumn(),
                                console=stderr_console(), transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task(self._description(), total=sum(self.sizes.values()) or None)
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def _description(self) -> str:
        return f"checking {self.files_done}/{self.files_total} files"

    def bytes_reader(self, path: str) -> Callable[[int], None] | None:
        if self.bar is None:
            return None

        def advance(nbytes: int) -> None:
            # Decompressed bytes can exceed the file's size: the bar never runs past the file.
            with self.lock:
                done = self.counted.get(path, 0)
                step = max(0, min(nbytes, self.sizes[path] - done))
                self.counted[path] = done + step
            if step:
                self.bar.advance(self.task, step)

        return advance

    def file_done(self, path: str) -> None:
        if self.bar is None:
            return
        with self.lock:
            rest = self.sizes[path] - self.counted.get(path, 0)
            self.counted[path] = self.sizes[path]
            self.files_done += 1
        self.bar.update(self.task, advance=rest, description=self._description())

    def sample_done(self, index: int, total: int) -> None:
        if self.bar is not None and total % 100 == 0:
            self.bar.update(self.task, description=f"checking dataset samples: {total:,}")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
