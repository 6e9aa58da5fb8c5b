"""The runner: a script under `nandoctor run` sees exactly what it sees under `python`."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from helpers import run_nandoctor
from nandoctor.errors import UsageError
from nandoctor.runner import ScriptRunner

PROBE = textwrap.dedent(
    """
    import os, sys
    print("argv", sys.argv)
    print("name", __name__)
    print("file", __file__)
    print("path0", sys.path[0])
    print("spec", __spec__.name if __spec__ else None)
    print("package", __package__)
    print("main_is_globals", sys.modules["__main__"].__dict__ is globals())
    print("builtins", type(__builtins__).__name__)
    print("cwd", os.getcwd())
    """
)


def _python(args, cwd):
    """What a real `python ARGS` gives: the reference, never forked from a server."""
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120).stdout


def _probe_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if not line.startswith("nandoctor")]


def test_script_sees_the_same_argv_name_file_and_path_as_under_python(tmp_path, script):
    script("sub/probe.py", PROBE)
    args = ["sub/probe.py", "--lr", "3", "--json", "x.json"]
    plain = _python(args, tmp_path)
    wrapped = run_nandoctor(["run", *args], tmp_path, json_name=None)
    assert wrapped.code == 0
    assert _probe_lines(wrapped.stdout) == plain.splitlines()
    # The script's own --json was passed through untouched, not taken by nandoctor.
    assert "'--json', 'x.json'" in plain and not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("target", [
    "./sub/../sub/probe.py",  # named as given: python does not normalise `..` (a symlinked folder)
    "sub",  # a directory with a __main__.py: its spec, and the directory first on sys.path
    "./sub/",
])
def test_a_script_named_in_other_ways_sees_what_python_shows_it(tmp_path, script, target):
    script("sub/probe.py", PROBE)
    script("sub/__main__.py", PROBE)
    plain = _python([target], tmp_path)
    wrapped = run_nandoctor(["run", target], tmp_path, json_name=None)
    assert wrapped.code == 0
    assert _probe_lines(wrapped.stdout) == plain.splitlines()


def _zip_app(tmp_path, name: str, members: dict[str, str], prefix: bytes = b"") -> str:
    """A zip application as `python -m zipapp` makes one (an optional `#!` line first)."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for member, source in members.items():
            archive.writestr(member, source)
    (tmp_path / name).write_bytes(prefix + buffer.getvalue())
    return name


@pytest.mark.parametrize("prefix", [b"", b"#!/usr/bin/env python3\n"])
def test_a_zip_application_runs_as_python_runs_it(tmp_path, prefix):
    app = _zip_app(tmp_path, "app.pyz", {"__main__.py": PROBE + "import helper\nprint(helper.X)\n",
                                         "helper.py": "X = 5\n"}, prefix)
    plain = _python([app, "a"], tmp_path)
    wrapped = run_nandoctor(["run", app, "a"], tmp_path, json_name=None)
    assert wrapped.code == 0 and plain.splitlines()[-1] == "5"
    assert _probe_lines(wrapped.stdout) == plain.splitlines()


def test_near_miss_a_zip_without_a_main_is_refused_in_pythons_words(tmp_path):
    app = _zip_app(tmp_path, "lib.zip", {"helper.py": "X = 5\n"})
    wrapped = run_nandoctor(["run", app], tmp_path, json_name=None)
    assert wrapped.code == 2 and "can't find '__main__' module in 'lib.zip'" in wrapped.stderr


@pytest.mark.parametrize("app", ["bad", "bad.pyz"])
def test_a_report_on_a_directory_or_zip_application_shows_its_main_lines(tmp_path, script, app):
    source = "import torch\nx = torch.tensor([-1.0])\nprint(torch.log(x).tolist())\n"
    if app == "bad":
        script("bad/__main__.py", source)
    else:
        _zip_app(tmp_path, app, {"__main__.py": source})
    result = run_nandoctor(["run", app], tmp_path)
    location = result.report["root"]["location"]
    assert result.code == 3 and location["file"] == f"{app}/__main__.py" and location["line"] == 3
    assert "print(torch.log(x).tolist())" in location["code"] and "→    3 │ print(torch.log(x)" in result.stderr


def test_module_run_matches_python_dash_m(tmp_path, script):
    script("pkg/__init__.py", "")
    script("pkg/probe.py", PROBE)
    plain = _python(["-m", "pkg.probe", "a", "-v"], tmp_path)
    wrapped = run_nandoctor(["run", "-m", "pkg.probe", "a", "-v"], tmp_path, json_name=None)
    assert wrapped.code == 0
    assert _probe_lines(wrapped.stdout) == plain.splitlines()


