"""`nandoctor run [OPTIONS] SCRIPT [ARGS]...` and `nandoctor run [OPTIONS] -m MODULE [ARGS]...`"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from nandoctor.cli import app
from nandoctor.cli.outputs import report_outputs
from nandoctor.config import load_config, resolve_config
from nandoctor.errors import UsageError
from nandoctor.report.render import publish

# Everything after SCRIPT belongs to the script: stop parsing options at the first
# positional, and keep unknown options (`--lr`) for it instead of failing on them.
_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False}


@app.command("run", context_settings=_PASSTHROUGH)
def run_command(
    ctx: typer.Context,
    script: Optional[str] = typer.Argument(None, metavar="SCRIPT", help="The training script, as you would give it to python."),
    module: Optional[str] = typer.Option(None, "-m", "--module", help="Run a module, like `python -m MODULE`."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the report as JSON here (also when nothing is found)."),
    config_path: Optional[str] = typer.Option(
        None, "--config", metavar="PATH|PRESET",
        help="YAML settings merged over the defaults, or a bundled preset by name (ci)."),
    mode: Optional[str] = typer.Option(None, "--mode", help="trace: check every op (default). watch: check at step boundaries."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1, help="Stop cleanly after N optimizer steps."),
    junit_path: Optional[Path] = typer.Option(None, "--junit", help="Also write JUnit XML (one test case for the run)."),
) -> int:
    """Run a training script exactly as python would and stop at the first NaN/Inf.

    Every nandoctor option comes before SCRIPT; everything after it is the script's.
    """
    target, args, as_module = _target(script, module, ctx.args)
    config_file = resolve_config(config_path)
    config = load_config(config_file).with_overrides("run", mode=mode, max_steps=max_steps)
    # Every word of nandoctor's goes to stderr: stdout is the script's, byte for byte.
    outputs = report_outputs(sys.stderr, config, json_path=json_path, junit_path=junit_path)
    from nandoctor import session  # imports torch: only when a script is actually run

    request = session.RunRequest(target, args, as_module, config,
                                 config_path=str(config_file) if config_file else None)
    runner = session.prepare(request)
    report = session.run(request, runner)
    publish(report, outputs)
    return report.exit_code


def _target(script: str | None, module: str | None, extra: list[str]) -> tuple[str, list[str], bool]:
    if module is not None:
        # With -m, what click took for SCRIPT is the module's first argument.
        return module, ([script] if script is not None else []) + list(extra), True
    if script is None:
        raise UsageError("missing SCRIPT (or -m MODULE) to run")
    if script.startswith("-"):  # an option of ours we don't know, given before SCRIPT
        raise UsageError(f"no such option: {script} (see 'nandoctor run --help')")
    return script, list(extra), False
