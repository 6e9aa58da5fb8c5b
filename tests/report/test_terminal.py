"""The terminal report of a run and of a data check, rendered with a console on a StringIO."""
from __future__ import annotations

import io
import re

from rich.console import Console

from nandoctor.datacheck.model import DataReport, Problem
from nandoctor.diagnose import build_report
from nandoctor.report.model import Cause, Discarded, History, Location, Site, RunReport
from nandoctor.report.terminal import Terminal, sparkline
from nandoctor.stats import TensorSummary


def summary(name, nan=0, posinf=0, zeros=0, negatives=0, lo=-1.0, hi=1.0) -> TensorSummary:
    return TensorSummary(name, (4,), "float32", lo, hi, nan, posinf, 0, zeros, negatives, 4)


def rendered(report: RunReport, **console_options) -> str:
    buffer = io.StringIO()
    text = Terminal(Console(file=buffer, width=110, **console_options), context_lines=1).render_run(report)
    assert buffer.getvalue() == ""  # rendered to a string; the destination writes it
    return text


def nonfinite_report(tmp_path) -> RunReport:
    source = tmp_path / "train.py"
    source.write_text("x = load()\nloss = -(y * torch.log(p)).sum()  # [bold]not markup[/]\nloss.backward()\n")
    location = Location(str(source), 2, "<module>", "loss = -(y * torch.log(p)).sum()  # [bold]not markup[/]")
    root = Site("aten.log.default", "forward", location, module="head",
                  output=TensorSummary("output", (4,), "float32", -2.0, 0.0, 0, 0, 1, 0, 1, 4),
                  inputs=[summary("self", zeros=1, lo=0.0, hi=0.9)])
    event = Site("aten.mul.Tensor", "forward", location, output=summary("output", nan=1))
    return RunReport(
        status="nonfinite", exit_code=3, script="train.py", step=7, event=event, root=root,
        lineage=[root, event], reason="NaN",
        cause=Cause("log_nonpositive", "log of a non-positive value", "1 of 4 inputs are 0.", "Use F.log_softmax."),
        history=History([1, 2, 3], [1.0, 10.0, 100.0], [0.5, 5.0, float("inf")]),
    )


def test_a_nonfinite_report_shows_cause_fix_root_source_inputs_and_lineage(tmp_path):
    text = rendered(nonfinite_report(tmp_path), no_color=True)
    # The run stopped on a NaN; its root, log(0), made an Inf.
    assert "NaN from an Inf in forward at" in text and "after 7 optimizer steps" in text
    assert "log of a non-positive value" in text and "(log_nonpositive)" in text
    assert "Fix: Use F.log_softmax." in text
    assert "Root: aten.log.default" in text and "module head" in text
    assert "→    2 │ loss = -(y * torch.log(p)).sum()" in text  # the culprit line, marked
    assert "     1 │ x = load()" in text  # with context around it
    assert "self float32[4] x∈[0, 0.9] zeros=1" in text
    assert "Lineage (root → where it stopped)" in text and "aten.mul.Tensor" in text
    assert "loss:" in text and "▁" in text and "█" in text


def test_on_an_ascii_stream_every_mark_has_one_ascii_character_and_the_frame_lines_up(tmp_path):
    stream = io.TextIOWrapper(io.BytesIO(), encoding="ascii")  # stderr under LC_ALL=C
    text = Terminal(Console(file=stream, width=110, no_color=True), context_lines=1).render_run(
        nonfinite_report(tmp_path))
    text.encode("ascii")
    assert ">    2 | loss = -(y * torch.log(p)).sum()" in text and "self float32[4] x=[0, 0.9]" in text
    framed = [line for line in text.splitlines() if line.startswith("|")]
    assert framed and {len(line) for line in framed} == {110}


def test_near_miss_a_utf8_stream_keeps_the_marks(tmp_path):
    stream = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    text = Terminal(Console(file=stream, width=110, no_color=True), context_lines=1).render_run(
        nonfinite_report(tmp_path))
    assert "→    2 │ loss" in text and "x∈[0, 0.9]" in text


