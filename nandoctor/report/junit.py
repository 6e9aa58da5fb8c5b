"""JUnit XML for CI systems that show test results (GitLab, Jenkins, Azure, GitHub test reporters).

`nandoctor run` becomes one test case named after the script: a `<failure>` when a non-finite
value was found, an `<error>` when the script itself crashed, nothing when it ran clean.
`nandoctor check-data` becomes one test case per data file, failing when the file has a
problem that counts as an error (`check_data.errors`); warnings go to `<system-out>`.
`time` (seconds) is put on the suite and, for a run, on its case; without it, a run's own
measured duration (`RunReport.duration_s`) is used. `files`, when given, lists every
scanned file so that clean files appear as passing cases (the data report itself names
only files with problems).

Built with ElementTree, so every attribute and text is escaped by the XML writer. Text that
XML 1.0 cannot hold at all (control characters, undecodable file names) is made printable.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from nandoctor.report.model import RunReport
from nandoctor.report.text import checks, discarded_summary, failure_message, failure_text, plural, problem_line

if TYPE_CHECKING:
    from nandoctor.datacheck.model import DataReport

SUITE_NAME = "nandoctor"
RUN_CLASSNAME = "nandoctor.run"
DATA_CLASSNAME = "nandoctor.check_data"


@dataclass(frozen=True)
class JUnit:
    time: float | None = None  # seconds; None: the report's own duration, when it has one
    files: Sequence[str] | None = None

    def render_run(self, report: RunReport) -> str:
        return run_junit(report, self._time(report))

    def render_data(self, report: DataReport) -> str:
        return data_junit(report, self.files, self._time(report))

    def _time(self, report) -> float:
        if self.time is not None:
            return self.time
        return getattr(report, "duration_s", None) or 0.0


# Characters XML 1.0 forbids even when escaped: C0 controls other than tab/newline/CR,
# lone surrogates (file names that are not UTF-8), and U+FFFE/U+FFFF.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_safe(value: Any) -> str:
    text = "" if value is None else str(value)
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", text)


def _element(tag: str, attrib: Mapping[str, Any] | None = None, text: str | None = None) -> ET.Element:
    element = ET.Element(tag, {k: _xml_safe(v) for k, v in (attrib or {}).items()})
    if text:
        element.text = _xml_safe(text)
    return element


def _serialize(root: ET.Element) -> str:
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _suite(name: str, cases: Sequence[ET.Element], time: float) -> ET.Element:
    failures = sum(1 for c in cases if c.find("failure") is not None)
    errors = sum(1 for c in cases if c.find("error") is not None)
    suite = _element("testsuite", {
        "name": name, "tests": len(cases), "failures": failures, "errors": errors,
        "skipped": 0, "time": f"{time:.3f}",
    })
    suite.extend(cases)
    return suite


# -- the run report ---------------------------------------------------------------------


def run_junit(report: RunReport, time: float = 0.0) -> str:
    """The run report as a JUnit XML document with one test case named after the script."""
    case = _element("testcase", {"classname": RUN_CLASSNAME, "name": report.script, "time": f"{time:.3f}"})
    if report.status == "nonfinite":
        attrib = {"message": failure_message(report), "type": report.cause.id if report.cause else "nonfinite"}
        case.append(_element("failure", attrib, failure_text(report)))
    elif report.status == "script_error":
        error = report.error or {}
        kind = error.get("type") or "ScriptError"
        message = f"{kind}: {error.get('message', '')}".rstrip(": ")
        text = f"{message}\nThe script exited with status {report.exit_code} before any non-finite value was seen."
        case.append(_element("error", {"message": message, "type": kind}, text))
    elif report.discarded:  # passing, but say what was made and thrown away
        case.append(_element("system-out", None, f"clean: {discarded_summary(report.discarded)}."))
    return _serialize(_suite(SUITE_NAME, [case], time))


# -- the data report --------------------------------------------------------------------


def data_junit(report: DataReport, files: Sequence[str] | None = None, time: float = 0.0) -> str:
    """The data report as JUnit XML: one test case per data file (see the module's words on
    `files`). Without `files`, and with no problems at all, a single passing case stands for
    the whole scan."""
    by_file = report.by_file()
    names = list(dict.fromkeys([*(files or []), *by_file]))
    cases = []
    for name in names:
        case = _element("testcase", {"classname": DATA_CLASSNAME, "name": name, "time": "0.000"})
        problems = by_file.get(name, [])
        errors = [p for p in problems if p.is_error]
        warnings = [p for p in problems if not p.is_error]
        if errors:
            noun = "problem" if len(errors) == 1 else "problems"
            attrib = {"message": f"{len(errors)} {noun} in {name}: {checks(errors)}", "type": errors[0].check}
            case.append(_element("failure", attrib, "\n".join(problem_line(p) for p in errors)))
        if warnings:
            case.append(_element("system-out", None, "\n".join("warning: " + problem_line(p) for p in warnings)))
        cases.append(case)
    if not cases:
        cases.append(_element("testcase", {"classname": DATA_CLASSNAME,
                                           "name": f"check-data ({plural(report.files_scanned, 'file')})",
                                           "time": "0.000"}))
    return _serialize(_suite(f"{SUITE_NAME}.check-data", cases, time))
