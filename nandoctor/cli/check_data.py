"""`nandoctor check-data`: parse the options, scan, render, return the exit status."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from typer.exceptions import TyperException

from nandoctor.cli import Command, app
from nandoctor.cli.outputs import report_outputs
from nandoctor.config import load_config
from nandoctor.errors import ExitCode, UsageError
from nandoctor.report.render import publish


class _CheckDataCommand(Command):
    """Without a PATH: a short usage error, not the whole help and not click's bare line."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except TyperException as exc:  # typer's own copy of click's MissingParameter
            param = getattr(exc, "param", None)
            if type(exc).__name__ != "MissingParameter" or getattr(param, "name", None) != "paths":
                raise
            raise UsageError(f"check-data needs a PATH: a data file, a folder, or FILE.py:NAME\n"
                             f"{ctx.get_usage()}\n"
                             f"Try '{ctx.command_path} --help' for help.") from None


@app.command("check-data", cls=_CheckDataCommand)
def check_data(
    paths: List[str] = typer.Argument(
        ..., metavar="PATH",
        help="Data files or folders (searched recursively), or a Python dataset as FILE.py:NAME "
             "or package.module:NAME."),
    json_path: Optional[Path] = typer.Option(
        None, "--json", metavar="PATH", help="Also write the report as JSON (schema nandoctor.data/1)."),
    config_path: Optional[str] = typer.Option(
        None, "--config", metavar="PATH|PRESET",
        help="YAML config merged over the defaults (section check_data), or a bundled preset by name (ci)."),
    num_classes: Optional[int] = typer.Option(
        None, "--num-classes", metavar="N", help="Integer label arrays must lie in [0, N), but for check_data.ignore_labels (default -100). "
             "Without it, labels are not checked."),
    workers: Optional[int] = typer.Option(
        None, "--workers", metavar="N", help="Files checked in parallel (0: one per core)."),
    junit_path: Optional[Path] = typer.Option(
        None, "--junit", metavar="PATH", help="Also write JUnit XML: a test case per file with problems."),
    allow_empty: bool = typer.Option(
        False, "--allow-empty",
        help="Accept a PATH with no data file in it (an empty folder) and exit 0; by default it is a "
             "usage error (exit 2), so a dataset that was never fetched fails CI."),
) -> int:
    """Check data files for NaN, Inf, constant arrays, empty or unreadable files.

    Formats: .npy .npz .pt .pth .safetensors .csv .tsv .parquet .feather .arrow, images
    (.png .jpg .jpeg .bmp .tif .tiff .webp), .h5 .hdf5, .jsonl .ndjson and .json. Exit status 3 when a problem
    listed under check_data.errors in the config is found, else 0; 2 for a PATH that does
    not exist or has no data file in it.
    """
    # Imported here so `nandoctor run` never pays for the data readers.
    from nandoctor.datacheck import CheckOptions, scan
    from nandoctor.datacheck.scan import NothingToCheck

    if num_classes is not None and num_classes < 1:
        raise UsageError(f"--num-classes must be at least 1, got {num_classes}")
    if workers is not None and workers < 0:
        raise UsageError(f"--workers must be 0 or more, got {workers}")
    config = load_config(config_path).with_overrides("check_data", workers=workers)
    # Every word of nandoctor's on stderr, as for `run`: a Python dataset (FILE.py:NAME) is
    # the user's code and owns stdout, and stdout stays free for what a pipeline reads.
    outputs = report_outputs(sys.stderr, config, json_path=json_path, junit_path=junit_path)
    settings = config.check_data
    options = CheckOptions(max_positions=settings["max_positions"], num_classes=num_classes,
                           ignore_labels=tuple(settings["ignore_labels"]))
    try:
        report = scan(paths, errors=settings["errors"], warnings=settings["warnings"], options=options,
                      workers=settings["workers"], allow_empty=allow_empty)
    except NothingToCheck as exc:
        raise UsageError(f"{exc}; pass --allow-empty if that is expected") from None
    publish(report, outputs)
    return int(ExitCode.FOUND if report.errors else ExitCode.CLEAN)
