"""Configuration: YAML over the defaults, and a clear error for anything else."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nandoctor.config import DEFAULTS, PRESETS_DIR, load_config, presets
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
        # a misspelt check would switch that check off without a word
        ("check_data:\n  errors: [nan, nann, inf]\n", "unknown check 'nann' in 'check_data.errors'"),
        ("check_data:\n  workers: -2\n", "'check_data.workers' must be 0 or more, got -2"),
        ("check_data:\n  max_positions: -3\n", "'check_data.max_positions' must be 0 or more"),
        ("check_data:\n  ignore_labels: [-1, void]\n", "'check_data.ignore_labels' must be a list of integers"),
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


def test_a_command_line_override_is_checked_like_the_file():
    with pytest.raises(ConfigError, match="unknown mode 'fast'"):
        load_config().with_overrides("run", mode="fast")


def test_every_mode_the_config_accepts_is_a_run_mode_class():
    from nandoctor.config import CHOICES
    from nandoctor.modes import MODES

    assert set(MODES) == set(CHOICES[("run", "mode")])


def test_the_ci_preset_loads_by_name_and_is_configs_ci_yaml():
    assert "ci" in presets()
    # The repository's configs/ci.yaml is a copy of the shipped preset, kept identical.
    assert (PRESETS_DIR / "ci.yaml").read_text() == (REPO / "configs" / "ci.yaml").read_text()
    by_name, by_path = load_config("ci"), load_config(REPO / "configs" / "ci.yaml")
    assert by_name.as_dict() == by_path.as_dict()
    assert by_name.run["max_steps"] == 20 and "bfloat16" in by_name.run["stop_on_inf_dtypes"]


def test_the_presets_are_package_data():
    text = (REPO / "pyproject.toml").read_text()
    assert '[tool.setuptools.package-data]' in text and '"presets/*.yaml"' in text
    assert PRESETS_DIR == REPO / "nandoctor" / "presets"


def test_an_unknown_preset_name_is_a_config_error_listing_the_presets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"unknown config preset 'cii'.*\(presets: .*ci"):
        load_config("cii")
    # A path-looking value stays a path: its own error, not a preset one.
    with pytest.raises(ConfigError, match="cannot read config ci.yaml"):
        load_config("ci.yaml")


def test_a_directory_given_as_config_is_named_as_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "settings").mkdir()
    with pytest.raises(ConfigError, match="'settings' is a directory, not a YAML file"):
        load_config("settings")


def test_a_bare_name_that_is_a_file_is_still_read_as_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").write_text("run:\n  max_steps: 7\n")
    assert load_config("mine").run["max_steps"] == 7
