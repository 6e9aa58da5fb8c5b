"""GitHub Actions output: annotations on the culprit line, and a markdown step summary."""
from __future__ import annotations

import io

from nandoctor.datacheck.model import DataReport, Problem
from nandoctor.report.github import (
    Annotations,
    StepSummary,
    annotation_path,
    escape_data,
    escape_property,
    outputs,
)
from nandoctor.report.model import Cause, Discarded, Location, RunReport, Site
from nandoctor.report.render import publish
from nandoctor.stats import TensorSummary


def summary(name, **counts) -> TensorSummary:
    values = dict(shape=(4,), dtype="float32", min=-1.0, max=2.0, nan=0, posinf=0, neginf=0,
                  zeros=0, negatives=0, numel=4)
    values.update(counts)
    return TensorSummary(name=name, **values)


def nonfinite_report(file="train.py", title="log of a non-positive value") -> RunReport:
    root = Site(
        op="aten.log.default", phase="forward",
        location=Location(file, 12, "forward", "y = torch.log(x)"),
        module="encoder.norm", inputs=[summary("self", negatives=1)], output=summary("output", nan=1),
    )
    event = Site(op="aten.mul.Tensor", phase="forward",
                   location=Location(file, 14, "forward", "loss = y * w"), output=summary("output", nan=4))
    return RunReport(
        status="nonfinite", exit_code=3, script=file, step=7, event=event, root=root, lineage=[root, event],
        cause=Cause("log_nonpositive", title, "torch.log got -1.0; log is NaN below 0.",
                    "Use torch.log(x.clamp_min(1e-8))."),
    )


def test_escaping_follows_the_workflow_command_rules():
    assert escape_data("50% done\r\nnext: a, b") == "50%25 done%0D%0Anext: a, b"
    assert escape_property("50% done\r\nnext: a, b") == "50%25 done%0D%0Anext%3A a%2C b"
    # `%` first, so an already-escaped-looking text is not decoded by GitHub.
    assert escape_data("%0A") == "%250A"


def run_annotations(report: RunReport) -> list[str]:
    return Annotations().render_run(report).splitlines()


def test_nonfinite_run_gives_one_error_on_the_root_line():
    (line,) = run_annotations(nonfinite_report())

    head, message = line[2:].split("::", 1)
    assert head == "error file=train.py,line=12,title=nandoctor%3A log of a non-positive value"
    lines = message.split("%0A")
    assert lines[0] == "log of a non-positive value: aten.log.default in forward at train.py:12"
    assert "module: encoder.norm" in lines
    assert "torch.log got -1.0; log is NaN below 0." in lines
    assert lines[-1] == "Fix: Use torch.log(x.clamp_min(1e-8))."


def test_commas_colons_and_percent_in_properties_cannot_break_the_annotation():
    report = nonfinite_report(file="runs/a,b:c%.py", title="x, y: 100%")
    (line,) = run_annotations(report)

    head = line[2:].split("::", 1)[0]
    assert head == "error file=runs/a%2Cb%3Ac%25.py,line=12,title=nandoctor%3A x%2C y%3A 100%25"
    assert "\n" not in line and "\r" not in line


def test_clean_and_crashed_runs_have_no_annotation():
    assert Annotations().render_run(RunReport(status="clean", exit_code=0, script="train.py")) == ""
    crashed = RunReport(status="script_error", exit_code=1, script="train.py",
                        error={"type": "ValueError", "message": "bad"})
    assert Annotations().render_run(crashed) == ""


def test_run_summary_tells_where_what_went_in_and_why():
    md = StepSummary().render_run(nonfinite_report())

    assert md.startswith("### ❌ nandoctor: non-finite value in `train.py`")
    assert "**log of a non-positive value** (`log_nonpositive`) — after 7 optimizer steps." in md
    assert "| event | `aten.mul.Tensor` | forward | `train.py:14` |  |" in md
    assert "| root | `aten.log.default` | forward | `train.py:12` | `encoder.norm` |" in md
    assert "```python\ny = torch.log(x)\n```" in md
    assert "- `self float32[4] x∈[-1, 2] neg=1`" in md
    assert "1. `aten.log.default` (forward) at `train.py:12` in `encoder.norm`" in md
    assert "2. `aten.mul.Tensor` (forward) at `train.py:14`" in md
    assert "**Cause.** torch.log got -1.0" in md
    assert "**Fix.** Use torch.log(x.clamp_min(1e-8))." in md


