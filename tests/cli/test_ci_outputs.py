"""CI use: --max-steps makes any script a smoke test; failures show up where CI systems look."""
from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET

import pytest

from helpers import ACOS_AT_ONE as BROKEN, CliResult, once_per_session, run_nandoctor

COLOUR = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-8]|9[0-7])[;m]")

HEALTHY = """\
import torch
torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(1000):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(torch.randn(8, 3)), torch.zeros(8, 1)).backward()
    opt.step()
print("finished all 1000 steps")
"""


def test_github_actions_gets_an_annotation_at_the_root_line_and_a_step_summary(tmp_path, script):
    script("train.py", BROKEN)
    summary = tmp_path / "summary.md"
    result = run_nandoctor(["run", "--junit", "junit.xml", "train.py"], tmp_path,
                           env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    assert result.code == 3
    # Workflow commands are read from stderr too; stdout is the script's alone.
    assert result.stdout == ""
    annotations = [line for line in result.stderr.splitlines() if line.startswith("::error ")]
    assert len(annotations) == 1
    props = dict(p.split("=", 1) for p in annotations[0][len("::error "):].split("::", 1)[0].split(","))
    assert props["file"] == "train.py" and props["line"] == "7"
    text = summary.read_text()
    assert "aten.acos.default" in text and "domain_asin_acos" in text and "train.py:7" in text

    suite = ET.parse(tmp_path / "junit.xml").getroot()
    assert suite.tag == "testsuite" and suite.get("failures") == "1"
    failure = suite.find("testcase/failure")
    assert failure.get("type") == "domain_asin_acos"
    assert "train.py:7" in failure.get("message")


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory) -> CliResult:
    """`nandoctor run train.py` on BROKEN outside GitHub Actions, stderr a pipe: one run that
    the two tests below read (once per session, see helpers.once_per_session)."""

    def run() -> dict:
        folder = tmp_path_factory.mktemp("broken")
        (folder / "train.py").write_text(BROKEN)
        return dataclasses.asdict(run_nandoctor(["run", "train.py"], folder))

    return CliResult(**once_per_session(tmp_path_factory, "ci_outputs_plain_run", run))


def test_outside_github_actions_no_workflow_commands_are_printed(plain_run):
    result = plain_run
    assert result.code == 3 and "Fix:" in result.stderr
    assert "::error" not in result.stderr and "::error" not in result.stdout


def test_max_steps_turns_a_training_script_into_a_smoke_test(tmp_path, script):
    script("train.py", HEALTHY)
    result = run_nandoctor(["run", "--max-steps", "5", "--junit", "junit.xml", "train.py"], tmp_path)
    assert result.code == 0
    assert result.report["status"] == "clean" and result.report["step"] == 5
    assert result.report["stopped_by"] == "max_steps"
    assert "finished all 1000 steps" not in result.stdout
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    assert suite.get("failures") == "0" and suite.find("testcase/failure") is None


def test_logs_have_no_colour_codes_when_not_a_terminal(plain_run):
    result = plain_run
    assert "Fix:" in result.stderr
    assert "\x1b[" not in result.stderr


def test_no_color_is_honoured_on_a_terminal(tmp_path, script):
    script("train.py", BROKEN)
    coloured = run_nandoctor(["run", "train.py"], tmp_path, env={"FORCE_COLOR": "1", "TTY_COMPATIBLE": "1"})
    plain = run_nandoctor(["run", "train.py"], tmp_path,
                          env={"FORCE_COLOR": "1", "TTY_COMPATIBLE": "1", "NO_COLOR": "1"})
    assert COLOUR.search(coloured.stderr)
    assert "Fix:" in plain.stderr and not COLOUR.search(plain.stderr)
