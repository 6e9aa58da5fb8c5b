"""Seeded replay: run the script again, from the start, under the per-op detector.

Watch mode only knows *that* the loss or a gradient went non-finite at step N; trace mode
on an accelerator knows the op from its device flag but not its values, and checks
`optimizer.step()` only at its end. As JAX's `jax_debug_nans` and Megatron's rerun
machinery do, nandoctor then re-runs — here the whole script from the start, in a fresh
process, with the random number generators in the state the first run started from —
under `--mode trace` with every op checked at once, stopping after step N+1 at the latest.
The replay's report has the op, the line and the cause. If the failure does not come
back, that is itself the finding (`"reproduced": false`, cause `nonreproducible`).

The replay process is `python -m nandoctor run --mode trace --max-steps N+1 --json F ...`.
Its standard input is the first run's where that can be read again: a regular file
(`< input.txt`) is opened anew at the offset the first run started from. A pipe or a
terminal cannot be read twice: the replay's input is then empty, and a replay that dies of
it says so (`StdinStart.lost`). It runs with two environment variables:

- `NANDOCTOR_REPLAY=1`, which the script may read to skip side effects: the replay runs
  the user's code again, so files the script writes (checkpoints, logs) are written again
  up to step N+1; its output is discarded.
- `NANDOCTOR_REPLAY_STATE=<path>`: a JSON file (schema `nandoctor.replay/1`, below) with
  the generators' states. nandoctor reads it and removes the variable from the
  environment before the script starts.

    {"schema": "nandoctor.replay/1",
     "rng": {"python": [version, [ints...], gauss | null],
             "numpy": ["MT19937", [624 ints], pos, has_gauss, cached_gaussian],
             "torch_cpu": "<base64 of torch.get_rng_state()>",
             "torch_cuda": ["<base64 per device>", ...] | null}}
"""
from __future__ import annotations

import base64
import json
import os
import random
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from nandoctor.errors import ExitCode, UsageError
from nandoctor.report.model import RunReport

REPLAY_ENV = "NANDOCTOR_REPLAY"
STATE_ENV = "NANDOCTOR_REPLAY_STATE"
SCHEMA = "nandoctor.replay/1"


@dataclass
class RngState:
    """The global random generators' states (python, numpy, torch CPU and CUDA)."""

    python: Any
    numpy: Any
    torch_cpu: Any
    torch_cuda: Any

    @classmethod
    def capture(cls) -> "RngState":
        import numpy as np
        import torch

        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        return cls(random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda)

    def restore(self) -> None:
        import numpy as np
        import torch

        random.setstate(self.python)
        np.random.set_state(self.numpy)
        torch.set_rng_state(self.torch_cpu)
        if self.torch_cuda is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(self.torch_cuda)

    def to_json(self) -> dict[str, Any]:
        version, ints, gauss = self.python
        name, keys, pos, has_gauss, cached = self.numpy
        return {
            "python": [version, list(ints), gauss],
            "numpy": [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
            "torch_cpu": _b64(self.torch_cpu),
            "torch_cuda": [_b64(s) for s in self.torch_cuda] if self.torch_cuda is not None else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RngState":
        import numpy as np

        version, ints, gauss = data["python"]
        name, keys, pos, has_gauss, cached = data["numpy"]
        cuda = data.get("torch_cuda")
        return cls((version, tuple(ints), gauss), (name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached),
                   _unb64(data["torch_cpu"]), [_unb64(s) for s in cuda] if cuda is not None else None)


def _b64(state) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _unb64(text: str):
    import torch

    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def save_state(rng: RngState, path: Path) -> None:
    path.write_text(json.dumps({"schema": SCHEMA, "rng": rng.to_json()}))


def take_state_from_environment() -> RngState | None:
    """In a replay process: the state its parent saved (the variable is then removed, so the
    script's own subprocesses never see it). None in a normal run."""
    path = os.environ.pop(STATE_ENV, None)
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text())
        if data.get("schema") != SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r}, expected {SCHEMA}")
        return RngState.from_json(data["rng"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"cannot read the replay state {path}: {exc}") from None


@dataclass
class StdinStart:
    """The script's standard input as the first run began. A regular file is opened again
    (on Linux, through /proc: a new open file with its own offset, so the script's reads are
    not moved) and the replay reads it from the same offset; anything else cannot be read
    again."""

    kind: str  # "file" | "pipe" | "terminal" | "empty" (closed, /dev/null or another device)
    again: IO[bytes] | None = None  # the file, opened anew; None when it cannot be
    offset: int = 0

    @classmethod
    def capture(cls) -> "StdinStart":
        try:
            info = os.fstat(0)
        except OSError:  # stdin closed
            return cls("empty")
        if stat.S_ISREG(info.st_mode):
            try:
                return cls("file", open("/proc/self/fd/0", "rb"), os.lseek(0, 0, os.SEEK_CUR))
            except OSError:  # (no /proc: the file cannot be opened again)
                return cls("file")
        if stat.S_ISCHR(info.st_mode):
            return cls("terminal" if os.isatty(0) else "empty")
        return cls("pipe")

    @property
    def lost(self) -> bool:
        """Did the first run have an input the replay cannot be given?"""
        return self.kind != "empty" and self.again is None

    def for_replay(self) -> IO[bytes] | int:
        """The replay's stdin: the file again, from where the first run began; else nothing."""
        if self.again is None:
            return subprocess.DEVNULL
        self.again.seek(self.offset)
        return self.again


@dataclass
class ReplayOutcome:
    report: RunReport | None  # the replay's report; None when it wrote none
    stderr: str
    interrupted: bool = False  # Ctrl-C while it ran: what the first run found still stands


def replay(target: str, args: list[str], as_module: bool, config_path: str | None, rng: RngState,
           steps: int, environ: dict[str, str] | None = None, timeout_s: float | None = None,
           stdin: StdinStart | None = None) -> ReplayOutcome:
    """Run the script again under trace, seeded with `rng`, for at most `steps` optimizer
    steps; in `environ` (a distributed rank's fresh rendezvous) and within `timeout_s`,
    reading `stdin` again where it can be."""
    with tempfile.TemporaryDirectory(prefix="nandoctor-replay-") as tmp:
        state_file, report_file = Path(tmp) / "state.json", Path(tmp) / "replay.json"
        save_state(rng, state_file)
        command = [sys.executable, "-m", "nandoctor", "run", "--mode", "trace", "--max-steps", str(steps),
                   "--json", str(report_file)]
        if config_path:
            command += ["--config", str(config_path)]
        command += (["-m", target] if as_module else [target]) + list(args)
        env = dict(environ if environ is not None else os.environ, **{REPLAY_ENV: "1", STATE_ENV: str(state_file)})
        try:
            proc = subprocess.run(command, stdin=stdin.for_replay() if stdin else subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, env=env, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            return ReplayOutcome(_read(report_file), f"the replay did not finish within {timeout_s:g} s\n"
                                 + (exc.stderr or "" if isinstance(exc.stderr, str) else ""))
        except KeyboardInterrupt:  # (subprocess.run has killed the replay and waited for it)
            return ReplayOutcome(None, "", interrupted=True)
        replayed = _read(report_file)
    if proc.returncode == ExitCode.INTERRUPTED:
        return ReplayOutcome(None, proc.stderr, interrupted=True)
    return ReplayOutcome(replayed, proc.stderr)


def _read(path: Path) -> RunReport | None:
    try:
        return RunReport.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError):
        return None
