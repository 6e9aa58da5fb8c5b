"""The renderers: a table grouped by file and a summary line; JSON per the contract."""
import io
import json

from rich.console import Console

from nandoctor.datacheck.model import DataReport, Problem
from nandoctor.report.data_json import to_json
from nandoctor.report.data_terminal import render


def rendered(report):
    out = io.StringIO()
    render(report, Console(file=out, width=200, color_system=None))
    return out.getvalue()


def report_with(*problems, scanned=3):
    return DataReport(files_scanned=scanned, problems=list(problems))


def test_clean_report_is_one_summary_line():
    assert rendered(report_with()).strip() == "3 files checked, no problems"


def test_problems_are_grouped_by_file_and_counted_in_the_summary():
    text = rendered(report_with(
        Problem("a.npz", "x", "nan", 2, "2 NaN"),
        Problem("a.npz", "y", "inf", 1, "1 Inf"),
        Problem("masks/0007.png", None, "constant", 1, "all 0", severity="warning"),
    ))
    assert text.count("a.npz") == 1  # the file is named once for its group
    assert "masks/0007.png" in text and "constant" in text
    assert "3 problems in 2 files (2 errors, 1 warning)" in text


def test_file_names_with_markup_newlines_and_bad_bytes_are_shown_literally():
    odd = "[bold]x\ny\udcff.npy"
    text = rendered(report_with(Problem(odd, None, "nan", 1, "1 NaN [red]")))
    assert "[bold]x\\ny\\xff.npy" in text and "1 NaN [red]" in text


def test_skipped_files_are_mentioned():
    report = DataReport(files_scanned=1, files_skipped=4)
    assert "4 files skipped" in rendered(report)


def test_json_has_the_contract_fields_and_survives_undecodable_names():
    data = json.loads(to_json(report_with(Problem("b\udcff.npy", None, "nan", 1, "d", [(0, 1)]))))
    assert data["schema"] == "nandoctor.data/1" and data["status"] == "problems"
    assert data["files_scanned"] == 3
    assert data["problems"][0] == {"file": "b\\xff.npy", "key": None, "check": "nan", "count": 1,
                                   "detail": "d", "severity": "error", "positions": [[0, 1]]}


def test_the_config_decides_error_warning_or_silence():
    from nandoctor.datacheck.model import ERROR, WARNING, Problem, apply_severity

    problems = [Problem(file="a.npy", key=None, check=check, count=1, detail="")
                for check in ("nan", "constant", "fp16_range")]
    marked = apply_severity(problems, ["nan"], ["constant"])
    assert [(p.check, p.severity) for p in marked] == [("nan", ERROR), ("constant", WARNING)]
