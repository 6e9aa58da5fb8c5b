"""Configuration: YAML over the defaults, and a clear error for anything else."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nandoctor.config import DEFAULTS, load_config
from nandoctor.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def test_configs_default_yaml_is_exactly_the_built_in_defaults():
    assert yaml.safe_load((REPO / "configs" / "default.yaml").read_text()) == DEFAULTS


def test_a_user_file_changes_only_what_it_lists(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("run:\n  max_steps: 5\n")
    config = load_config(path)
    assert config.run["max_steps"] == 5
    assert config.run["mode"] == DEFAULTS["run"]["mode"]
    assert config.check_data["errors"] == tuple(DEFAULTS["check_data"]["errors"])


def test_the_config_is_frozen():
    with pytest.raises(TypeError):
        load_config().run["mode"] = "watch"


@pytest.mark.parametrize(
    "text, message",
    [
        ("run:\n  mdoe: watch\n", "unknown setting 'run.mdoe'"),
        ("run:\n  max_steps: ten\n", "'run.max_steps' must be int"),
        ("run:\n  check_batches: 1\n", "'run.check_batches' must be bool"),
        ("- run\n", "must be a mapping of sections"),
        ("run: [\n", "not valid YAML"),
    ],
)
def test_a_broken_config_is_a_config_error_naming_the_problem(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config(path)


@pytest.mark.parametrize("text, message", [
    ("run:\n  mode: fast\n", "unknown mode 'fast' (choose from trace, watch)"),
    ("run:\n  device_flags: sometimes\n", "unknown value for 'run.device_flags' 'sometimes'"),
])
def test_a_setting_with_fixed_choices_rejects_any_other_word(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(path)
    with pytest.raises(ConfigError, match="unknown mode"):
        load_config().with_overrides("run", mode="fast")


def test_every_mode_the_config_accepts_is_a_run_mode_class():
    from nandoctor.config import CHOICES
    from nandoctor.modes import MODES

    assert set(MODES) == set(CHOICES[("run", "mode")])
