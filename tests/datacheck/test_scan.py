"""Walking folders, odd files on the way, severities and parallel checking."""
import os

import numpy as np
import pytest

from nandoctor.datacheck.checks import CheckOptions
from nandoctor.datacheck.scan import NothingToCheck, scan
from nandoctor.errors import UsageError

ERRORS = ["nan", "inf", "empty", "unreadable", "label_range"]


def run_scan(*paths, **kwargs):
    return scan([str(p) for p in paths], errors=kwargs.pop("errors", ERRORS), progress=False, **kwargs)


def nan_array():
    return np.array([1.0, np.nan, 2.0])


def test_folders_are_searched_recursively_and_unknown_files_are_skipped(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    np.save(tmp_path / "a" / "b" / "deep.npy", nan_array())
    np.save(tmp_path / "top.npy", np.arange(3.0))
    (tmp_path / "README.txt").write_text("not data")
    report = run_scan(tmp_path)
    assert report.files_scanned == 2 and report.files_skipped == 1
    assert [p.file for p in report.problems] == [str(tmp_path / "a" / "b" / "deep.npy")]


def test_a_file_reached_through_two_paths_is_checked_once(tmp_path):
    (tmp_path / "data").mkdir()
    np.save(tmp_path / "data" / "x.npy", nan_array())
    report = run_scan(tmp_path / "data", tmp_path, tmp_path / "data" / "x.npy")
    assert report.files_scanned == 1 and len(report.problems) == 1


def test_skipped_files_are_named_fifos_included(tmp_path):
    (tmp_path / "notes.txt").write_text("x = NaN\n")
    os.mkfifo(tmp_path / "pipe.npy")  # opening it would block: never opened
    np.save(tmp_path / "x.npy", np.arange(3.0))
    report = run_scan(tmp_path)
    assert report.files_scanned == 1 and report.files_skipped == 2
    assert sorted(os.path.basename(p) for p in report.skipped) == ["notes.txt", "pipe.npy"]
    assert report.to_dict()["skipped_files"] == report.skipped


def test_file_is_named_relative_as_the_user_gave_it(tmp_path, monkeypatch):
    (tmp_path / "data" / "masks").mkdir(parents=True)
    np.save(tmp_path / "data" / "masks" / "0007.npy", nan_array())
    monkeypatch.chdir(tmp_path)
    (problem,) = run_scan("data").problems
    assert problem.file == os.path.join("data", "masks", "0007.npy")


def test_odd_file_names_are_checked_like_any_other(tmp_path):
    for name in ["with space.npy", "ünïcödé.npy", "new\nline.npy"]:
        np.save(tmp_path / name, nan_array())
    report = run_scan(tmp_path)
    assert sorted(os.path.basename(p.file) for p in report.problems) == sorted(
        ["with space.npy", "ünïcödé.npy", "new\nline.npy"])


def test_symlink_pointing_to_itself_is_reported_not_fatal(tmp_path):
    os.symlink(tmp_path / "loop.npy", tmp_path / "loop.npy")
    np.save(tmp_path / "ok.npy", np.arange(3.0))
    report = run_scan(tmp_path)
    (problem,) = report.problems
    assert problem.check == "unreadable" and "loop" in problem.detail


def test_folder_symlink_back_to_its_parent_is_reported_not_followed_forever(tmp_path):
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "x.npy", np.arange(3.0))
    os.symlink(tmp_path / "d", tmp_path / "d" / "again")
    report = run_scan(tmp_path / "d")
    assert report.files_scanned == 1
    (problem,) = report.problems
    assert problem.check == "unreadable" and "loop" in problem.detail


def test_file_without_read_permission_is_unreadable(tmp_path):
    path = tmp_path / "secret.npy"
    np.save(path, np.arange(3.0))
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):
            pytest.skip("running as root: chmod does not stop reading")
        (problem,) = run_scan(path).problems
        assert problem.check == "unreadable" and "permission" in problem.detail
    finally:
        path.chmod(0o644)