def test_user_text_is_never_read_as_markup(tmp_path):
    text = rendered(nonfinite_report(tmp_path), no_color=True)
    assert "[bold]not markup[/]" in text


def test_the_context_lines_setting_widens_the_source_excerpt(tmp_path):
    report = nonfinite_report(tmp_path)
    console = Console(file=io.StringIO(), width=110, no_color=True)

    assert "     1 │ x = load()" not in Terminal(console, context_lines=0).render_run(report)
    assert "     3 │ loss.backward()" in Terminal(console, context_lines=1).render_run(report)


COLOUR_CODE = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-8]|9[0-7])[;m]")


def test_no_escape_codes_without_a_terminal(tmp_path):
    assert "\x1b[" not in rendered(nonfinite_report(tmp_path), force_terminal=False)


def test_the_target_streams_terminal_ness_decides_the_colour(tmp_path):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    report = nonfinite_report(tmp_path)
    assert COLOUR_CODE.search(Terminal(Console(file=Tty(), width=110)).render_run(report))
    assert "\x1b[" not in Terminal(Console(file=io.StringIO(), width=110)).render_run(report)


def test_no_color_keeps_bold_but_drops_every_colour(tmp_path):
    report = nonfinite_report(tmp_path)
    assert COLOUR_CODE.search(rendered(report, force_terminal=True))
    assert not COLOUR_CODE.search(rendered(report, force_terminal=True, no_color=True))


def test_a_clean_run_is_one_line():
    text = rendered(RunReport(status="clean", exit_code=0, script="train.py", step=5, stopped_by="max_steps"))
    assert "".join(text.strip().splitlines()) == (
        "nandoctor: clean — no NaN or Inf in train.py over 5 optimizer steps (stopped at --max-steps); the script "
        "exited 0."
    )


def test_a_clean_watch_run_says_what_watch_mode_looked_at():
    # It checks the loss, the gradients and, at the end, the parameters; not every value
    # the script prints.
    text = rendered(RunReport(status="clean", exit_code=0, script="train.py", step=5, mode="watch"))
    assert ("no NaN or Inf in the losses, gradients or parameters that reached an optimizer step of train.py over 5 "
            "optimizer steps") in " ".join(text.split())


def test_a_clean_run_that_discarded_values_says_what_was_made_and_where():
    discarded = [Discarded("aten.log.default", Location("train.py", 27, "<module>", "h = p * torch.log(p)"), "inf", 12)]
    report = build_report("train.py", exit_code=0, step=12, discarded=discarded)
    text = " ".join(rendered(report).split())
    assert "no NaN or Inf" not in text
    assert text == (
        "nandoctor: clean — train.py ran 12 optimizer steps and exited 0. Inf made 12 times and discarded before "
        "it changed a parameter, at train.py:27 (aten.log.default)."
    )


def test_a_clean_run_names_three_places_then_counts_the_rest_in_a_note():
    def site(line, count, made="inf", allowed=False):
        return Discarded("aten.div.Tensor", Location("m.py", line, "f", "x / y"), made, count, allowed)

    discarded = [site(1, 5, "nan"), site(2, 4), site(3, 3), site(4, 2), site(5, 1), site(9, 1, allowed=True)]
    text = " ".join(rendered(build_report("t.py", exit_code=0, step=1, discarded=discarded)).split())
    assert "t.py ran 1 optimizer step and exited 0." in text
    assert ("NaN and Inf made 15 times and discarded before it changed a parameter, "
            "at m.py:1 (aten.div.Tensor, 5 times), at m.py:2 (aten.div.Tensor, 4 times), "
            "at m.py:3 (aten.div.Tensor, 3 times) and 2 more places; "
            "Inf made once on lines you allowed, at m.py:9 (aten.div.Tensor).") in text
    assert ("note: non-finite values were also made and discarded: aten.div.Tensor at m.py:4 (Inf, twice); "
            "aten.div.Tensor at m.py:5 (Inf, once).") in text