def test_symlinked_script_imports_from_the_folder_it_really_lives_in(tmp_path, script):
    script("real/probe.py", PROBE)
    os.symlink(tmp_path / "real" / "probe.py", tmp_path / "link.py")
    plain = _python(["link.py"], tmp_path)
    wrapped = run_nandoctor(["run", "link.py"], tmp_path, json_name=None)
    assert _probe_lines(wrapped.stdout) == plain.splitlines()


def test_spawned_dataloader_workers_can_import_the_main_module(tmp_path, script):
    script(
        "train.py",
        textwrap.dedent(
            """
            import torch
            from torch.utils.data import DataLoader, TensorDataset

            def main():
                data = TensorDataset(torch.arange(8.0).unsqueeze(1))
                loader = DataLoader(data, batch_size=4, num_workers=2, multiprocessing_context="spawn")
                print("sum", sum(float(b[0].sum()) for b in loader))

            if __name__ == "__main__":
                main()
            """
        ),
    )
    result = run_nandoctor(["run", "train.py"], tmp_path)
    assert result.code == 0, result.stderr
    assert "sum 28.0" in result.stdout
    assert result.report["status"] == "clean"


def test_traceback_of_a_failing_script_shows_only_the_users_frames(tmp_path, script):
    script("train.py", "import torch\n\ndef load():\n    raise FileNotFoundError('data.csv')\n\nload()\n")
    result = run_nandoctor(["run", "train.py"], tmp_path)
    assert result.code == 1
    assert 'File "' in result.stderr and "train.py\", line 4, in load" in result.stderr
    assert "FileNotFoundError: data.csv" in result.stderr
    assert "nandoctor" not in result.stderr.split("Traceback")[1].split("FileNotFoundError")[0]
    assert result.report["status"] == "script_error"
    assert result.report["error"]["type"] == "FileNotFoundError"