def test_run_summary_with_the_event_at_the_root_has_one_row():
    report = nonfinite_report()
    report.event, report.lineage = report.root, [report.root]
    md = StepSummary().render_run(report)

    assert "| event = root | `aten.log.default` |" in md
    assert "| root |" not in md and "**Lineage**" not in md


def test_pipes_in_table_cells_are_escaped():
    report = nonfinite_report()
    report.root.module = "blocks|0"
    md = StepSummary().render_run(report)

    assert "`blocks\\|0`" in md


def test_clean_run_summary_is_one_line_with_the_steps():
    report = RunReport(status="clean", exit_code=0, script="train.py", step=20, stopped_by="max_steps")

    md = StepSummary().render_run(report)

    assert md == "✅ **nandoctor**: `train.py` ran clean — no NaN/Inf, 20 optimizer steps (stopped at max_steps).\n"


def test_one_step_is_singular_and_a_clean_summary_says_what_was_discarded():
    report = nonfinite_report()
    report.step = 1
    assert "— after 1 optimizer step." in StepSummary().render_run(report)
    clean = RunReport(status="clean", exit_code=0, script="train.py", step=1, discarded=[
        Discarded("aten.div.Tensor", Location("train.py", 9, "<module>", "r = a / b"), "nan", 3)])
    assert StepSummary().render_run(clean) == (
        "✅ **nandoctor**: `train.py` ran clean — NaN made 3 times and discarded before it changed a "
        "parameter, at train.py:9 (aten.div.Tensor), 1 optimizer step.\n")


def test_script_error_summary_names_the_exception():
    report = RunReport(status="script_error", exit_code=1, script="train.py",
                       error={"type": "ValueError", "message": "bad shape"})

    assert "`ValueError: bad shape`" in StepSummary().render_run(report)


def problem(file, check, key=None, count=1, detail="", severity="error") -> Problem:
    return Problem(file, key, check, count, detail, severity=severity)


def data_report(*problems, files_scanned=5) -> DataReport:
    return DataReport(files_scanned=files_scanned, problems=list(problems))


def test_data_annotations_are_one_per_file_errors_first_and_capped():
    report = data_report(
        problem("masks/1.png", "constant", detail="all 0", severity="warning"),
        problem("x.npz", "nan", key="a", count=3, detail="3 NaN values"),
        problem("x.npz", "inf", key="b", detail="1 +Inf value"),
        problem("y.npy", "empty", detail="no elements"),
    )

    text = Annotations(limit=None).render_data(report)
    lines = text.splitlines()
    assert text.endswith("\n")
    assert [line.split(" ", 1)[0] for line in lines] == ["::error", "::error", "::warning"]
    assert lines[0] == ("::error file=x.npz,title=nandoctor check-data%3A nan%2C inf::"
                        "nan in 'a' (×3): 3 NaN values%0Ainf in 'b': 1 +Inf value")
    assert lines[1] == "::error file=y.npy,title=nandoctor check-data%3A empty::empty: no elements"
    assert lines[2].startswith("::warning file=masks/1.png,")
    capped = Annotations(limit=2).render_data(report).splitlines()
    assert len(capped) == 3
    assert [line.split(" ", 1)[0] for line in capped[:2]] == ["::error", "::error"]
    # One more line says what was left out, so the cap is never silent.
    assert capped[2] == ("::warning title=nandoctor check-data::"
                         "and 1 more file with problems (see the step summary / JSON report)")
    assert len(Annotations(limit=1).render_data(report).splitlines()) == 2
    assert "and 2 more files with problems" in Annotations(limit=1).render_data(report)
    assert "more file" not in Annotations(limit=3).render_data(report)
    assert Annotations(limit=0).render_data(report) == ""


