"""The outputs both commands publish, built from their options in one place."""
from __future__ import annotations

import io

import pytest

from nandoctor.cli.outputs import report_outputs
from nandoctor.config import load_config
from nandoctor.errors import UsageError
from nandoctor.report.github import Annotations, StepSummary
from nandoctor.report.json_report import Json
from nandoctor.report.junit import JUnit
from nandoctor.report.render import AppendFile, AtomicFile, Stream
from nandoctor.report.terminal import Terminal

CONFIG = load_config()


def kinds(outputs) -> list[tuple[type, type]]:
    return [(type(o.renderer), type(o.destination)) for o in outputs]


def test_without_options_only_the_terminal_report_on_the_given_stream():
    stream = io.StringIO()
    (output,) = report_outputs(stream, CONFIG, environ={})

    assert isinstance(output.renderer, Terminal) and output.destination == Stream(stream)
    assert output.renderer.console.file is stream  # rendered for that stream's terminal-ness
    assert output.renderer.context_lines == CONFIG.run["context_lines"]


def test_json_and_junit_are_files_and_github_adds_annotations_and_the_summary(tmp_path):
    stream = io.StringIO()
    environ = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}
    config = load_config().with_overrides("ci", max_annotations=3)

    outputs = report_outputs(stream, config, json_path=tmp_path / "r.json", junit_path=tmp_path / "r.xml",
                             environ=environ)

    assert kinds(outputs) == [(Terminal, Stream), (Json, AtomicFile), (JUnit, AtomicFile),
                              (Annotations, Stream), (StepSummary, AppendFile)]
    assert [o.destination.path for o in outputs[1:3]] == [tmp_path / "r.json", tmp_path / "r.xml"]
    assert outputs[3].destination == Stream(stream) and outputs[3].renderer.limit == 3


@pytest.mark.parametrize("option", ["json_path", "junit_path"])
def test_an_unwritable_report_path_fails_while_building_before_any_work(tmp_path, option):
    with pytest.raises(UsageError, match="does not exist"):
        report_outputs(io.StringIO(), CONFIG, environ={}, **{option: tmp_path / "missing" / "r"})
