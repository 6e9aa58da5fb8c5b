"""The bundled sample scripts (sample_scripts/) against what a correct diagnostician reports.

Each script is run as a user would run it: `python -m nandoctor run --json r.json SCRIPT`, with the
working directory a scratch copy of sample_scripts/. The expected answers live in
sample_scripts/expectations.yaml. Each script also runs under plain python: the samples are
ordinary training scripts.

Both runs are processes forked from a server that has already imported torch (and, for
nandoctor's, nandoctor's command line), see helpers.ForkServer: importing them is most of
the cost of running a sample, and is paid once per test process instead of once per run.
nandoctor's server is the one helpers.run_nandoctor forks every test's runs from. The
torch._dynamo that an optimizer's first step imports is preloaded for plain python only:
under nandoctor that import happens during the run, as it does for a user.
`test_a_forked_*_run_is_the_run_python*_gives` check that a forked run is the run.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ATAN2_NAN_AT_ORIGIN, ATAN2_REASON, HEALTHY_ONLY_WITH_ATAN2_FIX

from helpers import ForkServer, nandoctor_server

SAMPLES = Path(__file__).resolve().parent.parent / "sample_scripts"
EXPECTATIONS: dict[str, dict] = yaml.safe_load((SAMPLES / "expectations.yaml").read_text())
TIMEOUT_S = 120

ALL = sorted(EXPECTATIONS)
BROKEN = [name for name in ALL if EXPECTATIONS[name]["kind"] == "broken"]
HEALTHY = [name for name in ALL if EXPECTATIONS[name]["kind"] == "healthy"]


def _torch_dependent(names):
    """Healthy only on a torch with the atan2 fix: skipped on one without (see helpers)."""
    return [pytest.param(n, marks=pytest.mark.skipif(ATAN2_NAN_AT_ORIGIN, reason=ATAN2_REASON))
            if n in HEALTHY_ONLY_WITH_ATAN2_FIX else n for n in names]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A scratch copy of sample_scripts/, so scripts write nothing into the repository."""
    dest = tmp_path / "sample_scripts"
    shutil.copytree(SAMPLES, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


PLAIN_PRELOAD = ["torch", "torch._dynamo"]  # what a sample imports, and an optimizer's first step


@pytest.fixture(scope="session")
def plain_python():
    server = ForkServer(PLAIN_PRELOAD, TIMEOUT_S)
    yield server
    server.close()


@pytest.fixture(scope="session")
def nandoctor_python() -> ForkServer:
    """helpers.NANDOCTOR_PRELOAD: `nandoctor run` imports torch through nandoctor.session."""
    return nandoctor_server()


def run_nandoctor(server: ForkServer, script: str, cwd: Path) -> tuple[subprocess.CompletedProcess, dict | None]:
    report_path = cwd.parent / "r.json"
    proc = server.run(["-m", "nandoctor", "run", "--json", str(report_path), script], cwd, timeout=TIMEOUT_S)
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    return proc, report


def describe(proc: subprocess.CompletedProcess, report: dict | None) -> str:
    root = (report or {}).get("root") or {}
    brief = {
        "exit": proc.returncode,
        "status": (report or {}).get("status"),
        "cause": ((report or {}).get("cause") or {}).get("id"),
        "root.phase": root.get("phase"),
        "root.op": root.get("op"),
        "root.location": root.get("location"),
    }
    return f"{json.dumps(brief, indent=1)}\n--- stdout/stderr tail ---\n{(proc.stdout + proc.stderr)[-3000:]}"


def test_every_script_has_an_expectation():
    scripts = sorted(p.name for p in SAMPLES.glob("*.py"))
    assert scripts == ALL


@pytest.mark.parametrize("script", BROKEN)
def test_broken_script_is_diagnosed(script: str, workdir: Path, nandoctor_python: ForkServer):
    expect = EXPECTATIONS[script]
    proc, report = run_nandoctor(nandoctor_python, script, workdir)
    info = describe(proc, report)

    assert report is not None, f"no JSON report\n{info}"
    assert proc.returncode == 3, info
    assert report["status"] == "nonfinite", info
    assert report["event"] is not None, info

    root = report["root"]
    assert root is not None, info
    assert root["phase"] == expect["phase"], info
    assert re.search(expect["op"], root["op"]), f"op {root['op']!r} !~ {expect['op']!r}\n{info}"
    assert Path(root["location"]["file"]).name == script, info
    assert root["location"]["line"] == expect["line"], info
    assert report["cause"]["id"] == expect["cause"], info


@pytest.mark.parametrize("script", _torch_dependent(HEALTHY))
def test_healthy_script_is_clean(script: str, workdir: Path, nandoctor_python: ForkServer):
    proc, report = run_nandoctor(nandoctor_python, script, workdir)
    info = describe(proc, report)

    assert report is not None, f"no JSON report\n{info}"
    assert proc.returncode == 0, info
    assert report["status"] == "clean", info
    assert report["event"] is None, info
    assert report["root"] is None, info
    assert report["cause"] is None, info
    assert report["lineage"] == [], info


@pytest.mark.parametrize("script", _torch_dependent(ALL))
def test_script_runs_under_plain_python(script: str, workdir: Path, plain_python: ForkServer):
    """The samples are ordinary training scripts: they run (and finish) without nandoctor."""
    proc = plain_python.run([script], workdir)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "nandoctor" not in output.lower(), output[-3000:]
    if EXPECTATIONS[script]["kind"] == "healthy":
        assert not re.search(r"\b(nan|inf)\b", proc.stdout), proc.stdout[-3000:]


# What the forked runs rely on. A plain run sees what `python SCRIPT` gives it (`python -c
# CODE` too), its environment the one it was given, ends with the script's status, its
# output, an uncaught exception's traceback, atexit handlers, non-daemon threads and
# unclosed files flushed, and has nothing of nandoctor's loaded.
PROBES = {
    "probe.py": """\
import json, os, sys
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "name": __name__,
                  "file": __file__, "main": sys.modules["__main__"].__file__, "stdin": sys.stdin.read(),
                  "globals": sorted(globals()), "environ": dict(os.environ),
                  "nandoctor": [m for m in sys.modules if m.startswith("nandoctor")]}))
print("to stderr", file=sys.stderr)
""",
    "exits.py": "import atexit, sys\natexit.register(print, 'atexit ran')\nsys.exit(7)\n",
    "ends.py": """\
import threading, time
log = open("unclosed.txt", "w")
log.write("written, never closed")
threading.Thread(target=lambda: (time.sleep(0.2), print("thread done"))).start()
raise SystemExit("a message")
""",
    "raises.py": "import torch\nx = torch.log(torch.tensor([-1.0]))\nraise ValueError(f'boom {x.item()}')\n",
}


# `python -c CODE`, as the tests run a snippet: what it sees, and a syntax error's message.
PROBE_C = """\
import json, os, sys
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "name": __name__,
                  "loader": repr(__loader__), "globals": sorted(globals()), "probe": os.environ.get("PROBE")}))
"""


def real_run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=TIMEOUT_S, env=env)


