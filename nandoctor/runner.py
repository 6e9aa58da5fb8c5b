"""Run the user's script in this process exactly as `python SCRIPT ARGS` would.

Nothing else lives here: no detection, no reporting. The behaviours follow CPython and
coverage.py's `execfile.py`:

- `sys.argv` is `[script as typed, *args]`; with `-m`, argv[0] is the module's file.
- `sys.path[0]` is the script's directory (symlinks resolved, as CPython does) or, with
  `-m`, the current directory. It is set in `prepare()`, before the script imports anything.
- The code runs in a fresh `__main__` module registered in `sys.modules`, with `__file__`,
  `__spec__`, `__loader__` and `__builtins__`: spawn-based multiprocessing (DataLoader
  workers) re-imports the main module from these.
- `SystemExit` codes pass through; any other exception prints the user's traceback with
  nandoctor's frames removed and gives exit status 1.
- A script (or `-m` module) that does not compile is the user's error, as under python:
  python's own SyntaxError message (file, line, caret) on stderr and exit status 1, and a
  report, since the run did start; a script that is not there is a usage error (exit 2).
- With `-m`, "your module wasn't found" is a usage error (exit 2), but an exception from
  importing the module's package (`import not_installed_dep` in `pkg/__init__.py`) is the
  user's, as under `python -m`: its traceback and exit status 1 (runpy tells the two
  apart by the name the ImportError carries, and so do we).
- The interpreter state (argv, path, `__main__`, working directory) is restored afterwards,
  also when the script chdir'd into a directory that has since been deleted.
"""
from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import linecache
import os
import sys
import threading
import traceback
import types
import zipfile
import zipimport
from typing import Callable
from dataclasses import dataclass
from pathlib import Path

from nandoctor.errors import ExitCode, UsageError

_NANDOCTOR_DIR = str(Path(__file__).resolve().parent)


def script_path(target: str) -> Path:
    """The file python would run for `python TARGET` (a directory runs its __main__.py, a
    zip application the __main__.py inside: the zip is returned); UsageError, as python's
    own words, when there is none."""
    path = Path(target)
    if not path.exists():
        raise UsageError(f"can't open file '{target}': no such file")
    if _zip_app(target):
        try:
            found = zipimport.zipimporter(target).find_spec("__main__")
        except zipimport.ZipImportError:
            found = None
        if found is None:
            raise UsageError(f"can't find '__main__' module in '{target}'")
        return path
    if path.is_dir():
        main = path / "__main__.py"
        if not main.is_file():
            raise UsageError(f"can't find '__main__' module in '{target}'")
        path = main
    return path


@dataclass
class ScriptOutcome:
    """How the script ended."""

    exit_code: int
    exception: BaseException | None = None  # the uncaught exception, if any (not SystemExit)
    # A SystemExit with a failing status (`sys.exit(1)`): not an error python reports, but
    # a script may exit so over a value it found non-finite (see Observer.raised_over).
    failed_exit: SystemExit | None = None


