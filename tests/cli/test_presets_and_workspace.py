"""CI recipes that work in any repository: `--config ci` is a preset shipped inside the
package, and GitHub annotations name files relative to $GITHUB_WORKSPACE, so they attach to
the diff when the job runs from a subfolder."""
from __future__ import annotations

import json

import numpy as np

from helpers import ACOS_AT_ONE as BROKEN, run_nandoctor

HEALTHY = """\
import torch
torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
for step in range(100):
    opt.zero_grad()
    model(torch.randn(8, 3)).pow(2).mean().backward()
    opt.step()
print("finished")
"""

def _props(line: str) -> dict[str, str]:
    head = line.split(" ", 1)[1].split("::", 1)[0]
    return dict(p.split("=", 1) for p in head.split(","))


def test_run_config_ci_works_from_a_folder_outside_the_repository(tmp_path, script):
    script("train.py", HEALTHY)
    result = run_nandoctor(["run", "--config", "ci", "--max-steps", "2", "train.py"], tmp_path)
    assert result.code == 0, result.stderr
    assert result.report["status"] == "clean" and result.report["step"] == 2
    assert "finished" not in result.stdout


def test_check_data_config_ci_works_from_a_folder_outside_the_repository(tmp_path):
    (tmp_path / "data").mkdir()
    np.save(tmp_path / "data" / "fine.npy", np.linspace(-1, 1, 16, dtype=np.float32))
    np.save(tmp_path / "data" / "blank.npy", np.zeros((4, 4), dtype=np.float32))
    # The preset makes a constant array an error (by default it is a warning).
    result = run_nandoctor(["check-data", "--config", "ci", "--json", "r.json", "data"], tmp_path, json_name=None)
    assert result.code == 3, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert [(p["file"], p["check"], p["severity"]) for p in report["problems"]] == [
        ("data/blank.npy", "constant", "error")]


def test_an_unknown_preset_is_one_usage_line_listing_the_presets(tmp_path, script):
    script("train.py", HEALTHY)
    np.save(tmp_path / "x.npy", np.arange(3.0))
    for args in (["run", "--config", "cii", "train.py"], ["check-data", "--config", "cii", "x.npy"]):
        result = run_nandoctor(args, tmp_path, json_name=None)
        assert result.code == 2, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert "unknown config preset 'cii'" in result.stderr and "presets: ci" in result.stderr
        assert "Traceback" not in result.stderr and result.stdout == ""


def test_run_annotation_is_relative_to_github_workspace_from_a_subfolder(tmp_path, script):
    script("sub/train.py", BROKEN)
    result = run_nandoctor(["run", "train.py"], tmp_path / "sub", json_name=None,
                           env={"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(tmp_path)})
    assert result.code == 3, result.stderr
    assert result.stdout == ""
    (annotation,) = [line for line in result.stderr.splitlines() if line.startswith("::error ")]
    props = _props(annotation)
    assert props["file"] == "sub/train.py" and props["line"] == "7"


def test_check_data_annotations_are_relative_to_github_workspace_from_a_subfolder(tmp_path):
    data = tmp_path / "sub" / "data"
    data.mkdir(parents=True)
    np.save(data / "bad.npy", np.array([np.nan, 1.0]))
    result = run_nandoctor(["check-data", "data"], tmp_path / "sub", json_name=None,
                           env={"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(tmp_path)})
    assert result.code == 3, result.stderr
    (annotation,) = [line for line in result.stderr.splitlines() if line.startswith("::error ")]
    assert _props(annotation)["file"] == "sub/data/bad.npy"


def test_without_github_workspace_annotation_paths_are_as_today(tmp_path):
    data = tmp_path / "sub" / "data"
    data.mkdir(parents=True)
    np.save(data / "bad.npy", np.array([np.nan, 1.0]))
    result = run_nandoctor(["check-data", "data"], tmp_path / "sub", json_name=None,
                           env={"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": ""})
    (annotation,) = [line for line in result.stderr.splitlines() if line.startswith("::error ")]
    assert _props(annotation)["file"] == "data/bad.npy"