def test_one_optimizer_step_is_singular_everywhere_in_the_terminal_report(tmp_path):
    report = nonfinite_report(tmp_path)
    report.step = 1
    text = rendered(report, no_color=True)
    assert "after 1 optimizer step " in text and "1 optimizer steps" not in text
    clean = rendered(RunReport(status="clean", exit_code=0, script="t.py", step=1))
    assert "over 1 optimizer step;" in clean
    crashed = rendered(RunReport(status="script_error", exit_code=1, script="t.py", step=1, error={"type": "E"}))
    assert "(after 1 optimizer step)." in crashed


def test_a_script_error_says_nothing_was_found_before_it():
    text = rendered(RunReport(status="script_error", exit_code=1, script="t.py", error={"type": "ValueError"}))
    assert "the script raised ValueError (exit 1); no NaN or Inf was seen before it" in text


def test_a_rank_the_launcher_stopped_says_so_with_the_runs_notes():
    from nandoctor.diagnose import ranks
    from nandoctor.distributed import RankReport

    error, notes = ranks.terminated(RankReport(2, 0, 0, "host", None, []))
    text = rendered(RunReport(status="script_error", exit_code=143, script="t.py", step=2, error=error, notes=notes))
    assert "the script was stopped by SIGTERM (exit 143); no NaN or Inf was seen before it" in text
    assert "note: the launcher stops every rank" in text


def test_sparkline_is_log_scaled_and_marks_non_finite_values():
    assert sparkline([1.0, 10.0, 100.0, 1000.0]) == "▁▃▆█"
    assert sparkline([1.0, float("nan"), None]) == "▁! "


# -- check-data -------------------------------------------------------------------------


def rendered_data(report: DataReport) -> str:
    return Terminal(Console(file=io.StringIO(), width=200, color_system=None)).render_data(report)


def report_with(*problems, scanned=3):
    return DataReport(files_scanned=scanned, problems=list(problems))


def test_clean_data_report_is_one_summary_line():
    assert rendered_data(report_with()).strip() == "3 files checked, no problems"


def test_problems_are_grouped_by_file_and_counted_in_the_summary():
    text = rendered_data(report_with(
        Problem("a.npz", "x", "nan", 2, "2 NaN"),
        Problem("masks/0007.png", None, "constant", 1, "all 0", severity="warning"),
        Problem("a.npz", "y", "inf", 1, "1 Inf"),
    ))
    assert text.count("a.npz") == 1  # the file is named once for its group
    assert text.index("1 Inf") < text.index("masks/0007.png")  # its problems are together
    assert "3 problems in 2 files (2 errors, 1 warning)" in text


def test_file_names_with_markup_newlines_and_bad_bytes_are_shown_literally():
    odd = "[bold]x\ny\udcff.npy"
    text = rendered_data(report_with(Problem(odd, None, "nan", 1, "1 NaN [red]")))
    assert "[bold]x\\ny\\xff.npy" in text and "1 NaN [red]" in text


def test_skipped_files_are_mentioned():
    report = DataReport(files_scanned=1, files_skipped=4)
    assert "4 files skipped" in rendered_data(report)


def test_errors_are_red_and_warnings_yellow_on_a_terminal():
    console = Console(file=io.StringIO(), width=200, force_terminal=True, color_system="standard")
    text = Terminal(console).render_data(report_with(
        Problem("a.npy", None, "nan", 1, ""), Problem("b.npy", None, "constant", 1, "", severity="warning")))
    assert "\x1b[1;31mnan" in text and "\x1b[33mconstant" in text


# -- 80 columns (CI logs, pipes) --------------------------------------------------------


def rendered_at(report: RunReport, width: int = 80) -> str:
    return Terminal(Console(file=io.StringIO(), width=width, color_system=None), context_lines=1).render_run(report)


def deep_report(tmp_path) -> RunReport:
    folder = tmp_path / "experiments" / "2024-05-01-gaussian-sweep" / "run-12-lr3e-4" / "deep"
    folder.mkdir(parents=True)
    source = folder / "train_gaussian_variance.py"
    code = "nll = 0.5 * torch.log(var) + (residuals ** 2).mean() / (2 * var) + weight_decay * parameter_norm_sq"
    source.write_text(f"for step in range(20):\n    {code}\n    nll.backward()\n")
    location = Location(str(source), 2, "<module>", code)
    elsewhere = Location(str(tmp_path / "models" / "heads" / "gaussian_likelihood_head.py"), 41, "forward", "y = a * b")
    root = Site("aten.log.default", "forward", location, output=summary("output", nan=1))
    event = Site("aten.mul.Tensor", "forward", elsewhere, output=summary("output", nan=1))
    return RunReport(status="nonfinite", exit_code=3, script=str(source), step=25, event=event, root=root,
                     lineage=[root, event], reason="NaN")