class ScriptRunner:
    """Prepare, then run, one script or module (`-m`) with its arguments."""

    def __init__(self, target: str, args: list[str], as_module: bool = False):
        self.target = target
        self.args = list(args)
        self.as_module = as_module
        self.code: types.CodeType | None = None
        self.main_module: types.ModuleType | None = None
        self.display_path = target  # what a user typed, used in reports
        # The user's exception raised while preparing (importing the package of a `-m`
        # module): run() ends with it as python would, instead of executing anything.
        self.failure: BaseException | None = None

    # -- preparing ---------------------------------------------------------------------

    def prepare(self) -> None:
        """Find and compile the target; raise UsageError when it can't be run at all."""
        if self.as_module:
            self._prepare_module()
        else:
            self._prepare_script()

    def _prepare_script(self) -> None:
        path = script_path(self.target)
        if _zip_app(self.target):
            self._prepare_zip_app()
            return
        try:
            source = path.read_bytes()
        except OSError as exc:
            raise UsageError(f"can't read '{self.target}': {exc.strerror}") from None
        # As python names it: joined to the working directory, not normalised (`lnk/../s.py`
        # through a symlinked folder is not `s.py`).
        directory_app = os.path.isdir(self.target)
        given = os.path.join(self.target, "__main__.py") if directory_app else self.target
        abs_file = os.path.join(os.getcwd(), given)
        try:
            self.code = self._compile(source, abs_file)
        except SyntaxError as exc:  # the user's error: run() ends with it, as python would
            self.failure = _without_traceback(exc)
        loader = _script_loader(abs_file)
        # A directory runs as python runs it: its __main__ has a spec, the directory as given
        # comes first on sys.path.
        spec = importlib.util.spec_from_file_location("__main__", abs_file, loader=loader) if directory_app else None
        self.main_module = self._new_main(abs_file, spec=spec, loader=loader)
        if directory_app:
            self.main_module.__package__ = spec.parent
            self.display_path = given  # (`app/__main__.py`: the file whose lines a report shows)
        self._argv0 = self.target
        # CPython puts the script's real directory first (a symlinked script imports from
        # the folder it really lives in).
        self._path0 = os.path.join(os.getcwd(), self.target) if directory_app else \
            os.path.dirname(os.path.realpath(abs_file))

    def _prepare_zip_app(self) -> None:
        """A zip application (`python app.pyz`) runs as python runs it: the zip as given
        (joined to the working directory) comes first on sys.path, and its __main__ is
        loaded by zipimport, spec and all."""
        zip_path = os.path.join(os.getcwd(), self.target)
        spec = zipimport.zipimporter(zip_path).find_spec("__main__")
        try:
            self.code = spec.loader.get_code("__main__")
        except SyntaxError as exc:  # the user's error: run() ends with it, as python would
            self.failure = _without_traceback(exc)
        self.main_module = self._new_main(spec.origin, spec=spec, loader=spec.loader)
        self.main_module.__package__ = spec.parent
        self._argv0 = self.target
        self._path0 = zip_path
        self.display_path = os.path.join(self.target, "__main__.py")
        _sources_readable(zip_path, spec.loader)


    def _prepare_module(self) -> None:
        # As with `python -m`, the current directory comes first while looking the module up.
        sys.path.insert(0, os.getcwd())
        try:
            spec = _find_spec(self.target)
            if spec.submodule_search_locations is not None:  # a package: run its __main__
                spec = _find_spec(f"{self.target}.__main__", package=self.target)
            code = spec.loader.get_code(spec.name) if spec.loader else None
        except _PackageImportFailed as failed:
            # The module is there but importing its package raised: python shows that
            # traceback and exits 1, so the failure is the script's, reported by run().
            self._defer_failure(failed.error)
            return
        except SyntaxError as exc:  # the module's own code does not compile
            self._defer_failure(_without_traceback(exc))
            return
        finally:
            sys.path.pop(0)
        if code is None:
            raise UsageError(f"no code to run in module '{self.target}'")
        self.code = code
        self.main_module = self._new_main(spec.origin, spec=spec, loader=spec.loader)
        self.main_module.__package__ = spec.parent
        self._argv0 = spec.origin
        self._path0 = os.getcwd()
        self.display_path = os.path.relpath(spec.origin) if spec.origin else self.target

    def _defer_failure(self, error: BaseException) -> None:
        self.failure = error  # run() raises it where it would have executed the code
        self.main_module = self._new_main(None, spec=None, loader=None)
        self._argv0 = self.target
        self._path0 = os.getcwd()

    def _compile(self, source: bytes, filename: str) -> types.CodeType:
        """The script's code object. A SyntaxError propagates (it is the user's, reported
        when the script runs); a file that is not Python text at all is a usage error."""
        if b"\x00" in source[:4096]:
            raise UsageError(f"'{self.target}' is not a Python script (it looks like a binary file)")
        try:
            return compile(source, filename, "exec", dont_inherit=True)
        except ValueError as exc:  # e.g. a null byte past the part looked at
            raise UsageError(f"'{self.target}' is not a Python script: {exc}") from None

    @staticmethod
    def _new_main(file: str | None, spec, loader) -> types.ModuleType:
        module = types.ModuleType("__main__")
        module.__file__ = file
        module.__builtins__ = sys.modules["builtins"]
        module.__annotations__ = {}  # (python's own __main__ starts with it: `print(__annotations__)` works)
        module.__spec__ = spec
        module.__loader__ = loader
        module.__cached__ = None
        return module

    # -- running -----------------------------------------------------------------------

    def run(self, passthrough: tuple[type[BaseException], ...] = (),
            explained: Callable[[BaseException], bool] = lambda exc: False) -> ScriptOutcome:
        """Execute the prepared code. Exceptions of the `passthrough` types propagate
        (the detector's stop signal); everything else ends as python would end it, except
        that an `explained` one prints no traceback (a collective that failed because
        another rank stopped: that rank's report says why)."""
        assert self.main_module is not None, "call prepare() first"
        saved = _InterpreterState.capture()
        sys.argv = [self._argv0, *self.args]
        sys.path[0:1] = [self._path0] if sys.path else [self._path0]
        sys.modules["__main__"] = self.main_module
        try:
            if self.failure is not None:
                raise self.failure
            with _StopsFromThreads(passthrough):
                exec(self.code, self.main_module.__dict__)
        except passthrough:
            raise
        except SystemExit as exc:
            status = _system_exit_status(exc)
            return ScriptOutcome(status, failed_exit=exc if status != 0 else None)
        except KeyboardInterrupt as exc:
            print_user_traceback(exc)
            return ScriptOutcome(ExitCode.INTERRUPTED, exc)
        except BaseException as exc:  # noqa: BLE001 - the user's exception, reported as python would
            if not explained(exc):
                print_user_traceback(exc)
            return ScriptOutcome(ExitCode.SCRIPT_ERROR, exc)
        finally:
            saved.restore()
        return ScriptOutcome(0)


