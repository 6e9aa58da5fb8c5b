"""pytest plugin: `pytest --nandoctor` runs each test under nandoctor's per-op NaN/Inf detector.

A test that makes a NaN (anywhere, also one it discards) or lets an Inf reach a loss, a
gradient or a value it reads fails with the root op, its source line, the phase and
the cause with its fix, instead of passing silently or failing later on a bad assertion.

    pytest --nandoctor                          # every test
    pytest --nandoctor --nandoctor-config ci.yaml
    @pytest.mark.nandoctor(enabled=False)       # opt one test (or module, class) out

Off by default and free when off: this module imports neither torch nor the detector; the
per-test wrapper is registered only when `--nandoctor` is given. Only the test's call phase
is checked (fixtures are not), and `run.max_steps` is ignored (a test always runs to its end).
"""
from __future__ import annotations

import sys
from typing import Any

import pytest

MARKER = "nandoctor"
# The names this module may be registered under: the `pytest11` entry point and `-p MODULE`.
_ALIASES = ("nandoctor", __name__)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nandoctor", "NaN/Inf detection (nandoctor)")
    group.addoption("--nandoctor", action="store_true", default=False,
                    help="Fail a test at the first op that makes a NaN/Inf, naming the op, line and cause.")
    group.addoption("--nandoctor-config", metavar="PATH", default=None,
                    help="nandoctor YAML config merged over the defaults (its `run` section is used).")


def pytest_plugin_registered(plugin: Any, plugin_name: str, manager: pytest.PytestPluginManager) -> None:
    """Loaded under one name (`-p nandoctor.pytest_plugin`), block the other (the entry point
    `nandoctor`), so that loading both ways never registers this module twice."""
    if plugin is sys.modules[__name__]:
        for alias in _ALIASES:
            if alias != plugin_name and not manager.is_blocked(alias) and manager.get_plugin(alias) is None:
                manager.set_blocked(alias)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(enabled=True): with --nandoctor, enabled=False runs this test without the NaN/Inf detector.",
    )
    if config.getoption("nandoctor") and not config.pluginmanager.has_plugin(_DetectorPlugin.NAME):
        from nandoctor.config import load_config
        from nandoctor.errors import ConfigError

        try:
            settings = load_config(config.getoption("nandoctor_config")).run
        except ConfigError as exc:
            raise pytest.UsageError(f"nandoctor: {exc}") from None
        config.pluginmanager.register(_DetectorPlugin(settings), _DetectorPlugin.NAME)


def _enabled(item: pytest.Item) -> bool:
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return True
    enabled = marker.kwargs.get("enabled", marker.args[0] if marker.args else True)
    return bool(enabled)


class _DetectorPlugin:
    """The per-test wrapper, registered only with --nandoctor."""

    NAME = "nandoctor-detector"

    def __init__(self, run_settings) -> None:
        # A test always runs to its end: the smoke-test step limit of `nandoctor run` is off.
        self.settings = dict(run_settings, max_steps=0)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        if not _enabled(item):
            return (yield)
        from nandoctor.detect.detector import Detector
        from nandoctor.detect.observer import NonFiniteFound
        from nandoctor.detect.provenance import SourceLocator

        detector = Detector(self.settings, SourceLocator())
        try:
            with detector:
                result = yield
        except NonFiniteFound:
            result = None
        # A test is stricter than a training run: any NaN it made fails it, also one it then
        # discarded; the stop (also when the test swallowed it) comes first.
        detection = detector.detection or detector.first_nan()
        if detection is not None:
            report = _build_report(item, detector, detection)
            item.user_properties.extend(_properties(report))
            pytest.fail(_message(report), pytrace=False)
        return result


def _build_report(item: pytest.Item, detector, detection):
    from nandoctor.diagnose import build_report
    from nandoctor.errors import ExitCode

    return build_report(item.nodeid, exit_code=int(ExitCode.FOUND), detection=detection,
                        step=detector.state.step_or_none, history=detector.history())


def _message(report) -> str:
    """First line: what and where; then the cause (id, title, explanation, fix), the root's
    inputs and the lineage (the same text as the JUnit failure of `nandoctor run`)."""
    from nandoctor.report.text import failure_text

    root = report.root or report.event
    where = f" at {root.location}" if root.location else ""
    head = f"nandoctor: {root.op or 'a non-finite value'} made a non-finite value{where} (phase {root.phase})"
    return head + "\n" + failure_text(report)


def _properties(report) -> list[tuple[str, str]]:
    """Shown by `pytest --junitxml` as <property> elements of the test case."""
    root = report.root or report.event
    props = [("nandoctor_op", root.op), ("nandoctor_phase", root.phase)]
    if root.location is not None:
        props.append(("nandoctor_location", str(root.location)))
    if report.cause is not None:
        props.append(("nandoctor_cause", report.cause.id))
    return props
