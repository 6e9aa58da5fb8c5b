"""`nandoctor run [OPTIONS] SCRIPT [ARGS]...` and `nandoctor run [OPTIONS] -m MODULE [ARGS]...`"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer

from nandoctor.cli import Command, app
from nandoctor.cli import launcher
from nandoctor.cli.outputs import json_output, report_outputs
from nandoctor.config import load_config, resolve_config
from nandoctor.console import note_line
from nandoctor.errors import UsageError
from nandoctor.report.render import publish
from nandoctor.runner import script_path

# Everything after SCRIPT belongs to the script: stop parsing options at the first
# positional, and keep unknown options (`--lr`) for it instead of failing on them.
_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False}


class RunCommand(Command):
    """`run`'s usage line names the script's arguments, which click never sees as a parameter."""

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        return [self.options_metavar or "[OPTIONS]", "SCRIPT [ARGS]..."]


@app.command("run", cls=RunCommand, context_settings=_PASSTHROUGH)
def run_command(
    ctx: typer.Context,
    script: Optional[str] = typer.Argument(
        None, metavar="SCRIPT", show_default=False,
        help="The training script, as you would give it to python; ARGS after it are the script's."),
    module: Optional[str] = typer.Option(
        None, "-m", "--module", metavar="MODULE",
        help="Run a module instead of a script, like `python -m MODULE [ARGS]...`."),
    json_path: Optional[Path] = typer.Option(
        None, "--json", metavar="PATH", help="Write the report as JSON here (also when nothing is found)."),
    config_path: Optional[str] = typer.Option(
        None, "--config", metavar="PATH|PRESET",
        help="YAML settings merged over the defaults, or a bundled preset by name (ci)."),
    mode: Optional[str] = typer.Option(
        None, "--mode", metavar="trace|watch",
        help="trace: check every op (default). watch: check at step boundaries."),
    max_steps: Optional[int] = typer.Option(
        None, "--max-steps", metavar="N", min=1, show_default=False,
        help="Stop cleanly after N optimizer steps."),
    junit_path: Optional[Path] = typer.Option(
        None, "--junit", metavar="PATH", help="Also write JUnit XML (one test case for the run)."),
    nproc_per_node: Optional[int] = typer.Option(
        None, "--nproc-per-node", metavar="N", min=1, show_default=False,
        help="Launch N ranks through torch.distributed.run (torchrun), each watched."),
    nnodes: Optional[str] = typer.Option(
        None, "--nnodes", metavar="N|MIN:MAX", help="With --nproc-per-node: torchrun's --nnodes."),
    node_rank: Optional[int] = typer.Option(
        None, "--node-rank", metavar="N", help="With --nproc-per-node: torchrun's --node-rank."),
    rdzv_endpoint: Optional[str] = typer.Option(
        None, "--rdzv-endpoint", metavar="HOST:PORT", help="With --nproc-per-node: torchrun's --rdzv-endpoint."),
    rdzv_id: Optional[str] = typer.Option(
        None, "--rdzv-id", metavar="ID", help="With --nproc-per-node: torchrun's --rdzv-id."),
    rank_reports: bool = typer.Option(
        False, "--rank-reports", help="Under torch.distributed: also write each rank's report beside --json."),
) -> int:
    """Run a training script exactly as python would and stop at the first NaN/Inf.

    Every nandoctor option comes before SCRIPT; everything after it is the script's.
    """
    started = time.monotonic()
    target, args, as_module = _target(script, module, ctx.args)
    if nproc_per_node is not None:
        # What would stop every rank stops the launch first: one line, not one per rank.
        load_config(resolve_config(config_path))
        if not as_module:
            script_path(target)
        launch = dict(nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank,
                      rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id)
        return launcher.launch(launcher.rank_command(sys.argv[1:]), launch, json_path)
    config_file = resolve_config(config_path)
    config = load_config(config_file).with_overrides("run", mode=mode, max_steps=max_steps)
    # Every word of nandoctor's goes to stderr: stdout is the script's, byte for byte.
    outputs = report_outputs(sys.stderr, config, json_path=json_path, junit_path=junit_path)
    from nandoctor import session  # imports torch: only when a script is actually run

    request = session.RunRequest(target, args, as_module, config,
                                 config_path=str(config_file) if config_file else None)
    runner = session.prepare(request)
    report = session.run(request, runner)
    # The whole run as the user waited for it: start-up, the script, any replay.
    report.duration_s = round(time.monotonic() - started, 3)
    dist = report.distributed
    if dist is not None and not dist.writes_run_report:
        # The culprit (or rank 0) writes the run's report and prints it: once, not N times.
        from nandoctor.diagnose import ranks

        line = ranks.stopped_line(dist, str(json_path) if json_path else None)
        if line is not None:
            note_line(line)
        outputs = []
    if dist is not None and rank_reports and json_path is not None:
        outputs.append(json_output(launcher.rank_path(json_path, dist.rank)))
    publish(report, outputs)
    return report.exit_code


def _target(script: str | None, module: str | None, extra: list[str]) -> tuple[str, list[str], bool]:
    if module is not None:
        # With -m, what click took for SCRIPT is the module's first argument.
        return module, ([script] if script is not None else []) + list(extra), True
    if script is None:
        raise UsageError("Missing argument 'SCRIPT' (or -m MODULE) (see 'nandoctor run --help')")
    if script.startswith("-"):  # an option of ours we don't know, given before SCRIPT
        raise UsageError(f"No such option: {script} (see 'nandoctor run --help')")
    return script, list(extra), False
