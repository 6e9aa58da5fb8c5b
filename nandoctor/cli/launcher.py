"""`nandoctor run --nproc-per-node N`: launch the ranks through torch.distributed.run.

No launcher of our own: torchrun (run by quiet_torchrun, which keeps its traceback off a
finding) starts N processes, each `python -m nandoctor run` with
the same options (minus the launch ones), and each is watched (see distributed.py). The
launch exits with the run report's status: 3 when any rank found a non-finite value,
whatever torchrun itself makes of ranks that exited non-zero.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

# Launch options (taken here, not passed to the ranks) and run options that take a value.
_LAUNCH_OPTIONS = {"--nproc-per-node", "--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-id"}
_VALUE_OPTIONS = _LAUNCH_OPTIONS | {"-m", "--module", "--json", "--config", "--mode", "--max-steps", "--junit"}


def rank_command(argv: list[str]) -> list[str]:
    """Each rank's `nandoctor` arguments: `argv` (`run`, options, SCRIPT, ARGS) without the
    launch options, which only come before SCRIPT; the script's own arguments stay as they are."""
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        name = token.split("=", 1)[0]
        if i > 0 and not token.startswith("-"):  # SCRIPT: the rest is the script's
            return out + argv[i:]
        takes_value = name in _VALUE_OPTIONS and "=" not in token
        if name in _LAUNCH_OPTIONS:
            i += 2 if takes_value else 1
            continue
        out += argv[i:i + 2] if takes_value else [token]
        i += 2 if takes_value else 1
        if name in ("-m", "--module"):  # MODULE is the target: the rest is the script's
            return out + argv[i:]
    return out


def launch(rank_argv: list[str], options: dict, json_path: Path | None) -> int:
    torchrun = [sys.executable, "-m", "nandoctor.cli.quiet_torchrun", "--nproc-per-node", str(options["nproc_per_node"])]
    for name in ("nnodes", "node_rank", "rdzv_endpoint", "rdzv_id"):
        if options.get(name) is not None:
            torchrun += [f"--{name.replace('_', '-')}", str(options[name])]
    with tempfile.TemporaryDirectory(prefix="nandoctor-launch-") as tmp:
        report_path = json_path or Path(tmp) / "run.json"
        if json_path is None:  # the launch's status is the run report's
            rank_argv = [rank_argv[0], "--json", str(report_path), *rank_argv[1:]]
        try:
            proc = subprocess.run([*torchrun, "-m", "nandoctor", *rank_argv], stdin=subprocess.DEVNULL)
        except KeyboardInterrupt:
            return 130
        report = _read(report_path)
    if report is None:
        return proc.returncode
    return int(report.get("exit_code", proc.returncode))


def rank_path(json_path: Path, rank: int) -> Path:
    """Where rank N's own report goes beside the run's: `r.json` -> `r.rank1.json`."""
    path = Path(json_path)
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def _read(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
