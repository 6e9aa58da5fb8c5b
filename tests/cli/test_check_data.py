"""`python -m nandoctor check-data ...` end to end: exit statuses, output, the JSON report."""
import json
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import run_python

ROOT = Path(__file__).resolve().parents[2]
BLACK_MASK = ROOT.parent / "shared" / "cases" / "black_mask_dataset" / "train.py"


def nandoctor(*args, cwd):
    """`python -m nandoctor check-data ARGS`, forked from the test process's server (see
    helpers.run_python, whose nandoctor is this checkout's, as PYTHONPATH makes it here)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "COLUMNS")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return run_python(["-m", "nandoctor", "check-data", *map(str, args)], cwd, env=env, timeout=300)


def test_clean_folder_exits_0_and_writes_a_clean_report(tmp_path):
    (tmp_path / "data").mkdir()
    np.save(tmp_path / "data" / "x.npy", np.arange(10.0))
    result = nandoctor("data", "--json", "report.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report == {**report, "schema": "nandoctor.data/1", "status": "clean", "files_scanned": 1, "problems": []}
    assert "1 file checked, no problems" in result.stderr and result.stdout == ""


def test_nan_in_a_file_exits_3_and_the_report_names_file_key_and_check(tmp_path):
    (tmp_path / "data").mkdir()
    a = np.ones((4, 4))
    a[2, 3] = np.nan
    np.savez(tmp_path / "data" / "train.npz", x=a, y=np.arange(4))
    np.save(tmp_path / "data" / "ok.npy", np.arange(3.0))
    result = nandoctor("data", "--json", "r.json", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "problems" and report["files_scanned"] == 2
    (problem,) = report["problems"]
    assert problem["file"] == os.path.join("data", "train.npz")
    assert (problem["key"], problem["check"], problem["count"]) == ("x", "nan", 1)
    assert problem["positions"] == [[2, 3]] and isinstance(problem["detail"], str)
    assert "train.npz" in result.stderr and "1 problem in 1 file" in result.stderr


def test_output_has_no_colour_codes_when_not_a_terminal(tmp_path):
    np.save(tmp_path / "bad.npy", np.array([np.nan, 1.0]))
    result = nandoctor("bad.npy", cwd=tmp_path)
    assert "\x1b[" not in result.stderr and result.stdout == ""


def test_warnings_alone_exit_0_but_are_printed(tmp_path):
    np.save(tmp_path / "flat.npy", np.zeros((4, 4)))
    result = nandoctor("flat.npy", cwd=tmp_path)
    assert result.returncode == 0 and "constant" in result.stderr


def test_config_can_turn_a_check_into_a_warning(tmp_path):
    np.save(tmp_path / "bad.npy", np.array([np.nan, 1.0]))
    (tmp_path / "cfg.yaml").write_text("check_data:\n  errors: [inf]\n  warnings: [nan]\n")
    assert nandoctor("bad.npy", "--config", "cfg.yaml", cwd=tmp_path).returncode == 0


def test_label_range_with_num_classes_exits_3(tmp_path):
    np.save(tmp_path / "labels.npy", np.array([0, 1, 2, 3]))
    assert nandoctor("labels.npy", "--num-classes", "4", cwd=tmp_path).returncode == 0
    result = nandoctor("labels.npy", "--num-classes", "3", "--workers", "1", cwd=tmp_path)
    assert result.returncode == 3 and "label_range" in result.stderr


def test_missing_path_exits_2_with_one_line_and_no_traceback(tmp_path):
    result = nandoctor("nope.npy", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "nope.npy" in result.stderr
    assert "Traceback" not in result.stderr


def test_empty_folder_exits_2_with_one_line_naming_it_and_the_way_out(tmp_path):
    (tmp_path / "data").mkdir()
    result = nandoctor("data", "--json", "r.json", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == ("nandoctor: nothing to check in data: the folder has no files; "
                             "pass --allow-empty if that is expected\n")
    assert result.stdout == "" and not (tmp_path / "r.json").exists()


def test_allow_empty_accepts_an_empty_folder_and_reports_zero_files(tmp_path):
    (tmp_path / "data").mkdir()
    result = nandoctor("data", "--allow-empty", "--json", "r.json", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, "")
    assert "0 files checked, no problems" in result.stderr
    assert json.loads((tmp_path / "r.json").read_text())["files_scanned"] == 0


@pytest.mark.parametrize("args", [(), ("--json", "r.json")])
def test_no_path_is_a_short_usage_error_not_the_whole_help(tmp_path, args):
    result = nandoctor(*args, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "nandoctor: check-data needs a PATH: a data file, a folder, or FILE.py:NAME",
        "Usage: nandoctor check-data [OPTIONS] PATH...",
        "Try 'nandoctor check-data --help' for help.",
    ]


def test_git_lfs_pointer_exits_3_and_says_to_pull(tmp_path):
    (tmp_path / "train.npz").write_text("version https://git-lfs.github.com/spec/v1\n"
                                        "oid sha256:" + "0" * 64 + "\nsize 2048\n")
    result = nandoctor("train.npz", "--json", "r.json", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    (problem,) = json.loads((tmp_path / "r.json").read_text())["problems"]
    assert problem["detail"] == "a Git LFS pointer, not the data (the real file is 2,048 bytes): run `git lfs pull`"


def test_checkpoints_torch_warns_about_leave_only_the_report_on_stderr(tmp_path):
    pytest.importorskip("torch")
    maker = (
        "import warnings, numpy as np, torch\n"
        "warnings.simplefilter('ignore')\n"
        "torch.save({'x': np.arange(3.0)}, 'arrays.pt')\n"
        "torch.save({'q': torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)}, 'quantized.pt')\n"
        "torch.save({'c': torch.ones(3, dtype=torch.complex32)}, 'half_complex.pt')\n"
        "torch.save({'n': torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])}, 'nested.pt')\n"
    )
    made = run_python(["-c", maker], tmp_path)
    assert made.returncode == 0, made.stderr
    result = nandoctor(".", "--workers", "2", cwd=tmp_path)
    assert "UserWarning" not in result.stderr
    assert "Warning" not in result.stderr and "warnings.warn" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith("4 files checked")


def test_unreadable_config_exits_2(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(3.0))
    (tmp_path / "cfg.yaml").write_text("check_data:\n  errorz: []\n")
    result = nandoctor("x.npy", "--config", "cfg.yaml", cwd=tmp_path)
    assert result.returncode == 2 and "errorz" in result.stderr


def test_malicious_checkpoint_exits_3_without_running_its_code(tmp_path):
    pytest.importorskip("torch")
    maker = (
        "import torch\n"
        "class Evil:\n"
        "    def __reduce__(self):\n"
        "        return (open, ('pwned', 'w'))\n"
        "torch.save({'model': Evil()}, 'evil.pt')\n"
    )
    made = run_python(["-c", maker], tmp_path)
    assert made.returncode == 0, made.stderr
    result = nandoctor("evil.pt", "--json", "r.json", cwd=tmp_path)
    assert result.returncode == 3
    assert json.loads((tmp_path / "r.json").read_text())["problems"][0]["check"] == "unreadable"
    assert not (tmp_path / "pwned").exists()


@pytest.mark.skipif(not BLACK_MASK.exists(), reason="shared cases not present")
def test_dataset_target_finds_the_black_mask_without_training(tmp_path):
    # The case trains at import time; put its training loop under a __main__ guard, as a
    # real script would have it, and check that check-data never runs it.
    head, loop = BLACK_MASK.read_text().split("\nmodel = ", 1)
    guarded = head + '\nif __name__ == "__main__":\n' + textwrap.indent("model = " + loop, "    ")
    (tmp_path / "train.py").write_text(guarded)
    result = nandoctor("train.py:MaskDataset", "--json", "r.json", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert "epoch" not in result.stdout  # the training loop did not run
    (problem,) = json.loads((tmp_path / "r.json").read_text())["problems"]
    assert (problem["file"], problem["key"], problem["check"]) == ("train.py:MaskDataset", "[1]", "nan")
    assert problem["positions"][0][0] == 11


def test_import_error_in_dataset_file_exits_2_with_one_line(tmp_path):
    (tmp_path / "train.py").write_text("import missing_dependency_xyz\n")
    result = nandoctor("train.py:dataset", cwd=tmp_path)
    assert result.returncode == 2 and "missing_dependency_xyz" in result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_an_unwritable_json_path_exits_2_with_one_line_before_scanning(tmp_path):
    np.save(tmp_path / "bad.npy", np.array([np.nan, 1.0]))
    result = nandoctor("bad.npy", "--json", "no/such/dir/r.json", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "nandoctor: cannot write report to no/such/dir/r.json: folder no/such/dir does not exist"
    assert result.stdout == ""  # it failed before the scan, not after


def test_a_json_path_that_is_a_folder_exits_2_before_scanning(tmp_path):
    np.save(tmp_path / "bad.npy", np.array([np.nan, 1.0]))
    (tmp_path / "out").mkdir()
    result = nandoctor("bad.npy", "--json", "out", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.strip() == "nandoctor: cannot write report to out: it is a folder"


def test_a_python_datasets_prints_stay_on_stdout_apart_from_the_report(tmp_path):
    (tmp_path / "data.py").write_text(
        "import torch\nprint('building the dataset')\n"
        "dataset = torch.utils.data.TensorDataset(torch.tensor([[1.0], [float('nan')]]))\n")
    result = nandoctor("data.py:dataset", cwd=tmp_path)
    assert result.returncode == 3 and result.stdout == "building the dataset\n"
    assert "nan" in result.stderr and "building" not in result.stderr


def test_github_annotations_are_capped_by_the_config(tmp_path):
    for i in range(4):
        np.save(tmp_path / f"bad{i}.npy", np.array([np.nan, 1.0]))
    (tmp_path / "cfg.yaml").write_text("ci:\n  max_annotations: 2\n")
    env_result = run_python(
        ["-m", "nandoctor", "check-data", "--config", "cfg.yaml", "."], tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": "summary.md"},
        timeout=300)
    assert env_result.returncode == 3
    annotations = [line for line in env_result.stderr.splitlines() if line.startswith("::error file=")]
    assert len(annotations) == 2
    # The files left out are counted, not silently dropped.
    assert env_result.stdout == "" and env_result.stderr.splitlines()[-1] == (
        "::warning title=nandoctor check-data::"
        "and 2 more files with problems (see the step summary / JSON report)")
    assert "4 of 4 files with problems" in (tmp_path / "summary.md").read_text()
