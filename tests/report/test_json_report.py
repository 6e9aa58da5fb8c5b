"""The --json reports follow shared/CONTRACT.md: the run's in every status, and the data's."""
from __future__ import annotations

import json

from helpers import run_nandoctor
from nandoctor.datacheck.model import DataReport, Problem
from nandoctor.report.json_report import Json
from nandoctor.report.model import RunReport

SITE_FIELDS = {"phase", "op", "location", "backward_node", "module", "output", "inputs"}
SUMMARY_FIELDS = {"name", "shape", "dtype", "min", "max", "nan", "posinf", "neginf", "zeros", "negatives"}
CAUSE_IDS = {
    "log_nonpositive", "div_by_zero", "exp_overflow", "sqrt_negative", "sqrt_zero_backward",
    "norm_zero_backward", "pow_invalid", "domain_asin_acos", "atan2_zero_backward", "inf_arithmetic",
    "masked_inf_gradient_leak", "ctc_infeasible", "fp16_overflow", "nonfinite_input_data",
    "nonfinite_parameter", "exploding_gradient", "zero_variance", "optimizer_invalid", "unknown",
}


def assert_site(site: dict) -> None:
    assert SITE_FIELDS <= site.keys()
    assert site["phase"] in {"forward", "backward", "optimizer", "data", "init"}
    assert isinstance(site["op"], str)
    assert set(site["location"]) >= {"file", "line", "function", "code"}
    assert isinstance(site["location"]["line"], int)
    assert SUMMARY_FIELDS <= site["output"].keys()
    for summary in site["inputs"]:
        assert SUMMARY_FIELDS <= summary.keys() and summary["name"]


def test_a_nonfinite_report_has_every_contract_field(tmp_path, script):
    script("train.py", "import torch\nw = torch.nn.Parameter(torch.tensor([4.0]))\n"
                       "loss = torch.sqrt(w - 5).sum()\nloss.backward()\n")
    report = run_nandoctor(["run", "train.py"], tmp_path).report
    assert report["schema"] == "nandoctor.run/1"
    assert report["status"] == "nonfinite" and report["exit_code"] == 3
    assert report["script"] == "train.py"
    assert report["step"] is None  # no optimizer was seen
    assert_site(report["event"])
    assert_site(report["root"])
    assert report["root"]["location"]["file"] == "train.py"
    assert report["root"]["location"]["code"] == "loss = torch.sqrt(w - 5).sum()"
    assert report["cause"]["id"] in CAUSE_IDS
    assert all(report["cause"][k] for k in ("title", "explanation", "fix"))
    assert report["lineage"] and report["lineage"][0]["op"] == report["root"]["op"]
    for entry in report["lineage"]:
        assert {"op", "phase", "location"} <= entry.keys()


def test_a_clean_report_has_null_event_root_cause_and_empty_lineage(tmp_path, script):
    script("train.py", "import torch\nprint(torch.ones(2).sum())\n")
    report = run_nandoctor(["run", "train.py"], tmp_path).report
    assert report["status"] == "clean" and report["exit_code"] == 0
    assert report["event"] is None and report["root"] is None and report["cause"] is None
    assert report["lineage"] == []


DISCARDING = """\
import torch
with torch.no_grad():
    p = torch.tensor([0.5, 0.0, 0.5])
    entropy = -torch.where(p > 0, p * torch.log(p), torch.zeros_like(p)).sum()
print(round(entropy.item(), 3))
"""


def test_a_clean_run_lists_where_discarded_values_were_made(tmp_path, script):
    script("train.py", DISCARDING)
    result = run_nandoctor(["run", "train.py"], tmp_path)
    assert result.code == 0 and result.stdout == "0.693\n"
    report = result.report
    assert report["status"] == "clean"
    assert report["discarded"] == [{"op": "aten.log.default", "made": "inf", "count": 1, "allowed": False,
                                    "location": {"file": "train.py", "line": 4, "function": "<module>",
                                                 "code": DISCARDING.splitlines()[3].strip()}}]
    assert report["notes"] == []  # the terminal's clean line says it; a note only for places beyond three
    assert isinstance(report["duration_s"], float) and report["duration_s"] > 0


def test_the_run_json_is_to_dict_indented_with_a_final_newline():
    report = RunReport(status="clean", exit_code=0, script="träin.py", step=2)

    text = Json().render_run(report)

    assert text == json.dumps(report.to_dict(), indent=2) + "\n"
    assert '"script": "tr\\u00e4in.py"' in text  # ASCII, as it always was


def test_added_fields_read_back_with_the_report():
    report = RunReport(status="clean", exit_code=0, script="t.py", step=2, duration_s=1.25)
    again = RunReport.from_dict(json.loads(Json().render_run(report)))
    assert again.duration_s == 1.25 and again.step == 2


def test_non_finite_history_values_are_valid_json():
    report = RunReport(status="clean", exit_code=0, script="t.py")
    report.history.loss = [1.0, float("inf"), float("nan")]
    report.history.grad_norm = [float("-inf")]
    data = json.loads(Json().render_run(report))
    assert data["history"]["loss"] == [1.0, "inf", "nan"]
    assert data["history"]["grad_norm"] == ["-inf"]


def test_the_data_json_has_the_contract_fields_and_survives_undecodable_names():
    report = DataReport(files_scanned=3, problems=[Problem("b\udcff.npy", None, "nan", 1, "d", [(0, 1)])])
    text = Json().render_data(report)
    data = json.loads(text)
    assert data["schema"] == "nandoctor.data/1" and data["status"] == "problems"
    assert data["files_scanned"] == 3
    assert data["problems"][0] == {"file": "b\\xff.npy", "key": None, "check": "nan", "count": 1,
                                   "detail": "d", "severity": "error", "positions": [[0, 1]]}
    assert text.endswith("}\n")


def test_the_data_json_keeps_non_ascii_names_readable():
    report = DataReport(files_scanned=1, problems=[Problem("données/é.npy", None, "empty", 0, "")])

    text = Json().render_data(report)

    assert text == json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n"
    assert '"file": "données/é.npy"' in text
