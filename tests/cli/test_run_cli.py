"""`nandoctor run` end to end: exit statuses, bad input, the report file (Ctrl-C: test_interrupts.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

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


THREADED = """\
import threading
import torch
torch.manual_seed(0)
def train():
    w = torch.randn(4, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    for step in range(3):
        loss = torch.log((torch.randn(8, 4) @ w) %s).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        print(step, round(loss.item(), 4))
worker = threading.Thread(target=train)
worker.start()
worker.join()
print("trained")
"""


@pytest.mark.parametrize("mode", ["trace", "watch"])
def test_a_script_that_trains_on_a_thread_of_its_own_stops_there_and_says_what_was_not_seen(tmp_path, script, mode):
    script("train.py", THREADED % "- 100")
    result = run_nandoctor(["run", "--mode", mode, "train.py"], tmp_path)
    assert result.code == 3 and result.report["status"] == "nonfinite"
    root = result.report["root"]
    assert root["location"]["line"] == 9 and root["facts"]["unwatched_thread"] == "Thread-1 (train)"
    assert result.report["cause"]["id"] == "unknown"  # not "came from outside torch": its ops were not seen
    assert "Traceback" not in result.stderr and "trained" not in result.stdout  # the script stopped with it


def test_near_miss_a_healthy_script_that_trains_on_a_thread_runs_as_under_python(tmp_path, script):
    script("train.py", THREADED % "* 0 + 1")
    plain = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, timeout=120)
    result = run_nandoctor(["run", "train.py"], tmp_path)
    assert result.code == 0 and result.report["status"] == "clean"
    assert result.stdout.encode() == plain.stdout and result.report["step"] == 3


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
    # The reference is a real `python` (here and below): nothing of nandoctor's, no server.
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


def test_an_exception_whose_message_cannot_be_made_is_reported_as_python_prints_it(tmp_path, script):
    script("train.py", "class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError('no message')\n"
                       "raise Odd()\n")
    result = run_nandoctor(["run", "train.py"], tmp_path)
    assert result.code == 1 and "Odd: <exception str() failed>" in result.stderr
    assert "nandoctor/" not in result.stderr  # the script's traceback only
    assert result.report["error"] == {"type": "Odd", "message": "<exception str() failed>"}


GUARDED = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, weights = torch.randn(64, 3), (torch.arange(64) < 32).float()
for b in range(2):
    w = weights[b * 32:(b + 1) * 32]
    loss = (model(x[b * 32:(b + 1) * 32]).squeeze(1) ** 2 * w).sum() / w.sum()
    GUARD
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.parametrize("mode", ["trace", "watch"])
@pytest.mark.parametrize("guard", [
    'if torch.isnan(loss):\n        raise RuntimeError(f"loss is nan at batch {b}")',
    "assert torch.isfinite(loss), 'bad loss'",
    # Neither says NaN: the branch a finiteness test guards does.
    'if not torch.isfinite(loss):\n        import sys; print("giving up"); sys.exit(1)',
    'if not torch.isfinite(loss):\n        raise RuntimeError("training diverged")',
])
def test_a_script_that_raises_over_its_own_nan_check_is_a_finding_at_the_line_that_made_it(tmp_path, script, mode,
                                                                                            guard):
    script("train.py", GUARDED.replace("GUARD", guard))  # batch 1 weighs nothing: 0/0
    result = run_nandoctor(["run", "--mode", mode, "train.py"], tmp_path)
    report = result.report
    assert result.code == 3 and report["status"] == "nonfinite"
    assert report["root"]["location"]["line"] == 9 and report["cause"]["id"] == "div_by_zero"
    assert report["error"]["type"] in ("RuntimeError", "AssertionError", "SystemExit")


def test_near_miss_a_script_that_exits_1_for_another_reason_keeps_its_status(tmp_path, script):
    # A NaN made and discarded earlier is not what a later, unguarded sys.exit(1) is about.
    script("train.py", "import sys, torch\n"
                       "m = torch.where(torch.tensor([0.0, 1.0]) > 0, torch.log(torch.tensor([0.0, 1.0])), 0.0)\n"
                       "print(m.tolist())\nsys.exit(1)\n")
    result = run_nandoctor(["run", "train.py"], tmp_path)
    assert result.code == 1 and result.report["status"] != "nonfinite"


ANOMALY_ON = """\
import torch
torch.autograd.set_detect_anomaly(True)
w = torch.nn.Parameter(torch.tensor([[1.0, 2.0], [1.0, 2.0]]))
opt = torch.optim.SGD([w], lr=0.1)
for step in range(2):
    d = torch.sqrt(((w[:, None] - w[None]) ** 2).sum(-1))
    opt.zero_grad()
    d.sum().backward()
    opt.step()
"""


@pytest.mark.parametrize("mode", ["trace", "watch"])
def test_a_script_whose_own_detect_anomaly_raises_in_backward_is_a_finding_at_its_forward_line(tmp_path, script,
                                                                                               mode):
    # Anomaly mode raises inside the engine ("SqrtBackward0 returned nan values") before
    # a node's own check: that backward runs op by op, and the op is what it raised over.
    script("train.py", ANOMALY_ON)
    result = run_nandoctor(["run", "--mode", mode, "train.py"], tmp_path)
    report = result.report
    assert result.code == 3 and report["root"]["phase"] == "backward", result.stderr[-2000:]
    assert report["root"]["location"]["line"] == 6 and report["cause"]["id"] == "sqrt_zero_backward"


# Masks normalised by their max up front; mask 2 is empty (0/0 at line 4). BCE then refuses
# the NaN target with "all elements of target should be between 0 and 1", as it does any
# target out of [0, 1]: plain python dies of that, not of a NaN loss.
BCE_REFUSES = """\
import torch
torch.manual_seed(0)
masks = torch.rand(4, 6).round() * 3; masks[2] = 0; masks[0] = 300
masks = masks / NORMALISER
model = torch.nn.Linear(6, 6)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for b in range(4):
    pred = torch.sigmoid(model(torch.randn(1, 6)))
    loss = LOSS(pred, masks[b:b + 1])
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.parametrize("mode, loss", [("trace", "torch.nn.functional.binary_cross_entropy"),
                                        ("trace", "torch.nn.BCELoss()"),
                                        ("watch", "torch.nn.functional.binary_cross_entropy")])
def test_an_op_that_refuses_a_nan_input_is_a_finding_at_the_line_that_made_it(tmp_path, script, mode, loss):
    script("train.py", BCE_REFUSES.replace("NORMALISER", "masks.amax(1, keepdim=True)").replace("LOSS", loss))
    result = run_nandoctor(["run", "--mode", mode, "train.py"], tmp_path)
    report = result.report
    assert result.code == 3 and report["status"] == "nonfinite", result.stderr[-2000:]
    assert report["root"]["location"]["line"] == 4 and report["cause"]["id"] == "div_by_zero"
    assert report["error"]["type"] == "RuntimeError" and any("binary_cross_entropy" in n or "BCELoss" in n
                                                              for n in report["notes"])


@pytest.mark.parametrize("mode", ["trace", "watch"])
def test_near_miss_a_target_out_of_range_with_no_nan_stays_the_scripts_error(tmp_path, script, mode):
    # Mask 0 is 300 / 3 = 100: out of [0, 1], finite. The same error is the script's own bug.
    script("train.py", BCE_REFUSES.replace("NORMALISER", "3.0").replace("LOSS", "torch.nn.functional.binary_cross_entropy"))
    result = run_nandoctor(["run", "--mode", mode, "train.py"], tmp_path)
    assert result.code == 1 and result.report["status"] == "script_error"
    assert "between 0 and 1" in result.report["error"]["message"]


SAMPLER_WEIGHTS = """\
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler
confidence = np.linspace(0.5, 1.0, 40)
confidence[7] = BAD  # a confidence the annotation file left empty (or a bad one)
sampler = WeightedRandomSampler(weights=confidence, num_samples=40, generator=torch.Generator().manual_seed(0))
data = TensorDataset(torch.randn(40, 3), torch.randn(40, 1))
model = torch.nn.Linear(3, 1)
for x, y in DataLoader(data, batch_size=8, sampler=sampler):
    ((model(x) - y) ** 2).mean().backward()
"""


def test_a_nan_an_unwatched_op_refuses_while_data_loads_is_a_finding_where_it_entered(tmp_path, script):
    # The sampler draws with torch.multinomial while the DataLoader fetches indices (no
    # per-op checks there): NaN weights make it raise "invalid multinomial distribution".
    script("train.py", SAMPLER_WEIGHTS.replace("BAD", "np.nan"))
    result = run_nandoctor(["run", "train.py"], tmp_path)
    assert result.code == 3 and result.report["root"]["location"]["line"] == 6, result.stderr[-2000:]
    assert any("WeightedRandomSampler" in note for note in result.report["notes"])


def test_near_miss_a_negative_weight_the_same_op_refuses_stays_the_scripts_error(tmp_path, script):
    script("train.py", SAMPLER_WEIGHTS.replace("BAD", "-1.0"))
    result = run_nandoctor(["run", "train.py"], tmp_path)
    assert result.code == 1 and result.report["status"] == "script_error"


def test_near_miss_an_error_about_something_else_after_a_nan_stays_the_scripts_error(tmp_path, script):
    script("train.py", GUARDED.replace("GUARD", 'if b == 1:\n        raise KeyError("vocab.json")'))
    result = run_nandoctor(["run", "train.py"], tmp_path)
    assert result.code == 1 and result.report["status"] == "script_error"


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "missing.py"], "can't open file 'missing.py'"),
        (["run", "--bogus", "train.py"], "No such option: --bogus (see 'nandoctor run --help')"),
        (["check-data", "--bogus", "x"], "No such option: --bogus (see 'nandoctor check-data --help')"),
        (["run", "--mode"], "Option '--mode' requires an argument. (see 'nandoctor run --help')"),
        (["run", "--mode", "fast", "train.py"], "unknown mode 'fast'"),
        (["run", "--config", "missing.yaml", "train.py"], "cannot read config missing.yaml"),
        (["run", "--config", "broken.yaml", "train.py"], "not valid YAML"),
        (["run", "--config", "wrong_key.yaml", "train.py"], "unknown setting 'run.colour'"),
        (["run", "--json", "no/such/dir/r.json", "train.py"], "does not exist"),
        (["run", "notes.py"], "not a Python script"),
        (["run"], "Missing argument 'SCRIPT' (or -m MODULE) (see 'nandoctor run --help')"),
        # A launch says so once, before torchrun starts a rank to say it N times.
        (["run", "--nproc-per-node", "2", "missing.py"], "can't open file 'missing.py'"),
        (["run", "--nproc-per-node", "2", "--config", "broken.yaml", "train.py"], "not valid YAML"),
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