def test_a_forked_plain_run_is_the_run_python_gives(tmp_path, plain_python: ForkServer):
    unclosed = tmp_path / "unclosed.txt"
    results, files = {}, {}
    for name, source in PROBES.items():
        (tmp_path / name).write_text(source)
        unclosed.unlink(missing_ok=True)
        forked = plain_python.run([name], tmp_path)
        forked_file = unclosed.exists() and unclosed.read_text()
        unclosed.unlink(missing_ok=True)
        real = real_run([name], tmp_path)
        assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)
        assert forked_file == (unclosed.exists() and unclosed.read_text())
        results[name], files[name] = forked, forked_file
    for argv in (["-c", PROBE_C, "an arg"], ["-c", "x = (\n"]):
        env = dict(os.environ, PROBE="given")
        forked, real = plain_python.run(argv, tmp_path, env=env), real_run(argv, tmp_path, env=env)
        assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)
        results[argv[1]] = forked
    assert json.loads(results[PROBE_C].stdout)["probe"] == "given"
    assert results["x = (\n"].returncode == 1 and "SyntaxError" in results["x = (\n"].stderr
    assert json.loads(results["probe.py"].stdout)["nandoctor"] == []
    assert (results["probe.py"].returncode, results["probe.py"].stderr) == (0, "to stderr\n")
    assert (results["exits.py"].returncode, results["exits.py"].stdout) == (7, "atexit ran\n")
    assert (results["ends.py"].returncode, results["ends.py"].stderr) == (1, "a message\n")
    assert results["ends.py"].stdout == "thread done\n" and files["ends.py"] == "written, never closed"
    raised = results["raises.py"]
    assert raised.returncode == 1 and raised.stderr.startswith("Traceback (most recent call last):\n")
    assert raised.stderr.endswith("ValueError: boom nan\n")


def test_a_forked_nandoctor_run_is_the_run_python_m_nandoctor_gives(workdir, nandoctor_python: ForkServer):
    """The same for `python -m nandoctor run`: on a sample it diagnoses (the report, the exit
    status, the script's stdout and nandoctor's stderr are the real run's), and on the probe
    (the script sees what it sees under a real `python -m nandoctor run`)."""
    (workdir / "probe.py").write_text(PROBES["probe.py"])
    for script in ("siamese_contrastive_sqrt.py", "probe.py"):
        argv = ["-m", "nandoctor", "run", "--json", "r.json", script]
        forked = nandoctor_python.run(argv, workdir, timeout=TIMEOUT_S)
        forked_report = json.loads((workdir / "r.json").read_text())
        (workdir / "r.json").unlink()
        real = real_run(argv, workdir)
        real_report = json.loads((workdir / "r.json").read_text())
        assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)
        for report in (forked_report, real_report):
            report.pop("duration_s", None)  # the one thing that differs: how long it took
        assert forked_report == real_report
    assert real.returncode == 0 and "nandoctor.cli" in json.loads(real.stdout)["nandoctor"]


@pytest.mark.skipif(not ATAN2_NAN_AT_ORIGIN, reason="this torch gives atan2(0, 0) a zero gradient")
def test_atan2_at_the_origin_is_diagnosed_where_torch_gives_it_a_nan_gradient(workdir: Path, nandoctor_python: ForkServer):
    """On a torch without the atan2 fix the 'healthy' wind script does train into NaN, and
    the right answer is the atan2 line with its cause."""
    proc, report = run_nandoctor(nandoctor_python, "healthy_atan2_wind_direction.py", workdir)
    info = describe(proc, report)
    assert proc.returncode == 3 and report["status"] == "nonfinite", info
    assert report["cause"]["id"] == "atan2_zero_backward", info
    assert report["root"]["location"]["line"] == 17 and report["root"]["phase"] == "backward", info