def test_annotation_paths_are_relative_to_the_workspace(tmp_path, monkeypatch):
    sub = tmp_path / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)
    workspace = str(tmp_path)
    assert annotation_path("train.py", workspace) == "sub/train.py"
    assert annotation_path("data/x.npy", workspace) == "sub/data/x.npy"
    assert annotation_path(str(sub / "train.py"), workspace) == "sub/train.py"
    assert annotation_path("../top.py", workspace) == "top.py"
    # Outside the workspace, or no workspace: as given.
    assert annotation_path("/usr/lib/python3/x.py", workspace) == "/usr/lib/python3/x.py"
    assert annotation_path("train.py", None) == "train.py"

    (line,) = Annotations(workspace=workspace).render_run(nonfinite_report()).splitlines()
    assert line.startswith("::error file=sub/train.py,line=12,")
    data = data_report(problem("x.npz", "nan", detail="1 NaN value"))
    assert Annotations(workspace=workspace).render_data(data).startswith("::error file=sub/x.npz,")


def test_outputs_take_the_workspace_from_github_workspace(tmp_path, monkeypatch):
    sub = tmp_path / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)
    stream = io.StringIO()
    found = outputs(stream, 10, {"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(tmp_path)})
    publish(nonfinite_report(), found)
    assert stream.getvalue().startswith("::error file=sub/train.py,line=12,")


def test_data_summary_lists_every_problem():
    report = data_report(problem("x.npz", "nan", key="a", count=3, detail="3 NaN values"),
                         problem("m.png", "constant", detail="all 0", severity="warning"))
    md = StepSummary().render_data(report)

    assert md.startswith("### ❌ nandoctor check-data: 2 of 5 files with problems")
    assert "1 with errors, 1 with warnings only." in md
    assert "| `x.npz` | `a` | `nan` | 3 | 3 NaN values | error |" in md
    assert "| `m.png` |  | `constant` | 1 | all 0 | warning |" in md


def test_data_summary_with_warnings_only_has_the_warning_icon():
    md = StepSummary().render_data(data_report(problem("m.png", "constant", severity="warning")))

    assert md.startswith("### ⚠️ nandoctor check-data: 1 of 5 files with problems")


def test_clean_data_summary_is_one_line():
    clean = DataReport(files_scanned=120)

    assert StepSummary().render_data(clean) == "✅ **nandoctor check-data**: 120 files scanned, no problems.\n"


# -- where it goes ----------------------------------------------------------------------


def test_no_outputs_outside_github_actions(tmp_path):
    assert outputs(io.StringIO(), environ={"GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}) == []


def test_annotations_go_to_the_stream_and_the_summary_is_appended(tmp_path):
    stream, summary_file = io.StringIO(), tmp_path / "summary.md"
    summary_file.write_text("earlier step\n", encoding="utf-8")
    environ = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary_file)}

    publish(nonfinite_report(), outputs(stream, environ=environ))

    assert stream.getvalue().startswith("::error file=train.py,line=12,")
    assert stream.getvalue().count("\n") == 1
    summary = summary_file.read_text(encoding="utf-8")
    assert summary.startswith("earlier step\n### ❌ nandoctor: non-finite value in `train.py`")


def test_the_annotation_limit_applies_to_data_reports(tmp_path):
    stream = io.StringIO()
    report = data_report(*(problem(f"{i}.npy", "nan") for i in range(5)))

    publish(report, outputs(stream, max_annotations=3, environ={"GITHUB_ACTIONS": "true"}))

    lines = stream.getvalue().splitlines()
    assert [line.split(" ", 1)[1].split(",", 1)[0] for line in lines[:3]] == [
        "file=0.npy", "file=1.npy", "file=2.npy"]
    assert lines[3:] == ["::warning title=nandoctor check-data::"
                         "and 2 more files with problems (see the step summary / JSON report)"]


def test_without_a_summary_file_only_the_annotations_are_written():
    (only,) = outputs(io.StringIO(), environ={"GITHUB_ACTIONS": "true"})

    assert isinstance(only.renderer, Annotations)


def test_an_unwritable_summary_file_is_a_warning_not_a_crash(tmp_path):
    stream = io.StringIO()
    environ = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(tmp_path / "no-dir" / "summary.md")}

    publish(RunReport(status="clean", exit_code=0, script="train.py"), outputs(stream, environ=environ))

    assert stream.getvalue().startswith("::warning::nandoctor could not write the step summary: ")
    assert "No such file or directory" in stream.getvalue()
