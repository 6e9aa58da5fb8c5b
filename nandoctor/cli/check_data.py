"""`nandoctor check-data`: parse the options, scan, render, return the exit status."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from nandoctor.cli import app
from nandoctor.config import load_config
from nandoctor.console import stdout_console
from nandoctor.errors import ExitCode, UsageError


@app.command("check-data", no_args_is_help=True)
def check_data(
    paths: List[str] = typer.Argument(
        ..., metavar="PATH",
        help="Data files or folders (searched recursively), or a Python dataset as FILE.py:NAME "
             "or package.module:NAME."),
    json_path: Optional[Path] = typer.Option(
        None, "--json", metavar="PATH", help="Also write the report as JSON (schema nandoctor.data/1)."),
    config_path: Optional[Path] = typer.Option(
        None, "--config", metavar="PATH", help="YAML config merged over the defaults (section check_data)."),
    num_classes: Optional[int] = typer.Option(
        None, "--num-classes", metavar="N", help="Integer label arrays must lie in [0, N)."),
    workers: Optional[int] = typer.Option(
        None, "--workers", metavar="N", help="Files checked in parallel (0: one per core)."),
    junit_path: Optional[Path] = typer.Option(
        None, "--junit", metavar="PATH", help="Also write JUnit XML: a test case per file with problems."),
) -> int:
    """Check data files for NaN, Inf, constant arrays, empty or unreadable files.

    Formats: .npy .npz .pt .pth .safetensors .csv .tsv .parquet .feather .arrow, images
    (.png .jpg .jpeg .bmp .tif .tiff .webp) and .h5 .hdf5. Exit status 3 when a problem
    listed under check_data.errors in the config is found, else 0.
    """
    # Imported here so `nandoctor run` never pays for the data readers.
    from nandoctor.datacheck import CheckOptions, scan
    from nandoctor.report.data_json import write_json
    from nandoctor.report.data_terminal import render

    if num_classes is not None and num_classes < 1:
        raise UsageError(f"--num-classes must be at least 1, got {num_classes}")
    if workers is not None and workers < 0:
        raise UsageError(f"--workers must be 0 or more, got {workers}")
    config = load_config(config_path).with_overrides("check_data", workers=workers)
    settings = config.check_data
    options = CheckOptions(max_positions=settings["max_positions"], num_classes=num_classes)
    report = scan(paths, errors=settings["errors"], warnings=settings["warnings"], options=options,
                  workers=settings["workers"])
    render(report, stdout_console())
    if json_path is not None:
        write_json(report, str(json_path))
    _ci_outputs(report.to_dict(), junit_path, config.ci["max_annotations"])
    return int(ExitCode.FOUND if report.errors else ExitCode.CLEAN)


def _ci_outputs(data: dict, junit_path: Optional[Path], max_annotations: int) -> None:
    """JUnit XML when asked for; GitHub annotations and step summary when running there."""
    from nandoctor.report import github, junit

    if junit_path is not None:
        junit.write_text(junit_path, junit.data_junit(data))
    github.emit_github(github.data_annotations(data, limit=max_annotations), github.data_summary_markdown(data))
