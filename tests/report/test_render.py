"""`publish` and the destinations: streams, report files replaced atomically, appended files."""
from __future__ import annotations

import io
import os
import stat

import pytest

from nandoctor.datacheck.model import DataReport
from nandoctor.errors import UsageError
from nandoctor.report import render
from nandoctor.report.model import RunReport
from nandoctor.report.render import AppendFile, AtomicFile, Output, Stream, publish


class Tagged:
    """A renderer that says which report kind it was given."""

    def render_run(self, report: RunReport) -> str:
        return f"run {report.script}\n"

    def render_data(self, report: DataReport) -> str:
        return f"data {report.files_scanned}\n"


RUN = RunReport(status="clean", exit_code=0, script="train.py")


def test_publish_renders_each_report_kind_with_its_own_method_in_order(tmp_path):
    stream, path = io.StringIO(), tmp_path / "out.txt"
    outputs = [Output(Tagged(), Stream(stream)), Output(Tagged(), AtomicFile(path)), Output(Tagged(), Stream(stream))]

    publish(RUN, outputs)
    publish(DataReport(files_scanned=4), outputs)

    assert stream.getvalue() == "run train.py\nrun train.py\ndata 4\ndata 4\n"
    assert path.read_text() == "data 4\n"


def test_a_stream_is_flushed_after_each_text():
    class Flushes(io.StringIO):
        flushed_at: list[str] = []

        def flush(self) -> None:
            self.flushed_at.append(self.getvalue())

    stream = Flushes()
    Stream(stream).write("one\n")
    Stream(stream).write("")  # nothing to say: nothing written
    Stream(stream).write("two\n")

    assert stream.flushed_at == ["one\n", "one\ntwo\n"]


def test_a_report_file_is_replaced_whole(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("old report\n")

    AtomicFile(path).write("new report\n")

    assert path.read_text() == "new report\n"
    assert os.listdir(tmp_path) == ["report.json"]


def test_a_report_path_that_is_a_symlink_writes_its_target_and_keeps_the_link(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "a.json").write_text("old\n")
    (tmp_path / "latest.json").symlink_to("runs/a.json")

    AtomicFile(tmp_path / "latest.json").write("new\n")

    assert (tmp_path / "latest.json").is_symlink()
    assert (tmp_path / "runs" / "a.json").read_text() == "new\n"


def test_a_report_path_with_another_hard_link_is_written_in_place(tmp_path):
    (tmp_path / "report.json").write_text("old\n")
    os.link(tmp_path / "report.json", tmp_path / "other.json")

    AtomicFile(tmp_path / "report.json").write("new\n")

    assert (tmp_path / "other.json").read_text() == "new\n"


def test_a_fifo_with_a_reader_gets_the_report_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # (`nandoctor run --json fifo` | a reader)
    try:
        AtomicFile(fifo).write("report\n")
        got = os.read(reader, 100)
    finally:
        os.close(reader)

    assert got == b"report\n" and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_near_miss_a_fifo_nobody_reads_is_a_usage_error_not_a_hang(tmp_path):
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)

    with pytest.raises(UsageError, match="cannot write report"):
        AtomicFile(fifo).write("report\n")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_report_file_gets_the_usual_permissions_not_the_temp_files(tmp_path):
    old = os.umask(0o022)
    try:
        AtomicFile(tmp_path / "report.json").write("{}\n")
    finally:
        os.umask(old)

    assert (tmp_path / "report.json").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_failure_mid_write_leaves_the_old_file_and_no_partial_one(tmp_path, monkeypatch, failure):
    path = tmp_path / "report.json"
    path.write_text("old report\n")
    real_fdopen = os.fdopen

    def fdopen_failing_halfway(fd, *args, **kwargs):
        handle = real_fdopen(fd, *args, **kwargs)
        real_write = handle.write

        def write(text):
            real_write(text[: len(text) // 2])
            handle.flush()
            raise failure

        handle.write = write
        return handle

    monkeypatch.setattr(render.os, "fdopen", fdopen_failing_halfway)
    expected = UsageError if isinstance(failure, OSError) else KeyboardInterrupt
    with pytest.raises(expected) as raised:
        AtomicFile(path).write('{"status": "nonfinite"}\n')

    assert path.read_text() == "old report\n"
    assert os.listdir(tmp_path) == ["report.json"]
    if expected is UsageError:
        assert str(raised.value) == f"cannot write report to {path}: No space left on device"


def test_a_folder_that_cannot_be_written_is_a_usage_error_before_the_work(tmp_path, monkeypatch):
    monkeypatch.setattr(render.os, "access", lambda path, mode: False)  # as if read-only, also for root

    with pytest.raises(UsageError, match=r"^cannot write report to .*report\.json: folder .* is not writable$"):
        AtomicFile(tmp_path / "report.json").check()


def test_a_path_below_a_file_is_a_usage_error_at_the_check_and_at_the_write(tmp_path):
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    target = AtomicFile(tmp_path / "notes.txt" / "report.json")

    with pytest.raises(UsageError, match=r"folder .*notes\.txt is not a folder$"):
        target.check()
    with pytest.raises(UsageError, match=r"^cannot write report to .*report\.json: Not a directory$"):
        target.write("x")


def test_a_missing_folder_is_a_usage_error_in_one_line(tmp_path):
    target = AtomicFile(tmp_path / "no" / "such" / "report.xml")

    with pytest.raises(UsageError, match=r"folder .*such does not exist$"):
        target.check()
    with pytest.raises(UsageError, match="No such file or directory") as raised:
        target.write("x")
    assert "\n" not in str(raised.value)


def test_an_appended_file_keeps_what_was_there(tmp_path):
    path = tmp_path / "summary.md"
    path.write_text("earlier step\n")

    AppendFile(path).write("this step\n")

    assert path.read_text() == "earlier step\nthis step\n"


def test_an_append_failure_goes_to_on_error_when_given_else_it_is_a_usage_error(tmp_path):
    path = tmp_path / "no-dir" / "summary.md"
    seen: list[OSError] = []

    AppendFile(path, on_error=seen.append).write("x")

    assert [e.errno for e in seen] == [2]
    with pytest.raises(UsageError, match="cannot write to .*summary.md: No such file or directory"):
        AppendFile(path).write("x")
