"""Configuration: a YAML file merged over the defaults into one frozen object.

The defaults below are the single source; `configs/default.yaml` is the same text for users
to copy (a test keeps the two equal). A user file only lists what it changes. Unknown keys
and values of the wrong type are errors, so a typo never silently does nothing.

`--config` also takes the name of a preset shipped inside the package (`--config ci`, from
`nandoctor/presets/ci.yaml`), so a CI recipe works in any repository.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import yaml

from nandoctor.errors import ConfigError

DEFAULTS: dict[str, Any] = {
    "run": {
        # trace: check every op; watch: check at step boundaries, re-run the bad step under trace.
        "mode": "trace",
        # dtypes in which an Inf is an overflow: it stops the run where an op absorbs it into
        # finite values unhandled (sigmoid, relu), rooted where it overflowed; a clamp,
        # `where`, `nan_to_num` or `isinf` test handles it (elsewhere NaN and Inf are suspects
        # until they reach the loss, a gradient, a parameter, optimizer state or a value the
        # script reads back).
        "stop_on_inf_dtypes": ["float16"],
        # true: an overflow in those dtypes stops the run where it is made, handled or not.
        "strict_overflow": False,
        # check batches as they come out of a DataLoader.
        "check_batches": True,
        # check every op inside optimizer.step() (slower); by default the step is checked
        # once at its end, and a failure there is localised by a replay that does this.
        "check_optimizer_ops": False,
        # trace mode on a GPU (or other accelerator): "auto" keeps each op's finiteness flag
        # on the device and reads them at step boundaries (no sync per op; a finding is
        # localised by a seeded replay); "never" reads every check at once (a sync per op);
        # "always" uses flags on CPU too.
        "device_flags": "auto",
        # watch mode: also read every gradient's norm at each step (one pass over them, ~2%
        # of a small model's step), so that a non-finite gradient under a finite loss stops
        # the run before its update. By default it shows in the next step's loss (the
        # replay finds the same op); under torch.distributed the gradients are always read.
        "watch_gradients": False,
        # stop after this many optimizer steps (0: never), making any script a smoke test.
        "max_steps": 0,
        # steps of loss / gradient-norm history kept for the exploding-gradient rule.
        "history": 64,
        # lines of source shown around the culprit line in the terminal report.
        "context_lines": 2,
        # non-finite values accepted on purpose: "file:line" (train.py:27) or an op pattern
        # (aten.log.*); like a `# nandoctor: allow` comment on the line. Reported, never a stop.
        "allow": [],
    },
    "check_data": {
        # which checks fail the command (exit 3), which are printed as warnings; a check in
        # neither list is not reported at all.
        "errors": ["nan", "inf", "empty", "unreadable", "label_range", "non_numeric"],
        "warnings": ["constant", "fp16_range", "not_checked"],
        # positions listed per problem.
        "max_positions": 5,
        # with --num-classes: label values that mean "ignore this target", not a class
        # (cross_entropy's default ignore_index; add -1 or 255 if your loss uses those).
        "ignore_labels": [-100],
        # files checked in parallel (0: one per core).
        "workers": 0,
    },
    "ci": {
        # GitHub annotations printed at most (one per problem file for check-data).
        "max_annotations": 10,
    },
}


# The checks `check_data.errors` and `check_data.warnings` may name.
DATA_CHECKS = ("nan", "inf", "constant", "fp16_range", "empty", "unreadable", "label_range", "non_numeric",
               "not_checked")
# Counts that cannot be negative.
NON_NEGATIVE = (("run", "history"), ("run", "context_lines"), ("run", "max_steps"),
                ("check_data", "max_positions"), ("check_data", "workers"), ("ci", "max_annotations"))

# Settings whose value is one of a few words (checked for files and command-line options alike).
CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("run", "mode"): ("trace", "watch"),
    ("run", "device_flags"): ("auto", "always", "never"),
}


def _frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


@dataclass(frozen=True)
class Config:
    """The merged configuration; sections are read-only mappings (`config.run["mode"]`)."""

    run: Mapping[str, Any]
    check_data: Mapping[str, Any]
    ci: Mapping[str, Any]
    source: str = "defaults"

    def with_overrides(self, section: str, **values: Any) -> "Config":
        """A copy with some keys of one section replaced (used for command-line options)."""
        merged = {k: dict(v) for k, v in self.as_dict().items()}
        merged[section].update({k: v for k, v in values.items() if v is not None})
        return _build(merged, self.source)

    def as_dict(self) -> dict[str, Any]:
        def thaw(v: Any) -> Any:
            if isinstance(v, Mapping):
                return {k: thaw(x) for k, x in v.items()}
            if isinstance(v, tuple):
                return [thaw(x) for x in v]
            return v

        return {"run": thaw(self.run), "check_data": thaw(self.check_data), "ci": thaw(self.ci)}


def _merge(base: dict[str, Any], override: Mapping[str, Any], where: str) -> None:
    for key, value in override.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in base:
            raise ConfigError(f"unknown setting '{path}' (known: {', '.join(sorted(base))})")
        default = base[key]
        if isinstance(default, dict):
            if not isinstance(value, Mapping):
                raise ConfigError(f"'{path}' must be a mapping")
            _merge(default, value, path)
        elif isinstance(default, bool) != isinstance(value, bool) or not isinstance(value, type(default)):
            raise ConfigError(f"'{path}' must be {type(default).__name__}, got {value!r}")
        else:
            base[key] = value


def _build(merged: dict[str, Any], source: str) -> Config:
    if not all(isinstance(entry, str) for entry in merged["run"]["allow"]):
        raise ConfigError("'run.allow' must be a list of \"file:line\" or op patterns (strings)")
    for key in ("errors", "warnings"):
        unknown = [c for c in merged["check_data"][key] if c not in DATA_CHECKS]
        if unknown:  # a misspelt check would silently switch that check off
            raise ConfigError(f"unknown check {unknown[0]!r} in 'check_data.{key}' (checks: {', '.join(DATA_CHECKS)})")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in merged["check_data"]["ignore_labels"]):
        raise ConfigError("'check_data.ignore_labels' must be a list of integers")
    for section, key in NON_NEGATIVE:
        if merged[section][key] < 0:
            raise ConfigError(f"'{section}.{key}' must be 0 or more, got {merged[section][key]}")
    for (section, key), allowed in CHOICES.items():
        value = merged[section][key]
        if value not in allowed:
            noun = "mode" if key == "mode" else f"value for '{section}.{key}'"
            raise ConfigError(f"unknown {noun} {value!r} (choose from {', '.join(allowed)})")
    return Config(source=source, **{k: _frozen(v) for k, v in merged.items()})


PRESETS_DIR = Path(__file__).resolve().parent / "presets"
_YAML_SUFFIXES = (".yaml", ".yml")


def presets() -> list[str]:
    """The names of the presets shipped with nandoctor (`--config NAME`)."""
    try:
        return sorted(p.stem for p in PRESETS_DIR.iterdir() if p.suffix == ".yaml" and p.is_file())
    except OSError:
        return []


def _is_preset_name(value: str) -> bool:
    """A bare word: no path separator and no YAML suffix."""
    separators = [s for s in ("/", os.sep, os.altsep) if s]
    return bool(value) and not any(s in value for s in separators) \
        and not value.lower().endswith(_YAML_SUFFIXES)


def resolve_config(value: str | Path | None) -> Path | None:
    """The file `--config VALUE` names: a bundled preset for a bare name such as `ci`, else
    the path as given. A bare name that is neither a preset nor a file is a ConfigError."""
    if value is None:
        return None
    text = str(value)
    if _is_preset_name(text):
        if text in presets():
            return PRESETS_DIR / f"{text}.yaml"
        if Path(text).is_dir():
            raise ConfigError(f"--config '{text}' is a directory, not a YAML file")
        if not Path(text).is_file():
            known = ", ".join(presets()) or "none"
            raise ConfigError(f"unknown config preset '{text}' and no such file (presets: {known})")
    return Path(value)


def load_config(path: str | Path | None = None) -> Config:
    """The defaults, with the YAML file at `path` (or the preset it names) merged over them."""
    merged = copy.deepcopy(DEFAULTS)
    if path is None:
        return _build(merged, "defaults")
    path = resolve_config(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"config {path} is not valid YAML{at}: {getattr(exc, 'problem', exc)}") from None
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, Mapping):
        raise ConfigError(f"config {path} must be a mapping of sections (run, check_data, ci)")
    _merge(merged, loaded, "")
    return _build(merged, str(path))
