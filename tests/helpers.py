"""Test helpers: run code under the detector in-process, or nandoctor as a process of its own
(forked from a server that has imported torch, see run_python); do an expensive run once
per test session."""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from nandoctor.config import load_config

REPO = Path(__file__).resolve().parent.parent


def _atan2_grad_is_nan_at_origin() -> bool:
    """Torch 2.9 and older give atan2(0, 0) a NaN gradient; 2.10 and later give 0 (the
    atan2_backward fix, pytorch#166787). Scripts that are healthy only because of that
    fix really do train into NaN on the older releases."""
    import torch

    y, x = torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)
    torch.atan2(y, x).sum().backward()
    return bool(torch.isnan(x.grad).any())


ATAN2_NAN_AT_ORIGIN = _atan2_grad_is_nan_at_origin()
# Healthy scripts and cases that rely on atan2(0, 0) having a zero gradient.
HEALTHY_ONLY_WITH_ATAN2_FIX = {"healthy_atan2_wind_direction.py", "healthy_atan2_origin"}
ATAN2_REASON = "this torch gives atan2(0, 0) a NaN gradient (fixed in 2.10): the NaN is real here"


@dataclass
class Detected:
    detector: object
    stopped: bool

    @property
    def detection(self):
        return self.detector.detection


def detect(fn, **run_overrides) -> Detected:
    """Run `fn()` under a Detector with the default settings; report whether it stopped."""
    from nandoctor.detect.detector import Detector
    from nandoctor.detect.observer import NonFiniteFound

    settings = dict(load_config().run, **run_overrides)
    detector = Detector(settings)
    stopped = False
    try:
        with detector:
            fn()
    except NonFiniteFound:
        stopped = True
    return Detected(detector, stopped)


def line_in(path, marker: str) -> int:
    """The number of the first line of file `path` that holds `marker` (a line that looks
    it up, calling `line_in` or a `line_of` wrapper, does not count)."""
    for number, text in enumerate(Path(path).read_text().splitlines(), 1):
        if marker in text and "line_in(" not in text and "line_of(" not in text:
            return number
    raise AssertionError(marker)


def watch(fn, **run_overrides):
    """Run `fn()` under watch mode (its StepWatcher), to its end or to the finding that
    stopped it; returns the watcher."""
    from nandoctor.detect.observer import NonFiniteFound
    from nandoctor.detect.watch import StepWatcher

    watcher = StepWatcher(dict(load_config().run, **run_overrides))
    try:
        with watcher:
            fn()
    except NonFiniteFound:
        pass
    return watcher


# A training script whose acos at exactly 1 gives an infinite gradient at its line 7.
ACOS_AT_ONE = """\
import torch
torch.manual_seed(0)
scale = torch.nn.Parameter(torch.tensor(1.0))
opt = torch.optim.SGD([scale], lr=0.1)
for step in range(5):
    opt.zero_grad()
    angle = torch.acos(torch.tensor([0.5, 1.0]) * (scale + 1e-3))
    angle.mean().backward()
    opt.step()
"""


def ops_through_the_mode(monkeypatch, backward_only: bool = False) -> list:
    """The ops that reach nandoctor's per-op mode from now on (only those autograd runs in
    backward, with `backward_only`): a list that fills as they come."""
    import torch

    from nandoctor.detect.mode import CheckingMode

    seen = []
    original = CheckingMode.__torch_dispatch__

    def counting(self, func, types, args=(), kwargs=None):
        if not backward_only or torch._C._current_autograd_node() is not None:
            seen.append(func)
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(CheckingMode, "__torch_dispatch__", counting)
    return seen


def read_back(t):
    """What a script does with a value it keeps: read it (a NaN nobody reads never matters)."""
    return t.tolist()


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str
    report: dict | None


def run_python(argv: list[str], cwd: Path, env: dict[str, str] | None = None,
               timeout: float = 180) -> subprocess.CompletedProcess:
    """What `subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True,
    text=True, stdin=subprocess.DEVNULL, timeout=timeout)` gives, for `-m nandoctor ...`
    (or `-c CODE`) forked from this process's nandoctor fork server (see ForkServer), which
    has imported torch and nandoctor's command line once: most of a run's cost otherwise.

    Some tests start real processes on purpose: those that compare a forked run with a real
    one (test_sample_scripts.py), the console script, `nandoctor --version` not importing
    torch, Ctrl-C and other signals (Popen), torchrun launches, pytest subprocesses
    (pytester), the benchmarks, and the plain `python` runs that a nandoctor run is compared
    with. A run whose environment must act on what is read as the preloaded modules are
    imported needs one too."""
    return nandoctor_server().run(argv, cwd, env=dict(os.environ) if env is None else env, timeout=timeout)


