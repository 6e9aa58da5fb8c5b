"""The data report model: severities from the config, problems grouped by file.
(Its renderers are tested per format in tests/report/.)"""
from nandoctor.datacheck.model import ERROR, WARNING, DataReport, Problem, apply_severity


def test_the_config_decides_error_warning_or_silence():
    problems = [Problem(file="a.npy", key=None, check=check, count=1, detail="")
                for check in ("nan", "constant", "fp16_range")]
    marked = apply_severity(problems, ["nan"], ["constant"])
    assert [(p.check, p.severity, p.is_error) for p in marked] == [("nan", ERROR, True), ("constant", WARNING, False)]


def test_problems_are_grouped_by_file_in_order_of_first_appearance():
    a1, b, a2 = (Problem("a.npz", "x", "nan", 1, ""), Problem("b.npy", None, "inf", 1, ""),
                 Problem("a.npz", "y", "inf", 1, ""))
    report = DataReport(files_scanned=2, problems=[a1, b, a2])

    assert report.by_file() == {"a.npz": [a1, a2], "b.npy": [b]}
    assert report.files_with_problems() == ["a.npz", "b.npy"]
