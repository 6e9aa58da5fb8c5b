"""The pytest plugin: `pytest --nandoctor` fails a test at the op that made a NaN/Inf.

Each case runs a real pytest in a subprocess (pytester), loading the plugin with
`-p nandoctor.pytest_plugin` as a project without the installed entry point would. A real
one, not forked from helpers' server: what the plugin imports, and PYTHONPATH's entry
points, are part of what is tested.
"""
from __future__ import annotations

import textwrap
import xml.etree.ElementTree as ET

import pytest

pytest_plugins = ["pytester"]

PLUGIN = ("-p", "nandoctor.pytest_plugin")

LOG_TEST = """\
import torch


def test_log_of_negative():
    y = torch.log(torch.tensor([-1.0]))
    assert y.shape == (1,)
"""

HEALTHY_TEST = """\
import torch


def test_one_training_step():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scores = model(torch.randn(8, 4)).masked_fill(torch.tensor([True, False]), float("-inf"))
    loss = torch.nn.functional.cross_entropy(scores, torch.ones(8, dtype=torch.long))
    loss.backward()
    opt.step()
    assert torch.isfinite(loss)
"""


def test_a_nan_fails_the_test_with_the_op_and_the_line(pytester: pytest.Pytester):
    pytester.makepyfile(test_log=LOG_TEST)

    result = pytester.runpytest_subprocess("--nandoctor", *PLUGIN)

    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*nandoctor: aten.log.default made a non-finite value at test_log.py:5 (phase *)",
        "Cause: * (*)",
        "Root: aten.log.default * at test_log.py:5*",
        "*y = torch.log(torch.tensor([[]-1.0[]]))",
        "*input  self float32[[]1[]]*neg=1",
    ])
    # No traceback of nandoctor's internals: the message is the whole story.
    assert "NonFiniteFound" not in result.stdout.str()


def test_without_the_option_the_same_test_passes(pytester: pytest.Pytester):
    pytester.makepyfile(test_log=LOG_TEST)

    result = pytester.runpytest_subprocess(*PLUGIN)

    result.assert_outcomes(passed=1)


def test_a_healthy_training_step_passes(pytester: pytest.Pytester):
    # Includes a deliberate masked_fill(-inf) before a softmax, which must not count as a NaN/Inf bug.
    pytester.makepyfile(test_train=HEALTHY_TEST)

    result = pytester.runpytest_subprocess("--nandoctor", *PLUGIN)

    result.assert_outcomes(passed=1)


def test_the_marker_opts_a_single_test_out(pytester: pytest.Pytester):
    pytester.makepyfile(test_mixed="""\
        import pytest
        import torch


        @pytest.mark.nandoctor(enabled=False)
        def test_opted_out():
            torch.log(torch.tensor([-1.0]))


        def test_checked():
            torch.log(torch.tensor([-1.0]))
    """)

    # --strict-markers: the marker is registered, also by name in `pytest --markers`.
    result = pytester.runpytest_subprocess("--nandoctor", "--strict-markers", "-rA", *PLUGIN)

    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["PASSED test_mixed.py::test_opted_out", "FAILED test_mixed.py::test_checked*"])


def test_a_test_that_swallows_the_stop_still_fails(pytester: pytest.Pytester):
    pytester.makepyfile(test_swallow="""\
        import torch


        def test_swallows_everything():
            try:
                torch.log(torch.tensor([-1.0]))
            except BaseException:
                pass
    """)

    result = pytester.runpytest_subprocess("--nandoctor", *PLUGIN)

    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*aten.log.default made a non-finite value at test_swallow.py:6*"])


def test_junitxml_gets_the_op_location_and_cause_as_properties(pytester: pytest.Pytester):
    pytester.makepyfile(test_log=LOG_TEST)

    pytester.runpytest_subprocess("--nandoctor", "--junitxml=out.xml", *PLUGIN)

    case = ET.parse(pytester.path / "out.xml").getroot().find(".//testcase")
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["nandoctor_op"] == "aten.log.default"
    assert props["nandoctor_location"] == "test_log.py:5"
    assert props["nandoctor_cause"]
    assert "aten.log.default" in case.find("failure").get("message")


def test_the_plugin_costs_nothing_when_off(pytester: pytest.Pytester):
    # Loaded but not enabled, the plugin imports neither torch nor the detector.
    pytester.makepyfile(test_light="""\
        import sys


        def test_nothing_heavy_imported():
            assert "torch" not in sys.modules
            assert "nandoctor.detect.detector" not in sys.modules
    """)

    assert pytester.runpytest_subprocess(*PLUGIN).ret == pytest.ExitCode.OK
    # With the option the detector is there: the same check fails, so the test above can fail.
    pytester.runpytest_subprocess("--nandoctor", *PLUGIN).assert_outcomes(failed=1)


def test_a_bad_config_is_a_usage_error(pytester: pytest.Pytester):
    pytester.makepyfile(test_log=LOG_TEST)
    pytester.path.joinpath("bad.yaml").write_text("run:\n  max_stepz: 3\n", encoding="utf-8")

    result = pytester.runpytest_subprocess("--nandoctor", "--nandoctor-config", "bad.yaml", *PLUGIN)

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*nandoctor: unknown setting 'run.max_stepz'*"])


def _install_entry_point(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `pip install nandoctor` gives: a `pytest11` entry point `nandoctor` for the plugin."""
    site = pytester.mkdir("site")
    dist = site / "nandoctor_plugin_fake-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nandoctor-plugin-fake\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nnandoctor = nandoctor.pytest_plugin\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)


@pytest.mark.parametrize("how", ["entry point only", "entry point and -p", "entry point and pytest_plugins"])
def test_the_plugin_loads_once_however_it_is_named(pytester: pytest.Pytester, monkeypatch, how):
    _install_entry_point(pytester, monkeypatch)
    pytester.makepyfile(test_log=LOG_TEST)
    args = ["--nandoctor"]
    if how == "entry point and -p":
        args += PLUGIN
    if how == "entry point and pytest_plugins":
        pytester.makeconftest('pytest_plugins = ["nandoctor.pytest_plugin"]')

    result = pytester.runpytest_subprocess(*args)

    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*aten.log.default made a non-finite value at test_log.py:5*"])


def test_plugin_can_be_disabled_by_its_entry_point_name(pytester: pytest.Pytester, monkeypatch):
    _install_entry_point(pytester, monkeypatch)
    pytester.makepyfile(test_log=LOG_TEST)

    result = pytester.runpytest_subprocess("-p", "no:nandoctor", "--nandoctor")

    assert result.ret == pytest.ExitCode.USAGE_ERROR  # the option is gone with the plugin
    result.stderr.fnmatch_lines(["*unrecognized arguments: --nandoctor*"])


def test_the_marker_alone_does_nothing_without_the_option(pytester: pytest.Pytester):
    pytester.makepyfile(test_marked=textwrap.dedent("""\
        import pytest
        import torch


        @pytest.mark.nandoctor
        def test_marked_but_not_enabled():
            torch.log(torch.tensor([-1.0]))
    """))

    pytester.runpytest_subprocess("--strict-markers", *PLUGIN).assert_outcomes(passed=1)