class _PackageImportFailed(Exception):
    """Importing the package of a `-m` module raised `error` (the user's code failed)."""

    def __init__(self, error: BaseException):
        super().__init__(error)
        self.error = error


def _find_spec(name: str, package: str | None = None):
    """The spec of module `name`; UsageError when it (or a package on its way) doesn't exist.

    Finding `a.b.c` imports `a.b` first. As in CPython's runpy, an ImportError from that
    import only means "not found" when it names the package itself or one of its parents;
    any other failure (`import not_installed_dep` in `a/__init__.py`, a RuntimeError, a
    sys.exit) is the user's code failing and becomes _PackageImportFailed.
    """
    parent = name.rpartition(".")[0]
    if parent:
        try:
            __import__(parent)
        except ImportError as exc:
            if not _names_package_of(exc, parent):
                raise _PackageImportFailed(exc) from None
        except BaseException as exc:  # noqa: BLE001 - the user's code failed; python shows it
            raise _PackageImportFailed(exc) from None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a missing parent package; a relative name
        spec = None
    if spec is None:
        if package:
            raise UsageError(f"no module named '{name}'; '{package}' is a package and cannot be run directly")
        raise UsageError(f"no module named '{name}'")
    return spec


def _without_traceback(exc: SyntaxError) -> SyntaxError:
    """A SyntaxError as python prints it for a script: file, line, caret and message, with
    no traceback of the machinery that compiled it (runpy's, importlib's, ours)."""
    exc.__traceback__ = None
    exc.__context__ = None
    exc.__suppress_context__ = True
    return exc


def _names_package_of(exc: ImportError, package: str) -> bool:
    """Whether `exc` says `package` (or a package above it) is missing (runpy's test)."""
    return exc.name is not None and (exc.name == package or package.startswith(exc.name + "."))


def _zip_app(target: str) -> bool:
    """Is `target` a zip application? python tries a file as a zip before running it as
    a script (a zip may start with a `#!` line)."""
    try:
        return os.path.isfile(target) and zipfile.is_zipfile(target)
    except OSError:
        return False