def test_python_dash_m_nandoctor_and_the_console_script_are_the_same(tmp_path, script):
    script("train.py", NAN_SCRIPT)
    exe = os.path.join(os.path.dirname(sys.executable), "nandoctor")
    if not os.path.exists(exe):
        pytest.skip("console script not installed in this environment")
    # A real process on purpose: the installed console script, not `python -m` (helpers.run_python).
    proc = subprocess.run([exe, "run", "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3


SYNTAX_ERROR = "import torch\nx = 1\nprint(foo(\n"


def test_a_syntax_error_is_the_scripts_error_as_under_python(tmp_path, script):
    script("train.py", SYNTAX_ERROR)
    plain = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    result = run_nandoctor(["run", "--junit", str(tmp_path / "r.xml"), "train.py"], tmp_path)

    assert plain.returncode == 1 and result.code == 1
    assert result.stdout == ""
    assert result.stderr.startswith(plain.stderr)  # python's own message: file, line, caret
    assert 'train.py", line 3' in result.stderr and "^" in result.stderr
    assert "SyntaxError: '(' was never closed" in result.stderr
    assert "Traceback" not in result.stderr and "nandoctor/" not in result.stderr
    assert result.report["status"] == "script_error" and result.report["exit_code"] == 1
    assert result.report["error"]["type"] == "SyntaxError"
    assert 'errors="1"' in (tmp_path / "r.xml").read_text()


def test_a_module_that_does_not_compile_is_the_scripts_error_as_under_python_dash_m(tmp_path, script):
    script("pkg/__init__.py", "")
    script("pkg/__main__.py", "x = (\n")
    plain = subprocess.run([sys.executable, "-m", "pkg"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    result = run_nandoctor(["run", "-m", "pkg"], tmp_path)

    assert plain.returncode == 1 and result.code == 1
    assert plain.stderr.endswith(result.stderr.split("nandoctor:")[0])  # python's message, without runpy's frames
    assert "SyntaxError: '(' was never closed" in result.stderr and "nandoctor/" not in result.stderr
    assert result.report["status"] == "script_error"


def test_a_missing_script_stays_a_usage_error_without_a_report(tmp_path):
    result = run_nandoctor(["run", "missing.py"], tmp_path)
    assert result.code == 2 and result.report is None


def test_the_run_is_timed_for_junit_and_json(tmp_path, script):
    script("train.py", "import time\ntime.sleep(1.0)\n")
    result = run_nandoctor(["run", "--junit", str(tmp_path / "r.xml"), "train.py"], tmp_path)

    assert result.code == 0
    assert result.report["duration_s"] >= 1.0
    import xml.etree.ElementTree as ET
    suite = ET.parse(tmp_path / "r.xml").getroot()
    assert float(suite.get("time")) >= 1.0 and float(suite.find("testcase").get("time")) >= 1.0


def test_help_gives_every_option_a_human_metavar_and_a_usage_line_with_the_scripts_args(tmp_path):
    result = run_nandoctor(["run", "--help"], tmp_path, json_name=None, env={"COLUMNS": "80"})
    assert result.code == 0
    assert result.stdout.splitlines()[0] == "Usage: nandoctor run [OPTIONS] SCRIPT [ARGS]..."
    assert "<" not in result.stdout  # no typer type names: <str>, <path>, <int range>
    for option in ("-m, --module MODULE", "--json PATH", "--config PATH|PRESET", "--mode trace|watch",
                   "--max-steps N", "--junit PATH"):
        assert option in result.stdout


def test_version_names_nandoctor_and_torch_without_importing_torch(tmp_path):
    from importlib import metadata

    code = ("import sys\nfrom nandoctor.cli import main\ntry:\n    main(['--version'])\n"
            "except SystemExit as e:\n    print('torch' in sys.modules, e.code)\n")
    # A real process on purpose: the fork server has torch imported already.
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    version, imported = proc.stdout.splitlines()
    assert version == f"nandoctor {metadata.version('nandoctor')} (torch {metadata.version('torch')})"
    assert imported == "False 0"


def test_at_80_columns_the_headline_keeps_the_scripts_line(tmp_path, script):
    script("experiments/2024-05-01-gaussian-sweep/run-12-lr3e-4/deep/train_gaussian.py", NAN_SCRIPT)
    path = "experiments/2024-05-01-gaussian-sweep/run-12-lr3e-4/deep/train_gaussian.py"
    result = run_nandoctor(["run", path], tmp_path, env={"COLUMNS": "80"})
    assert result.code == 3
    top = next(line for line in result.stderr.splitlines() if line.startswith("╭─ nandoctor:"))
    assert len(top) <= 80 and "at …/" in top and "/deep/train_gaussian.py:6 " in top
