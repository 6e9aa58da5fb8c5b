"""`nandoctor run` end to end: exit statuses, bad input, the report file, Ctrl-C."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import run_nandoctor

NAN_SCRIPT = """\
import torch
w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
opt = torch.optim.SGD([w], lr=0.1)
for step in range(3):
    opt.zero_grad()
    loss = torch.log(w).sum()
    loss.backward()
    opt.step()
"""

HEALTHY_SCRIPT = """\
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 4), torch.randn(32, 1)
for step in range(5):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
print("done")
"""


def test_a_nan_gives_exit_3_and_a_report(tmp_path, script):
    script("train.py", NAN_SCRIPT)
    result = run_nandoctor(["run", "train.py"], tmp_path)
    assert result.code == 3
    assert result.report["status"] == "nonfinite"
    assert result.report["root"]["op"] == "aten.log.default"
    assert result.report["root"]["location"]["line"] == 6
    assert "log of a non-positive value" in result.stderr
    assert result.stdout == ""  # every word of nandoctor's is on stderr


def test_a_healthy_script_exits_0_with_a_clean_report(tmp_path, script):
    script("train.py", HEALTHY_SCRIPT)
    result = run_nandoctor(["run", "train.py"], tmp_path)
    assert result.code == 0
    assert result.stdout == "done\n"
    assert "nandoctor: clean" in result.stderr
    assert result.report["status"] == "clean" and result.report["step"] == 5


JSON_LINES = """\
import json
import torch
print(json.dumps({"event": "start", "lr": 0.1, "note": "naïve ✓"}))
w = torch.nn.Parameter(torch.tensor([1.0, %s]))
loss = torch.log(w).sum()
loss.backward()
"""


@pytest.mark.parametrize("second, status", [("2.0", "clean"), ("-2.0", "nonfinite")])
def test_stdout_is_the_scripts_byte_for_byte(tmp_path, script, second, status):
    script("train.py", JSON_LINES % second)
    plain = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, timeout=120)
    result = run_nandoctor(["run", "train.py"], tmp_path)

    assert result.report["status"] == status
    assert result.stdout.encode() == plain.stdout
    assert json.loads(result.stdout) == {"event": "start", "lr": 0.1, "note": "naïve ✓"}
    assert "nandoctor" in result.stderr


def test_the_scripts_own_exit_status_passes_through(tmp_path, script):
    script("train.py", "import sys\nsys.exit(7)\n")
    result = run_nandoctor(["run", "train.py"], tmp_path)
    assert result.code == 7
    assert result.report["status"] == "clean" and result.report["exit_code"] == 7


def test_a_script_that_raises_exits_1_with_status_script_error(tmp_path, script):
    script("train.py", "raise RuntimeError('out of memory')\n")
    result = run_nandoctor(["run", "train.py"], tmp_path)
    assert result.code == 1
    assert "RuntimeError: out of memory" in result.stderr
    assert result.report["status"] == "script_error"


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "missing.py"], "can't open file 'missing.py'"),
        (["run", "--bogus", "train.py"], "no such option: --bogus"),
        (["run", "--mode", "fast", "train.py"], "unknown mode 'fast'"),
        (["run", "--config", "missing.yaml", "train.py"], "cannot read config missing.yaml"),
        (["run", "--config", "broken.yaml", "train.py"], "not valid YAML"),
        (["run", "--config", "wrong_key.yaml", "train.py"], "unknown setting 'run.colour'"),
        (["run", "--json", "no/such/dir/r.json", "train.py"], "does not exist"),
        (["run", "notes.py"], "not a Python script"),
        (["run"], "missing SCRIPT"),
        (["frobnicate"], "No such command"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_exit_2(tmp_path, script, args, message):
    script("train.py", HEALTHY_SCRIPT)
    script("broken.yaml", "run: [\n")
    script("wrong_key.yaml", "run:\n  colour: red\n")
    (tmp_path / "notes.py").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    result = run_nandoctor(args, tmp_path, json_name=None)
    assert result.code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_ctrl_c_writes_the_report_and_exits_130(tmp_path, script):
    script("train.py", "import time, torch\nprint('ready', flush=True)\nwhile True:\n    torch.ones(3).sum()\n    time.sleep(0.01)\n")
    report = tmp_path / "report.json"
    proc = subprocess.Popen([sys.executable, "-m", "nandoctor", "run", "--json", str(report), "train.py"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "KeyboardInterrupt" in err
    data = json.loads(report.read_text())
    assert data["status"] == "script_error" and data["error"]["type"] == "KeyboardInterrupt"


def test_python_dash_m_nandoctor_and_the_console_script_are_the_same(tmp_path, script):
    script("train.py", NAN_SCRIPT)
    exe = os.path.join(os.path.dirname(sys.executable), "nandoctor")
    if not os.path.exists(exe):
        pytest.skip("console script not installed in this environment")
    proc = subprocess.run([exe, "run", "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3
