"""What both commands print and write, from their options: one list of outputs to publish."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, TextIO

from nandoctor.config import Config
from nandoctor.console import report_console
from nandoctor.report import github
from nandoctor.report.json_report import Json
from nandoctor.report.junit import JUnit
from nandoctor.report.render import AtomicFile, Output, Stream
from nandoctor.report.terminal import Terminal


def report_outputs(stream: TextIO, config: Config, json_path: Optional[Path] = None,
                   junit_path: Optional[Path] = None,
                   environ: Optional[Mapping[str, str]] = None) -> list[Output]:
    """The terminal report on `stream`, `--json` and `--junit` files, and GitHub's
    annotations (also on `stream`) and step summary when running there.

    Report files are checked now, so an unwritable path fails before the work, not after.
    """
    outputs = [Output(Terminal(report_console(stream), config.run["context_lines"]), Stream(stream))]
    for renderer, path in ((Json(), json_path), (JUnit(), junit_path)):
        if path is not None:
            outputs.append(file_output(renderer, path))
    return outputs + github.outputs(stream, config.ci["max_annotations"], environ)


def json_output(path: Path) -> Output:
    """Only the JSON report, at `path` (a distributed rank's own report)."""
    return file_output(Json(), path)


def file_output(renderer, path: Path) -> Output:
    destination = AtomicFile(Path(path))
    destination.check()
    return Output(renderer, destination)