def _python_stderr(args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def _users_traceback(stderr: str) -> list[str]:
    """The traceback part of nandoctor's stderr: the lines before nandoctor's own words."""
    lines = stderr.splitlines()
    start = lines.index("Traceback (most recent call last):")
    end = next((i for i, line in enumerate(lines) if i > start and line.startswith("nandoctor")), len(lines))
    return lines[start:end]


@pytest.mark.parametrize(
    "module, init, status",
    [
        ("pkg.mod", "import not_installed_dep\n", 1),  # ModuleNotFoundError for another name
        ("pkg", "import not_installed_dep\n", 1),  # the same, reached through pkg/__main__.py
        ("pkg.mod", "from os import not_a_name\n", 1),  # ImportError
        ("pkg.mod", "raise RuntimeError('broken package')\n", 1),
        ("pkg.mod", "import sys\nsys.exit(5)\n", 5),
    ],
)
def test_an_import_failing_inside_the_users_package_is_the_scripts_error_as_under_python(
    tmp_path, script, module, init, status
):
    script("pkg/__init__.py", init)
    script("pkg/mod.py", "print('ran')\n")
    script("pkg/__main__.py", "print('ran')\n")
    plain = _python_stderr(["-m", module], tmp_path)
    wrapped = run_nandoctor(["run", "-m", module], tmp_path)
    assert plain.returncode == status
    assert wrapped.code == status, wrapped.stderr
    assert "ran" not in wrapped.stdout and "ran" not in plain.stdout  # the module itself never ran
    if status != 1:
        return  # a sys.exit in the package: no traceback either way
    traceback_lines = _users_traceback(wrapped.stderr)
    assert traceback_lines[-1] == plain.stderr.splitlines()[-1]  # e.g. "ModuleNotFoundError: No module named ..."
    assert any(line.strip().startswith('File "') and "pkg/__init__.py\", line" in line for line in traceback_lines)
    assert not any("nandoctor" in line for line in traceback_lines), traceback_lines  # the user's frames only
    assert wrapped.report["status"] == "script_error"


@pytest.mark.parametrize(
    "module, message",
    [
        ("not_a_module_anywhere", "no module named 'not_a_module_anywhere'"),
        ("missing_pkg.mod", "no module named 'missing_pkg.mod'"),
        ("pkg.not_there", "no module named 'pkg.not_there'"),
        ("pkg", "no module named 'pkg.__main__'; 'pkg' is a package and cannot be run directly"),
    ],
)
def test_a_module_that_is_not_there_is_a_one_line_usage_error(tmp_path, script, module, message):
    script("pkg/__init__.py", "")  # a package without __main__.py
    plain = _python_stderr(["-m", module], tmp_path)
    wrapped = run_nandoctor(["run", "-m", module], tmp_path, json_name=None)
    assert plain.returncode == 1 and "Traceback" not in plain.stderr  # python's one line
    assert wrapped.code == 2  # the contract's usage error
    assert wrapped.stderr.splitlines() == [f"nandoctor: {message}"]


RAISES_ON_A_THREAD = """\
import threading
def train():
    raise {}
t = threading.Thread(target=train)
t.start()
t.join()
print('after join')
"""


def _runner_of(path) -> ScriptRunner:
    runner = ScriptRunner(str(path), [])
    runner.prepare()
    return runner


class TestInProcess:
    """The runner used directly: state is restored whatever the script did."""

    def test_working_directory_is_restored_even_if_the_script_removed_it(self, tmp_path, script, monkeypatch):
        monkeypatch.chdir(tmp_path)
        path = script(
            "chdir.py",
            "import os, shutil\nos.makedirs('gone', exist_ok=True)\nos.chdir('gone')\nshutil.rmtree(os.getcwd())\n",
        )
        runner = ScriptRunner(str(path), [])
        runner.prepare()
        argv, main = list(sys.argv), sys.modules["__main__"]
        outcome = runner.run()
        assert outcome.exit_code == 0
        assert os.getcwd() == str(tmp_path)
        assert sys.argv == argv and sys.modules["__main__"] is main

    @pytest.mark.parametrize("exit_value, status", [("None", 0), ("0", 0), ("4", 4), ("'bye'", 1), ("256", 0),
                                                    ("-1", 255), ("True", 1)])
    def test_system_exit_status_passes_through_as_python_gives_it(self, script, exit_value, status):
        runner = ScriptRunner(str(script("exit.py", f"import sys\nsys.exit({exit_value})\n")), [])
        runner.prepare()
        code = runner.run().exit_code
        assert code == status and type(code) is int  # (the status the system sees; the report's number)

    def test_the_scripts_main_module_has_the_annotations_python_gives_it(self, script):
        runner = ScriptRunner(str(script("ann.py", "assert __annotations__ == {}\nx: int = 1\n"
                                                   "assert __annotations__ == {'x': int}\n")), [])
        runner.prepare()
        assert runner.run().exit_code == 0

    def test_a_missing_script_is_a_usage_error(self, tmp_path):
        with pytest.raises(UsageError, match="no such file"):
            ScriptRunner(str(tmp_path / "nope.py"), []).prepare()

    def test_a_binary_file_is_not_a_python_script(self, tmp_path):
        path = tmp_path / "model.py"
        path.write_bytes(b"\x7fELF\x00\x00\x01binary")
        with pytest.raises(UsageError, match="not a Python script"):
            ScriptRunner(str(path), []).prepare()

    def test_a_syntax_error_is_the_scripts_and_ends_the_run_as_python_would(self, script, capsys):
        runner = ScriptRunner(str(script("bad.py", "x = 1\ndef (:\n")), [])
        runner.prepare()  # not a usage error: the script exists, its code is wrong
        outcome = runner.run()
        assert outcome.exit_code == 1 and type(outcome.exception) is SyntaxError
        err = capsys.readouterr().err
        assert err.startswith('  File "') and 'bad.py", line 2\n    def (:\n' in err
        assert "^" in err and err.rstrip().endswith("SyntaxError: invalid syntax")
        assert "Traceback" not in err

    def test_a_stop_raised_on_a_thread_the_script_started_ends_the_script_quietly(self, script, capsys):
        class Stop(BaseException):
            pass

        runner = _runner_of(script("threaded.py", RAISES_ON_A_THREAD.format("STOP('loss')")))
        runner.main_module.STOP = Stop
        with pytest.raises(Stop):
            runner.run(passthrough=(Stop,))
        out, err = capsys.readouterr()
        assert "after join" not in out and err == ""

    def test_near_miss_any_other_exception_of_a_thread_goes_to_the_hook_that_was_there(self, script, capsys,
                                                                                       monkeypatch):
        seen = []
        monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_type))
        runner = _runner_of(script("threaded.py", RAISES_ON_A_THREAD.format("ValueError('bad batch')")))
        assert runner.run(passthrough=(KeyboardInterrupt,)).exit_code == 0
        assert capsys.readouterr().out == "after join\n" and seen == [ValueError]

    def test_an_unknown_module_is_a_usage_error(self):
        with pytest.raises(UsageError, match="no module named 'surely_not_a_module'"):
            ScriptRunner("surely_not_a_module", [], as_module=True).prepare()
