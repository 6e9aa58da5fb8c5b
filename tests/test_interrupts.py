"""Ctrl-C: `nandoctor run` ends as python would (exit 130, the KeyboardInterrupt traceback)
and still writes its report, wherever the signal lands; and it ignores SIGINT exactly when
python would.

Which SIGINT disposition a process starts with is inherited: a background job of a
non-interactive shell (`pytest ... &` in a script, some CI and tool runners) starts with
SIGINT ignored, and so does every process it starts; python then installs no
KeyboardInterrupt handler, and neither `python train.py` nor `nandoctor run train.py` can be
stopped by SIGINT. So no test here relies on the disposition the test run itself has: a
real process is started with the one a terminal's foreground job has (or, on purpose, with
SIGINT ignored), and a script forked from the test's fork server installs python's handler
itself. Most scripts send themselves the signal (`signal.raise_signal`, whose handler runs
before it returns): the interrupt then lands at a known point, with no sleeps.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import pytest

from helpers import run_nandoctor

# argv prefix: start the rest of argv (a python command line) with SIGINT at `disposition`.
_WITH_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.{}); "
                "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def with_sigint(disposition: str, argv: list[str]) -> list[str]:
    """The command line that runs `python *argv` started with SIGINT at `disposition`:
    SIG_DFL (a terminal's foreground job) or SIG_IGN (a background job of a script)."""
    return [sys.executable, "-c", _WITH_SIGINT.format(disposition), *argv]


def nandoctor_frames(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.lstrip().startswith("File ") and "/nandoctor/" in line]


def line_of(source: str, text: str) -> int:
    return next(number for number, line in enumerate(source.splitlines(), 1) if line.strip().startswith(text))


def assert_interrupted(code: int, stderr: str, report: dict | None) -> None:
    """One outcome: exit 130, python's KeyboardInterrupt traceback with none of nandoctor's
    frames (and no second error), and the report of an interrupted script."""
    assert code == 130, stderr[-3000:]
    assert stderr.count("Traceback (most recent call last)") == 1, stderr[-3000:]
    assert "\nKeyboardInterrupt\n" in stderr and not nandoctor_frames(stderr), stderr[-3000:]
    assert report is not None and report["status"] == "script_error", stderr[-3000:]
    assert report["error"]["type"] == "KeyboardInterrupt" and report["exit_code"] == 130


def test_ctrl_c_writes_the_report_and_exits_130(tmp_path, script):
    # End to end, as from a terminal: a real SIGINT from outside, while the script runs ops.
    script("train.py", "import time, torch\nprint('ready', flush=True)\nwhile True:\n"
                       "    torch.ones(3).sum()\n    time.sleep(0.01)\n")
    report = tmp_path / "report.json"
    proc = subprocess.Popen(with_sigint("SIG_DFL", ["-m", "nandoctor", "run", "--json", str(report), "train.py"]),
                            cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    watchdog = threading.Timer(120, proc.kill)  # also if `ready` never comes
    watchdog.start()
    try:
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        watchdog.cancel()
        if proc.poll() is None:  # never left behind, looping
            proc.kill()
            proc.communicate()
    assert out == ""
    assert_interrupted(proc.returncode, err, json.loads(report.read_text()))


# A training script that sends itself SIGINT during step 2 (steps count from 0). Python's
# own KeyboardInterrupt handler first, whatever the fork server inherited.
TRAIN = """\
import signal, sys, torch
signal.signal(signal.SIGINT, signal.default_int_handler)
{setup}
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 4)
for step in range(5):
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    {step_2}
    opt.step()
"""


def test_ctrl_c_in_the_scripts_own_code_shows_its_line(tmp_path, script):
    source = TRAIN.format(setup="", step_2="if step == 2:\n        signal.raise_signal(signal.SIGINT)")
    assert_interrupted_at_step_2(tmp_path, script, source, shown_line="signal.raise_signal")


def assert_interrupted_at_step_2(tmp_path, script, source: str, shown_line: str, steps_done: int = 2) -> None:
    """`nandoctor run` of `source` ends interrupted in the loop's step 2 (`steps_done`
    optimizer steps completed), its traceback at the line holding `shown_line`."""
    script("train.py", source)
    result = run_nandoctor(["run", "train.py"], tmp_path)
    assert_interrupted(result.code, result.stderr, result.report)
    assert f'train.py", line {line_of(source, shown_line)}, in <module>\n' in result.stderr
    assert result.report["step"] == steps_done


# Sends SIGINT during optimizer.step(), where nandoctor takes its per-op mode off torch's
# stack for the step (and puts it back after), right after the C call `where` returns: the
# mode is off the stack (or back on it) and nandoctor has not yet noted it. The interrupt
# must end the run as anywhere else, not with IndexError or "trying to pop from empty mode
# stack" from nandoctor's own clean-up, exit 1 and no report.
MODE_SWITCH = """\
import torch
TARGET = {where}

def profiler(frame, event, arg):
    if event == "c_return" and arg is TARGET:
        sys.setprofile(None)
        signal.raise_signal(signal.SIGINT)
"""


@pytest.mark.parametrize("where, steps_done", [
    ("torch._C._pop_torch_dispatch_stack", 2),  # taken off as the step starts, not yet noted as off
    ("torch._C._push_on_torch_dispatch_stack", 3),  # put back once the step is done, not yet noted as on
])
def test_ctrl_c_while_nandoctor_switches_its_mode_ends_the_run_as_anywhere_else(tmp_path, script, where, steps_done):
    source = TRAIN.format(setup=MODE_SWITCH.format(where=where),
                          step_2="if step == 2:\n        sys.setprofile(profiler)")
    assert_interrupted_at_step_2(tmp_path, script, source, shown_line="opt.step()", steps_done=steps_done)


IGNORED = """\
import signal, torch
x = torch.ones(3)
signal.raise_signal(signal.SIGINT)  # what Ctrl-C would do here
print("finished", (x * 2).sum().item(), flush=True)
"""


def test_a_script_started_with_sigint_ignored_ignores_it_as_under_python(tmp_path, script):
    script("train.py", IGNORED)
    argvs = {"python": ["train.py"], "nandoctor": ["-m", "nandoctor", "run", "--json", "r.json", "train.py"]}
    procs = {name: subprocess.Popen(with_sigint("SIG_IGN", argv), cwd=tmp_path, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, argv in argvs.items()}  # side by side: each pays for importing torch
    done = {name: (proc.communicate(timeout=120), proc.returncode) for name, proc in procs.items()}

    for name, ((out, err), code) in done.items():
        assert (code, out) == (0, "finished 6.0\n"), f"{name}: {err[-3000:]}"
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "clean"


# Watch mode finds the NaN loss of step 1; the second run of the script (the replay that
# localises it) is where the Ctrl-C lands, sent to the whole process group as a terminal
# sends it.
REPLAYED = """\
import os, signal, torch
signal.signal(signal.SIGINT, signal.default_int_handler)
replaying = os.path.exists("ran_once")
open("ran_once", "w").close()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 4)
for step in range(3):
    if replaying and step == 1:
        os.killpg(0, signal.SIGINT)
    scale = torch.tensor(0.0 if step == 1 else 1.0)
    loss = (model(x) / scale).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_ctrl_c_during_watch_modes_replay_keeps_what_watch_found(tmp_path, script):
    script("train.py", REPLAYED)
    report_path = tmp_path / "report.json"
    proc = subprocess.run(with_sigint("SIG_DFL", ["-m", "nandoctor", "run", "--mode", "watch", "--json",
                                                  str(report_path), "train.py"]),
                          cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180,
                          start_new_session=True)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert not nandoctor_frames(proc.stderr), proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["status"] == "nonfinite" and report["exit_code"] == 130
    assert report["step"] == 1 and report["reproduced"] is None
    assert any("interrupted" in note for note in report["notes"])