def test_folder_without_permission_is_reported(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    np.save(locked / "x.npy", np.arange(3.0))
    locked.chmod(0)
    try:
        if os.access(locked, os.R_OK):
            pytest.skip("running as root: chmod does not stop reading")
        (problem,) = run_scan(tmp_path).problems
        assert problem.check == "unreadable" and problem.file == str(locked)
    finally:
        locked.chmod(0o755)


def test_missing_path_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        run_scan(tmp_path / "nope")


def test_broken_symlink_named_as_a_path_is_a_missing_path(tmp_path):
    os.symlink(tmp_path / "not-fetched", tmp_path / "data")
    with pytest.raises(UsageError, match=r"no such file or directory: .*data \(a broken symbolic link to .*not-fetched\)"):
        run_scan(tmp_path / "data", allow_empty=True)


def test_empty_folder_is_nothing_to_check(tmp_path):
    (tmp_path / "data").mkdir()
    with pytest.raises(NothingToCheck) as raised:
        run_scan(tmp_path / "data")
    assert str(raised.value) == f"nothing to check in {tmp_path / 'data'}: the folder has no files"
    assert isinstance(raised.value, UsageError)  # exit status 2


def test_folder_of_other_files_only_is_nothing_to_check_and_says_how_many(tmp_path):
    (tmp_path / "data" / "sub").mkdir(parents=True)
    (tmp_path / "data" / "README.md").write_text("the data lives elsewhere")
    (tmp_path / "data" / "sub" / "notes.txt").write_text("")
    with pytest.raises(NothingToCheck, match=r"the folder has no data files \(2 files in other formats\)$"):
        run_scan(tmp_path / "data")


def test_file_in_a_format_nandoctor_does_not_read_is_nothing_to_check(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(NothingToCheck, match=r"notes.txt: not a data format nandoctor reads \(.*\.npy .*\)"):
        run_scan(tmp_path / "notes.txt")


def test_one_empty_path_among_good_ones_is_still_named(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "val").mkdir()
    np.save(tmp_path / "train" / "x.npy", np.arange(3.0))
    with pytest.raises(NothingToCheck, match="nothing to check in [^;]*val: the folder has no files$"):
        run_scan(tmp_path / "train", tmp_path / "val")


def test_allow_empty_scans_an_empty_folder_as_zero_files(tmp_path):
    (tmp_path / "data").mkdir()
    report = run_scan(tmp_path / "data", allow_empty=True)
    assert (report.files_scanned, report.problems, report.status) == (0, [], "clean")


def test_a_folder_whose_only_entry_is_a_problem_is_not_empty(tmp_path):
    (tmp_path / "data").mkdir()
    os.symlink(tmp_path / "data" / "loop.npy", tmp_path / "data" / "loop.npy")
    (problem,) = run_scan(tmp_path / "data").problems
    assert problem.check == "unreadable"


def test_severity_follows_the_errors_list(tmp_path):
    np.save(tmp_path / "flat.npy", np.zeros((3, 3)))
    np.save(tmp_path / "bad.npy", nan_array())
    report = run_scan(tmp_path, errors=["nan"])
    severity = {p.check: p.severity for p in report.problems}
    assert severity == {"nan": "error", "constant": "warning"}
    assert report.status == "problems"


def test_warnings_alone_leave_the_status_clean(tmp_path):
    np.save(tmp_path / "flat.npy", np.zeros((3, 3)))
    report = run_scan(tmp_path)
    assert [p.check for p in report.problems] == ["constant"] and report.status == "clean"


def test_parallel_scan_reports_the_same_as_a_serial_one(tmp_path):
    for i in range(12):
        a = np.arange(100.0)
        if i % 3 == 0:
            a[i] = np.nan
        np.save(tmp_path / f"f{i:02d}.npy", a)
    serial = run_scan(tmp_path, workers=1, options=CheckOptions(chunk_bytes=64))
    parallel = run_scan(tmp_path, workers=4, options=CheckOptions(chunk_bytes=64))
    assert serial.problems == parallel.problems and len(serial.problems) == 4


def test_report_dict_follows_the_contract(tmp_path):
    np.save(tmp_path / "bad.npy", nan_array())
    data = run_scan(tmp_path).to_dict()
    assert data["schema"] == "nandoctor.data/1" and data["status"] == "problems"
    assert data["files_scanned"] == 1
    (problem,) = data["problems"]
    assert {"file", "key", "check", "count", "detail"} <= set(problem)
    assert problem["positions"] == [[1]]