def test_at_80_columns_the_headline_keeps_its_line_shortening_the_path_from_the_left(tmp_path):
    text = rendered_at(deep_report(tmp_path))
    top = text.splitlines()[0]
    assert len(top) <= 80
    assert top.startswith("╭─ nandoctor: NaN in forward at …/")
    assert "/deep/train_gaussian_variance.py:2 " in top  # the file name whole, the line number kept
    assert all(len(line) <= 80 for line in text.splitlines())


def test_at_80_columns_a_long_code_line_wraps_under_the_code_not_at_the_left_edge(tmp_path):
    lines = rendered_at(deep_report(tmp_path)).splitlines()
    marked = next(i for i, line in enumerate(lines) if "→" in line)
    gutter = lines[marked].index("2 │") + len("2 │")
    assert "nll = 0.5 * torch.log(var)" in lines[marked]
    continuation = lines[marked + 1]
    # The rest of the line continues in the code column, after blanks only.
    assert continuation[1:gutter].strip() == ""
    assert "weight_decay * parameter_norm_sq" in continuation


def test_a_long_lineage_shows_its_ends_and_counts_what_it_leaves_out(tmp_path):
    # Sinkhorn's iterations unrolled op by op: 40 rows; the JSON keeps them all.
    report = nonfinite_report(tmp_path)
    middle = [Site(f"aten.op{i}.default", "forward", report.root.location, output=summary("output", nan=1))
              for i in range(38)]
    report.lineage = [report.root, *middle, report.event]
    text = rendered(report)
    assert "aten.op0.default" in text and "aten.op37.default" in text and "aten.mul.Tensor" in text
    assert "aten.op10.default" not in text and "… 24 more ops (every one in the JSON report)" in text
    assert len(report.to_dict()["lineage"]) == 40


def test_at_80_columns_a_lineage_location_in_another_file_is_never_broken(tmp_path):
    text = rendered_at(deep_report(tmp_path))
    assert "gaussian_likelihood_head.py:41" in text  # shortened from the left, if at all, never broken


def test_a_narrow_console_still_shows_the_line_number(tmp_path):
    top = rendered_at(deep_report(tmp_path), width=40).splitlines()[0]
    assert len(top) <= 40 and "…" in top
    assert ":2 " in top or top.rstrip("─╮").endswith(":2")


def test_at_80_columns_check_data_keeps_every_path_whole_and_says_error_or_warning():
    deep = "experiments/2024-05-01/run-12/data/train/shards/dangling_labels_v2_for_the_big_sweep.npy"
    report = report_with(
        Problem(deep, "['labels']", "label_range", 1234, "1,234 labels outside [0, 10) (values span -1..12)"),
        Problem(deep, None, "nan", 3, "3 NaN of 100 values (3%)"),
        Problem("masks/dangling.npy", None, "constant", 1, "all 4 values are 0", severity="warning"),
    )
    text = Terminal(Console(file=io.StringIO(), width=80, color_system=None)).render_data(report)
    lines = text.splitlines()
    assert deep in lines and "masks/dangling.npy" in lines  # each path whole, on a line of its own
    header = lines[0].split()
    assert header == ["severity", "check", "key", "count", "detail"]
    rows = {line.split()[1]: line.split()[0] for line in lines if line.startswith("  ") and line.split()}
    assert rows["label_range"] == "error" and rows["nan"] == "error" and rows["constant"] == "warning"
    assert all(len(line) <= 80 for line in lines if line not in (deep,))


def test_without_keys_the_check_data_table_has_no_key_column():
    text = rendered_data(report_with(Problem("a.npy", None, "nan", 2, "2 NaN")))
    assert text.splitlines()[0].split() == ["severity", "check", "count", "detail"]