def run_nandoctor(args: list[str], cwd: Path, json_name: str | None = "report.json", env=None,
                  timeout=180) -> CliResult:
    """`python -m nandoctor ARGS` as a user would run it (see run_python); `--json` is added
    when json_name is set. `env` adds to this process's environment, less GITHUB_ACTIONS
    unless `env` sets it."""
    json_args = ["--json", str(cwd / json_name)] if json_name and args and args[0] == "run" else []
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("GITHUB_ACTIONS", None) if not (env and "GITHUB_ACTIONS" in env) else None
    proc = run_python(["-m", "nandoctor", args[0], *json_args, *args[1:]], cwd, env=full_env, timeout=timeout)
    report = None
    if json_name and (cwd / json_name).exists():
        report = json.loads((cwd / json_name).read_text())
    return CliResult(proc.returncode, proc.stdout, proc.stderr, report)


@contextlib.contextmanager
def session_lock(tmp_path_factory, name: str):
    """Hold the lock `name`, shared by every pytest-xdist worker of this session (a file in
    the parent of the workers' base temporary folders); yields that folder. Without xdist,
    or without flock (Windows), there is nothing to share it with and it locks nothing."""
    try:
        import fcntl
    except ImportError:
        fcntl = None
    shared = tmp_path_factory.getbasetemp().parent
    if "PYTEST_XDIST_WORKER" not in os.environ or fcntl is None:
        yield None
        return
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield shared


def once_per_session(tmp_path_factory, name: str, compute):
    """`compute()` (JSON-serialisable data) once per test session, also when pytest-xdist runs
    the tests in several worker processes: the first worker to get here computes and writes
    the result where every worker of the session sees it, under `session_lock`; the others
    wait for it and read it. For a run that several tests assert on, wherever xdist sends
    them. (A module-scoped fixture alone runs once per worker; `xdist_group` cannot keep the
    tests together: pytest-xdist 3.8 with pytest 9.2 ignores it, pytest-dev/pytest-xdist#1386.)"""
    with session_lock(tmp_path_factory, name) as shared:
        if shared is None:
            return compute()
        result = shared / f"{name}.json"
        if not result.exists():
            data = json.dumps(compute())
            result.with_suffix(".tmp").write_text(data)
            result.with_suffix(".tmp").replace(result)
    return json.loads(result.read_text())