def _sources_readable(zip_path: str, importer: zipimport.zipimporter) -> None:
    """Make the source lines of the zip's modules readable by file name (`linecache`, which
    reports and tracebacks read), as python's traceback makes them from each frame's module:
    from the zip, through its importer."""
    with zipfile.ZipFile(zip_path) as archive:
        names = [n for n in archive.namelist() if n.endswith(".py")]
    for name in names:
        module = name[:-len(".py")].removesuffix("/__init__").replace("/", ".")
        linecache.lazycache(f"{zip_path}/{name}", {"__name__": module, "__loader__": importer})


def _script_loader(path: str):
    return importlib.machinery.SourceFileLoader("__main__", path)


def _system_exit_status(exc: SystemExit) -> int:
    """The status the process ends with, as the system sees python's: `sys.exit(256)` is 0,
    `sys.exit(-1)` is 255, `sys.exit(True)` is 1 (a number in the report, never a bool)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code) & 0xFF
    print(code, file=sys.stderr)  # python prints a non-int exit value and exits 1
    return 1


class _StopsFromThreads:
    """A stop raised on a thread the script started (a script that trains on a thread of its
    own) ends that thread without a traceback, and the script with it: the same stop is
    raised on the script's thread (where it waits in `join()`, as soon as that returns), as
    if it had been raised there. Any other exception of a thread is printed as python would."""

    def __init__(self, stops: tuple[type[BaseException], ...]) -> None:
        self.stops = stops
        self.script_thread = threading.get_ident()
        self.hook = self._excepthook

    def __enter__(self) -> "_StopsFromThreads":
        self.previous = threading.excepthook
        threading.excepthook = self.hook
        return self

    def __exit__(self, *exc) -> None:
        if threading.excepthook is self.hook:  # (unless the script installed its own meanwhile)
            threading.excepthook = self.previous
        self.stops = ()  # a thread that outlives the script raises nothing into nandoctor

    def _excepthook(self, args) -> None:
        if not (self.stops and isinstance(args.exc_type, type) and issubclass(args.exc_type, self.stops)):
            self.previous(args)
            return
        if threading.get_ident() != self.script_thread:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.script_thread),
                                                       ctypes.py_object(args.exc_type))


@dataclass
class _InterpreterState:
    argv: list[str]
    path0: str | None
    main: types.ModuleType | None
    cwd: str

    @classmethod
    def capture(cls) -> "_InterpreterState":
        return cls(list(sys.argv), sys.path[0] if sys.path else None, sys.modules.get("__main__"), os.getcwd())

    def restore(self) -> None:
        sys.argv = self.argv
        if self.path0 is not None and sys.path:
            sys.path[0] = self.path0
        if self.main is not None:
            sys.modules["__main__"] = self.main
        # Go back where we started even if the script chdir'd into a folder it then removed.
        try:
            os.chdir(self.cwd)
        except OSError:
            pass


def is_nandoctor_frame(filename: str) -> bool:
    return filename.startswith(_NANDOCTOR_DIR)


def _trim(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback chain without nandoctor's frames (tb_next is writable since 3.7)."""
    kept: list[types.TracebackType] = []
    while tb is not None:
        if not is_nandoctor_frame(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    for earlier, later in zip(kept, kept[1:]):
        earlier.tb_next = later
    if kept:
        kept[-1].tb_next = None
        return kept[0]
    return None


def print_user_traceback(exc: BaseException) -> None:
    """Print the exception as python would, through sys.excepthook, minus nandoctor's frames."""
    seen: set[int] = set()
    chained: BaseException | None = exc
    while chained is not None and id(chained) not in seen:
        seen.add(id(chained))
        chained.__traceback__ = _trim(chained.__traceback__)
        chained = chained.__cause__ or chained.__context__
    hook = sys.excepthook
    if getattr(hook, "__module__", "").startswith(("typer", "rich")):
        hook = sys.__excepthook__  # typer installs its own; the user never asked for it
    try:
        hook(type(exc), exc, exc.__traceback__)
    except Exception:  # noqa: BLE001 - a broken user hook must not hide the error
        traceback.print_exception(type(exc), exc, exc.__traceback__)
