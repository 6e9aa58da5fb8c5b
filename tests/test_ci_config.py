"""configs/ci.yaml: the settings the CI smoke-test recipe relies on, valid against the schema."""
from pathlib import Path

from nandoctor.config import load_config

CI_YAML = Path(__file__).resolve().parent.parent / "configs" / "ci.yaml"


def test_ci_config_is_a_short_strict_run():
    run = load_config(CI_YAML).run

    assert run["max_steps"] == 20
    assert set(run["stop_on_inf_dtypes"]) == {"float16", "bfloat16"}


def test_ci_config_fails_the_job_on_every_data_check():
    check_data = load_config(CI_YAML).check_data

    assert {"nan", "inf", "empty", "unreadable", "constant", "fp16_range"} <= set(check_data["errors"])
    assert not set(check_data["errors"]) & set(check_data["warnings"])
