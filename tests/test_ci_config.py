"""configs/ci.yaml, as a CI job uses it: a short, strict smoke test of a training script and
strict data checks. Each promise is checked against the default config, which differs.
The same file ships as the preset `--config ci` (nandoctor/presets/ci.yaml)."""
from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from helpers import REPO, run_nandoctor

CI_YAML = str(REPO / "configs" / "ci.yaml")

HEALTHY_1000_STEPS = textwrap.dedent(
    """
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1000):
        loss = (model(torch.randn(8, 4)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print("step", step + 1)
    print("finished")
    """
)

# A bfloat16 overflow that a masking op hides from the loss: an Inf that never reaches the
# loss, a gradient or a parameter. By default it is only a suspect and the run is clean; the
# CI preset lists bfloat16 in stop_on_inf_dtypes, so it stops there.
MASKED_BF16_INF = textwrap.dedent(
    """
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(3):
        scale = torch.full((4,), 3e38, dtype=torch.bfloat16) * 10
        gate = torch.where(torch.isinf(scale), torch.zeros_like(scale), scale).float()
        loss = (model(torch.randn(8, 4) + gate) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("finished")
    """
)


def test_the_shipped_preset_is_configs_ci_yaml():
    assert (REPO / "nandoctor" / "presets" / "ci.yaml").read_bytes() == (REPO / "configs" / "ci.yaml").read_bytes()


@pytest.mark.parametrize("config", [CI_YAML, "ci"])
def test_a_healthy_run_stops_cleanly_after_20_steps(tmp_path, script, config):
    script("train.py", HEALTHY_1000_STEPS)
    result = run_nandoctor(["run", "--config", config, "train.py"], tmp_path)
    assert result.code == 0, result.stderr
    assert result.report["status"] == "clean"
    assert result.report["step"] == 20
    assert result.report["stopped_by"] == "max_steps"
    assert "finished" not in result.stdout
    assert "step 21" not in result.stdout.splitlines()


def test_a_bfloat16_inf_hidden_by_a_mask_is_a_suspect_by_default(tmp_path, script):
    script("train.py", MASKED_BF16_INF)
    result = run_nandoctor(["run", "train.py"], tmp_path)
    assert result.code == 0, result.stderr
    assert result.report["status"] == "clean"
    assert "finished" in result.stdout


def test_a_bfloat16_inf_hidden_by_a_mask_stops_the_run_under_ci(tmp_path, script):
    script("train.py", MASKED_BF16_INF)
    result = run_nandoctor(["run", "--config", CI_YAML, "train.py"], tmp_path)
    assert result.code == 3, result.stderr
    report = result.report
    assert report["status"] == "nonfinite" and report["step"] == 0
    assert "finished" not in result.stdout
    event = report["event"]
    assert event["phase"] == "forward" and event["op"] == "aten.mul.Tensor"
    assert event["location"]["file"] == "train.py" and event["location"]["line"] == 8
    assert event["output"]["dtype"] == "bfloat16" and event["output"]["posinf"] == 4


@pytest.mark.parametrize(
    "check, array",
    [
        ("constant", np.zeros((8, 8), dtype=np.float32)),  # a blank mask
        ("fp16_range", np.linspace(1e5, 2e5, 4, dtype=np.float32)),  # beyond float16's 65504
    ],
)
def test_data_problems_that_default_only_warns_about_fail_the_ci_check(tmp_path, check, array):
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "sample.npy", array)
    np.save(data / "fine.npy", np.linspace(-1, 1, 16, dtype=np.float32))

    default = run_nandoctor(["check-data", "--json", "default.json", "data"], tmp_path, json_name=None)
    ci = run_nandoctor(["check-data", "--config", CI_YAML, "--json", "ci.json", "data"], tmp_path, json_name=None)

    assert default.code == 0, default.stderr
    assert ci.code == 3, ci.stderr
    default_report = json.loads((tmp_path / "default.json").read_text())
    ci_report = json.loads((tmp_path / "ci.json").read_text())
    assert default_report["status"] == "clean"
    assert ci_report["status"] == "problems"
    assert [(p["file"], p["check"]) for p in ci_report["problems"]] == [("data/sample.npy", check)]
