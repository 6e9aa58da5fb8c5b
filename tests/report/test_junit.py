"""JUnit XML for CI: `nandoctor run` is one test case, `check-data` one test case per file."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from nandoctor.datacheck.model import DataReport, Problem
from nandoctor.report.junit import JUnit
from nandoctor.report.model import Cause, Discarded, Location, RunReport, Site
from nandoctor.stats import TensorSummary


def summary(name, **counts) -> TensorSummary:
    values = dict(shape=(4,), dtype="float32", min=-1.0, max=2.0, nan=0, posinf=0, neginf=0,
                  zeros=0, negatives=0, numel=4)
    values.update(counts)
    return TensorSummary(name=name, **values)


def nonfinite_report() -> RunReport:
    root = Site(
        op="aten.log.default", phase="forward",
        location=Location("train.py", 12, "forward", "y = torch.log(x)"),
        module="encoder.norm", inputs=[summary("self", negatives=1)], output=summary("output", nan=1),
    )
    event = Site(
        op="aten.mul.Tensor", phase="forward",
        location=Location("train.py", 14, "forward", "loss = y * w"), output=summary("output", nan=4),
    )
    return RunReport(
        status="nonfinite", exit_code=3, script="train.py", step=7, event=event, root=root,
        lineage=[root, event], reason="the loss is non-finite",
        cause=Cause("log_nonpositive", "log of a non-positive value",
                    "torch.log got -1.0; log is NaN below 0.", "Use torch.log(x.clamp_min(1e-8))."),
    )


def parse(xml: str) -> ET.Element:
    assert xml.startswith('<?xml version="1.0" encoding="UTF-8"?>')
    return ET.fromstring(xml.encode("utf-8"))


def test_nonfinite_run_is_one_failing_test_case_with_the_cause_and_the_root():
    suite = parse(JUnit(time=1.5).render_run(nonfinite_report()))

    assert suite.tag == "testsuite" and suite.get("name") == "nandoctor"
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("time")) == ("1", "1", "0", "1.500")
    (case,) = suite.findall("testcase")
    assert (case.get("classname"), case.get("name")) == ("nandoctor.run", "train.py")
    failure = case.find("failure")
    assert failure.get("type") == "log_nonpositive"
    assert failure.get("message") == "log of a non-positive value: aten.log.default at train.py:12"
    text = failure.text
    assert "torch.log got -1.0" in text
    assert "Fix: Use torch.log(x.clamp_min(1e-8))." in text
    assert "Root: aten.log.default [forward] at train.py:12, module encoder.norm" in text
    assert "y = torch.log(x)" in text
    assert "input  self float32[4]" in text and "neg=1" in text
    assert "Stopped at: aten.mul.Tensor [forward] at train.py:14 (the loss is non-finite)" in text
    assert "Stopped after 7 optimizer steps." in text
    lineage = text[text.index("Lineage"):]
    assert lineage.index("aten.log.default") < lineage.index("aten.mul.Tensor")


def test_clean_run_is_a_passing_test_case():
    suite = parse(JUnit().render_run(RunReport(status="clean", exit_code=0, script="train.py", step=20)))

    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("1", "0", "0")
    (case,) = suite.findall("testcase")
    assert list(case) == []


def test_a_run_is_timed_by_its_own_duration_unless_a_time_is_given():
    report = RunReport(status="clean", exit_code=0, script="train.py", step=20, duration_s=3.2149)
    suite = parse(JUnit().render_run(report))
    assert suite.get("time") == "3.215" and suite.find("testcase").get("time") == "3.215"
    assert parse(JUnit(time=1.0).render_run(report)).get("time") == "1.000"
    untimed = RunReport(status="clean", exit_code=0, script="train.py")
    assert parse(JUnit().render_run(untimed)).get("time") == "0.000"


def test_a_clean_run_that_discarded_values_passes_and_says_what_was_made():
    report = RunReport(status="clean", exit_code=0, script="train.py", step=3, discarded=[
        Discarded("aten.log.default", Location("train.py", 4, "<module>", "h = torch.log(p)"), "inf", 2)])
    suite = parse(JUnit().render_run(report))
    assert (suite.get("failures"), suite.get("errors")) == ("0", "0")
    assert suite.find("testcase/system-out").text == (
        "clean: Inf made twice and discarded before it changed a parameter, "
        "at train.py:4 (aten.log.default).")


def test_script_error_is_an_error_not_a_failure():
    report = RunReport(status="script_error", exit_code=1, script="train.py",
                       error={"type": "RuntimeError", "message": "shape mismatch"})
    suite = parse(JUnit().render_run(report))

    assert (suite.get("failures"), suite.get("errors")) == ("0", "1")
    error = suite.find("testcase/error")
    assert error.get("type") == "RuntimeError"
    assert error.get("message") == "RuntimeError: shape mismatch"


def test_markup_and_control_characters_in_user_text_still_give_valid_xml():
    report = nonfinite_report()
    report.script = 'odd <name> & "quotes".py'
    report.root.location = Location("a<b>.py", 3, "f", "x = y < z & w\x00\x1b[31m")

    suite = parse(JUnit().render_run(report))  # raises if the XML were malformed

    case = suite.find("testcase")
    assert case.get("name") == 'odd <name> & "quotes".py'
    assert "x = y < z & w\\x00\\x1b[31m" in case.find("failure").text


def data_report(*problems, files_scanned=3) -> DataReport:
    return DataReport(files_scanned=files_scanned, problems=list(problems))


def problem(file, check, key=None, count=1, detail="", severity="error") -> Problem:
    return Problem(file, key, check, count, detail, severity=severity)


def test_data_report_has_one_case_per_file_and_fails_the_files_with_errors():
    report = data_report(
        problem("x.npz", "nan", key="features", count=3, detail="3 NaN values"),
        problem("masks/7.png", "constant", detail="all pixels are 0", severity="warning"),
        problem("x.npz", "inf", key="labels", count=1, detail="1 +Inf value"),
    )
    suite = parse(JUnit(files=["ok.npy", "x.npz", "masks/7.png"]).render_data(report))

    cases = {case.get("name"): case for case in suite.findall("testcase")}
    assert list(cases) == ["ok.npy", "x.npz", "masks/7.png"]
    assert (suite.get("name"), suite.get("tests"), suite.get("failures")) == ("nandoctor.check-data", "3", "1")
    assert list(cases["ok.npy"]) == []
    failure = cases["x.npz"].find("failure")
    assert failure.get("message") == "2 problems in x.npz: nan, inf"
    assert failure.get("type") == "nan"
    assert failure.text.splitlines() == ["nan in 'features' (×3): 3 NaN values", "inf in 'labels': 1 +Inf value"]
    # A warning (not in check_data.errors) does not fail its file; it is reported beside it.
    assert cases["masks/7.png"].find("failure") is None
    assert cases["masks/7.png"].find("system-out").text == "warning: constant: all pixels are 0"


def test_data_report_without_the_file_list_names_the_problem_files_only():
    report = data_report(problem("a.npy", "nan"), problem("b.npy", "empty"))
    suite = parse(JUnit().render_data(report))

    assert [case.get("name") for case in suite.findall("testcase")] == ["a.npy", "b.npy"]
    assert suite.get("failures") == "2"


def test_clean_data_report_without_the_file_list_is_one_passing_case():
    suite = parse(JUnit().render_data(data_report(files_scanned=120)))

    (case,) = suite.findall("testcase")
    assert case.get("name") == "check-data (120 files)"
    assert suite.get("failures") == "0"


def test_an_undecodable_file_name_still_gives_valid_xml():
    suite = parse(JUnit().render_data(data_report(problem("bad\udcff\x01.npy", "unreadable"))))

    assert suite.find("testcase").get("name") == "bad\\udcff\\x01.npy"
