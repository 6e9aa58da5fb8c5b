"""The typed detection result: what detection hands over, and its JSON (added fields only)."""
from __future__ import annotations

import dataclasses
import json

from nandoctor.detect.result import (BatchOrigin, CtcItem, CtcLengths, Location, ParameterRef, Site, SiteFacts)
from nandoctor.report.model import RunReport
from nandoctor.stats import TensorSummary

EVERY_FACT = SiteFacts(
    parameter=ParameterRef(None, (3, 2), group=0, index=1, trained=False, buffer=True), loads_parameter=True, parameter_before_step=True,
    written_by_optimizer=True, optimizer="Adam", untracked_input=True,
    inf_written_at=Location("model.py", 12, "forward", "scores.masked_fill_(mask, -inf)"),
    batch=BatchOrigin(20, "[0]", rows=(3, 5), dataset_indices=(137, 9), refetched_finite=True), device_flag="nan",
    gradient_leak_through="DivBackward0", input_producers={"self": "SoftmaxBackward0"},
    ctc=CtcLengths((6, 6), (2, 7), (CtcItem(1, 6, 7, 0),)), exponent=-0.5, loss=float("nan"), grad_norm=2.5,
    ignore_index=-100, counted_targets=0, reduced_count=1, correction=1.0,
)


def test_site_facts_survive_a_json_round_trip():
    back = SiteFacts.from_dict(json.loads(json.dumps(EVERY_FACT.to_dict())))
    assert repr(back) == repr(EVERY_FACT)  # repr: NaN != NaN would fail a plain ==


def test_site_facts_json_keeps_the_flat_keys_reports_already_had():
    data = EVERY_FACT.to_dict()
    assert data["batch"] == 20 and data["key"] == "[0]" and data["rows"] == [3, 5]
    assert data["dataset_indices"] == [137, 9] and data["refetched_finite"] is True
    assert data["impossible"] == [{"item": 1, "input_length": 6, "target_length": 7, "repeats": 0}]
    assert data["parameter"] is None and data["parameter_shape"] == [3, 2] and data["parameter_position"] == [0, 1]
    assert data["parameter_trained"] is False


def test_empty_facts_write_nothing():
    assert SiteFacts().to_dict() == {}


def test_what_a_site_made_comes_from_its_output_or_its_device_flag():
    nan_out = TensorSummary("output", (2,), "float32", 1.0, 1.0, 1, 0, 0, 0, 0, 2)
    inf_out = TensorSummary("output", (2,), "float32", 1.0, 1.0, 0, 1, 0, 0, 0, 2)
    assert Site("aten.log.default", "forward", None, output=nan_out).made == "nan"
    assert Site("aten.exp.default", "forward", None, output=inf_out).made == "inf"
    assert Site("aten.exp.default", "forward", None, facts=SiteFacts(device_flag="inf")).made == "inf"


def test_a_report_read_back_from_json_has_the_same_sites_and_stop_reason():
    location = Location("train.py", 4, "<module>", "y = torch.log(x)")
    facts = dataclasses.replace(EVERY_FACT, loss=1.5)  # (JSON has no NaN: the renderer writes "nan")
    root = Site("aten.log.default", "forward", location, step=2, facts=facts)
    report = RunReport(status="nonfinite", exit_code=3, script="train.py", step=2, event=root, root=root,
                       lineage=[root], reason="NaN")
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    back = RunReport.from_dict(data)
    assert back.reason == "NaN" and data["event"]["reason"] == "NaN" and data["root"]["reason"] == "NaN"
    assert back.root.location == location and back.root.facts.batch == EVERY_FACT.batch
    assert back.root.facts == facts
