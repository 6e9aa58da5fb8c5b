"""Test helpers: run code under the detector in-process, or nandoctor in a subprocess; do an
expensive run once per test session."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
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


def read_back(t):
    """What a script does with a value it keeps: read it (a NaN nobody reads never matters)."""
    return t.tolist()


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str
    report: dict | None


def run_nandoctor(args: list[str], cwd: Path, json_name: str | None = "report.json", env=None, timeout=180) -> CliResult:
    """`python -m nandoctor ARGS` as a user would run it; `--json` is added when json_name is set."""
    json_args = ["--json", str(cwd / json_name)] if json_name and args and args[0] == "run" else []
    cmd = [sys.executable, "-m", "nandoctor", args[0], *json_args, *args[1:]]
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("GITHUB_ACTIONS", None) if not (env and "GITHUB_ACTIONS" in env) else None
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=full_env)
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


# The server ForkServer talks to: `python -c FORK_SERVER PRELOAD`. It imports what PRELOAD
# names once; for each job (a JSON line on stdin) it forks a child that runs a python
# command line (`SCRIPT` or `-m nandoctor ARGS...`) as a fresh `python` would: argv,
# sys.path[0] (the script's folder; the current folder for -m), `__main__`, the working
# directory, stdin /dev/null, stdout and stderr to files, an uncaught exception printed by
# sys.excepthook with exit status 1, and the end of an interpreter (non-daemon threads
# joined, atexit handlers, `__main__`'s objects finalized, streams flushed) less the
# teardown of the preloaded modules, which is no part of the run and costs a forked child
# ~1 s of CPU (copy-on-write of the whole heap). It answers with the child's exit status,
# or None when the child ran past the job's timeout and was killed.
FORK_SERVER = r"""
import atexit, gc, importlib, importlib.util, json, os, signal, sys, threading, time, types
from importlib.machinery import SourceFileLoader

for name in sys.argv[1].split(","):
    importlib.import_module(name)

def exit_status(code):
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)  # as python does with a non-int exit value
    return 1

def run(job):
    os.chdir(job["cwd"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        os.dup2(os.open(path, flags, 0o644), fd)
    argv = job["argv"]
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__
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
    sys.modules["__main__"] = main
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    status = 0
    try:
        exec(code, main.__dict__)
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

for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        run(job)  # ends the child (os._exit): it never reads the next job
    deadline = time.monotonic() + job["timeout"]
    while not (done := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
        time.sleep(0.01)
    if not done[0]:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    print(json.dumps({"status": os.waitstatus_to_exitcode(done[1]) if done[0] else None}), flush=True)
"""


class ForkServer:
    """`run(argv, cwd)` gives what `subprocess.run([sys.executable, *argv], cwd=cwd,
    capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout)` gives, from a
    process forked from a server that has imported `preload` (module names) once: the cost
    of importing torch (and what else is preloaded) is paid once per server, not per run.
    Without os.fork it runs the subprocess."""

    def __init__(self, preload: list[str], scratch: Path, timeout: float) -> None:
        self.preload, self.scratch, self.timeout = preload, scratch, timeout
        self.proc: subprocess.Popen | None = None
        self.jobs = 0

    def run(self, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
        command = [sys.executable, *argv]
        if not hasattr(os, "fork"):
            return subprocess.run(command, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                  timeout=self.timeout)
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-c", FORK_SERVER, ",".join(self.preload)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.jobs += 1
        out, err = self.scratch / f"{self.jobs}.out", self.scratch / f"{self.jobs}.err"
        job = {"argv": argv, "cwd": str(cwd), "stdout": str(out), "stderr": str(err), "timeout": self.timeout}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, "the fork server died"
        status = json.loads(answer)["status"]
        if status is None:
            raise subprocess.TimeoutExpired(command, self.timeout)
        return subprocess.CompletedProcess(command, status, out.read_text(), err.read_text())

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