# The server ForkServer starts: `python -c FORK_SERVER ADDRESS PRELOAD`. It imports what
# PRELOAD names once, then listens on the Unix socket ADDRESS. A job comes from a client
# (FORK_CLIENT, a small python that starts in milliseconds): its stdin, stdout and stderr
# (passed as file descriptors), then a JSON line with its command line, working directory
# and environment. For each job the server forks a handler, which forks a child that runs
# the python command line (`SCRIPT`, `-m MODULE` or `-c CODE`, with ARGS) as a fresh
# `python` would: argv (and sys.orig_argv), sys.path[0] (the script's folder; the current
# folder for -m and -c), `__main__`, the working directory (also as multiprocessing's
# ORIGINAL_DIR), os.environ the client's, numpy's generator seeded afresh, the client's
# stdin, stdout and stderr, an uncaught exception printed by sys.excepthook with exit status 1,
# and the end of an interpreter (non-daemon threads joined, atexit handlers, `__main__`'s
# objects finalized, streams flushed) less the teardown of the preloaded modules, which is
# no part of the run and costs a forked child ~1 s of CPU (copy-on-write of the whole
# heap). The handler answers the client with the child's exit status (negative: the
# signal that ended it), or kills the child when the client goes away first (killed by
# its caller's timeout). What is read when the preloaded modules are imported (their
# environment variables, PYTHON* settings) is the server's. The server reaps its handlers
# (their CPU time, and their jobs', counts as its own) and ends when its stdin is closed.
FORK_SERVER = r"""
import atexit, gc, importlib, importlib.util, json, os, select, signal, socket, sys, threading, traceback, types
from importlib.machinery import BuiltinImporter, SourceFileLoader

address, preload = sys.argv[1], sys.argv[2]
main_annotations = "__annotations__" in vars(sys.modules["__main__"])  # as python gives every __main__
for name in preload.split(","):
    importlib.import_module(name)

def exit_status(code):
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)  # as python does with a non-int exit value
    return 1

def run(job, fds):
    for fd, received in enumerate(fds):  # the client's stdin, stdout and stderr
        os.dup2(received, fd)
        os.close(received)
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job["cwd"])
    argv = job["argv"]
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__
    if main_annotations:
        main.__annotations__ = {}
    if argv[0] == "-c":  # `python -c CODE ARGS`: argv[0] "-c", sys.path[0] the current folder ("")
        path, source, sys.argv = "<string>", argv[1], ["-c", *argv[2:]]
        sys.path[0] = ""
        main.__loader__ = BuiltinImporter
    else:
        if argv[0] == "-m":  # `python -m MODULE ARGS`: argv[0] the module's file, sys.path[0] the folder
            spec = importlib.util.find_spec(argv[1] + ".__main__")
            path, sys.argv = spec.origin, [spec.origin, *argv[2:]]
            sys.path[0] = os.getcwd()
            main.__spec__, main.__package__ = spec, argv[1]
        else:  # `python SCRIPT ARGS`
            path, sys.argv = os.path.abspath(argv[0]), list(argv)
            sys.path[0] = os.path.dirname(os.path.realpath(path))
        main.__file__, main.__cached__ = path, None
        main.__loader__ = SourceFileLoader("__main__", path)
        with open(path, "rb") as f:
            source = f.read()
    sys.orig_argv = [sys.executable, *argv]
    sys.modules["__main__"] = main
    # A fresh interpreter's own state, not the server's: the folder multiprocessing takes a
    # relative main path from, numpy's global generator seeded from the OS's entropy.
    if "multiprocessing.process" in sys.modules:
        sys.modules["multiprocessing.process"].ORIGINAL_DIR = os.path.abspath(os.getcwd())
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    status = 0
    try:
        exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)
    except SystemExit as exc:
        status = exit_status(exc.code)
    except BaseException as exc:
        exc.__traceback__ = exc.__traceback__.tb_next  # from the script's frame on, as python shows it
        sys.excepthook(type(exc), exc, exc.__traceback__)
        status = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    main.__dict__.clear()
    gc.collect()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)

def handle(conn):
    _, fds, _, _ = socket.recv_fds(conn, 1, 3)
    with conn.makefile("rb") as lines:
        job = json.loads(lines.readline())
    pid = os.fork()
    if pid == 0:
        conn.close()
        try:
            run(job, fds)  # ends the child (os._exit)
        except BaseException:
            traceback.print_exc()
        os._exit(1)
    for fd in fds:
        os.close(fd)
    while not (done := os.waitpid(pid, os.WNOHANG))[0]:
        if select.select([conn], [], [], 0.01)[0]:  # the client is gone (its timeout killed it): so is the job
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return
    conn.sendall(b"%d\n" % os.waitstatus_to_exitcode(done[1]))

def reap(block):  # the handlers that have ended (their CPU time, and their jobs', counts as ours)
    try:
        while os.waitpid(-1, 0 if block else os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass

listener = socket.socket(socket.AF_UNIX)
listener.bind(address)
listener.listen(64)
print("ready", flush=True)
while True:
    readable = select.select([listener, sys.stdin], [], [], 1)[0]
    reap(block=False)
    if sys.stdin in readable:  # stdin closed: the end
        break
    if listener in readable:
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            try:
                handle(conn)
            except BaseException:
                traceback.print_exc()  # into the server's log
            os._exit(0)
        conn.close()
reap(block=True)
"""

# `python -I -S -c FORK_CLIENT ADDRESS ARGS...` is `python ARGS...` run by the fork server
# at ADDRESS: it ends as the job did, with its exit status or its signal.
FORK_CLIENT = r"""
import json, os, signal, socket, sys
try:
    with socket.socket(socket.AF_UNIX) as server:
        server.connect(sys.argv[1])
        socket.send_fds(server, [b"."], [0, 1, 2])
        server.sendall(json.dumps({"argv": sys.argv[2:], "cwd": os.getcwd(), "env": dict(os.environ)}).encode() + b"\n")
        status = int(server.makefile("rb").readline())
except (OSError, ValueError) as exc:
    print(f"fork server: no answer ({exc!r})", file=sys.stderr)
    os._exit(254)
if status < 0:  # ended by a signal: so is this process
    try:
        signal.signal(-status, signal.SIG_DFL)
    except OSError:  # SIGKILL, SIGSTOP: no handler to reset
        pass
    os.kill(os.getpid(), -status)
os._exit(status if status >= 0 else 128 - status)
"""

FORKS = sys.platform.startswith("linux")


class ForkServer:
    """`run(argv, cwd, env, timeout)` gives what `subprocess.run([sys.executable, *argv],
    cwd=cwd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
    timeout=timeout)` gives, from a process forked from a server that has imported `preload`
    (module names) once: the cost of importing torch (and what else is preloaded) is paid
    once per server, not per run. `command(argv)` is the command line that runs `python
    ARGV` through the server, for a program that starts python itself (the public cases'
    scorer); runs may overlap. Elsewhere than on Linux (no fork, or a fork that macOS's
    system frameworks may not survive once torch is loaded) it is a plain `python ARGV`."""

    def __init__(self, preload: list[str], timeout: float) -> None:
        self.preload, self.timeout = preload, timeout
        self.proc: subprocess.Popen | None = None
        self.folder: Path | None = None

    def _start(self) -> None:
        self.close()
        self.folder = Path(tempfile.mkdtemp(prefix="nandoctor-fork-"))  # private (0700), a short socket path
        self.address = str(self.folder / "socket")
        with open(self.folder / "server.log", "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", FORK_SERVER, self.address, ",".join(self.preload)], cwd=REPO,
                env=_SERVER_ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        if self.proc.stdout.readline() != b"ready\n":
            self.proc.wait()
            raise RuntimeError(f"the fork server did not start:\n{(self.folder / 'server.log').read_text()[-3000:]}")

    def command(self, argv: list[str]) -> list[str]:
        if not FORKS:
            return [sys.executable, *argv]
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        return [sys.executable, "-I", "-S", "-c", FORK_CLIENT, self.address, *argv]

    def run(self, argv: list[str], cwd: Path, env: dict[str, str] | None = None,
            timeout: float | None = None) -> subprocess.CompletedProcess:
        command, timeout = [sys.executable, *argv], self.timeout if timeout is None else timeout
        try:
            proc = subprocess.run(self.command(argv), cwd=cwd, env=env, capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise subprocess.TimeoutExpired(command, timeout, exc.output, exc.stderr) from None
        if FORKS and proc.returncode == 254 and proc.stderr.startswith("fork server: no answer"):
            raise RuntimeError(f"{proc.stderr}server log:\n{(self.folder / 'server.log').read_text()[-3000:]}")
        return subprocess.CompletedProcess(command, proc.returncode, proc.stdout, proc.stderr)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:  # a job that never ends holds it up: end it all
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
            self.proc = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


# The environment the fork servers start in, as the tests found it (not as a test may have
# changed it when a server happens to start), less GITHUB_ACTIONS: run_nandoctor's runs
# are outside GitHub Actions unless a test says otherwise.
_SERVER_ENV = {name: value for name, value in os.environ.items() if name != "GITHUB_ACTIONS"}

# What `python -m nandoctor run` imports (torch through nandoctor.session), and the
# torch._dynamo that an optimizer's first step imports (1.2 s of a 1.7 s forked run; its
# import runs no torch op, so the detector sees the same run). That import happening
# mid-run, through nandoctor's import hook, is covered end to end by the stack scripts
# (tests/test_stack_scripts.py), which run in real processes.
NANDOCTOR_PRELOAD = ["nandoctor.cli", "nandoctor.session", "torch._dynamo"]
_nandoctor_server: ForkServer | None = None


def nandoctor_server() -> ForkServer:
    """This process's fork server for `python -m nandoctor ...` (one per pytest-xdist
    worker), started on first use and ended when the process exits."""
    global _nandoctor_server
    if _nandoctor_server is None:
        _nandoctor_server = ForkServer(NANDOCTOR_PRELOAD, timeout=180)
        atexit.register(_nandoctor_server.close)
    return _nandoctor_server
