"""JUnit XML for CI systems that show test results (GitLab, Jenkins, Azure, GitHub test reporters).

`nandoctor run` becomes one test case named after the script: a `<failure>` when a non-finite
value was found, an `<error>` when the script itself crashed, nothing when it ran clean.
`nandoctor check-data` becomes one test case per data file, failing when the file has a
problem that counts as an error (`check_data.errors`); warnings go to `<system-out>`.

Built with ElementTree, so every attribute and text is escaped by the XML writer. Text that
XML 1.0 cannot hold at all (control characters, undecodable file names) is made printable.
"""
from __future__ import annotations

import re
from dataclasses import replace
import xml.etree.ElementTree as ET
from typing import Any, Iterable, Mapping, Sequence

from nandoctor.errors import UsageError
from nandoctor.report.model import OpSite, RunReport
from nandoctor.stats import one_line

SUITE_NAME = "nandoctor"
RUN_CLASSNAME = "nandoctor.run"
DATA_CLASSNAME = "nandoctor.check_data"

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


def _where(site: OpSite) -> str:
    return str(site.location) if site.location else "an unknown location"


def _site_line(site: OpSite) -> str:
    op = site.op or "(no op: the value arrived non-finite)"
    parts = [f"{op} [{site.phase}] at {_where(site)}"]
    if site.backward_node:
        parts.append(f"backward node {site.backward_node}")
    if site.module:
        parts.append(f"module {site.module}")
    return ", ".join(parts)


def failure_message(report: RunReport) -> str:
    """`<cause title>: <root op> at <file>:<line>` — the one line CI systems show first."""
    title = report.cause.title if report.cause else "Non-finite value"
    root = report.root or report.event
    if root is None:
        return title
    return f"{title}: {root.op or '(no op)'} at {_where(root)}"


def failure_text(report: RunReport) -> str:
    """The plain-text story of a non-finite run: cause, fix, root, inputs, lineage.

    Used as the JUnit failure body and by the pytest plugin's failure message.
    """
    lines: list[str] = []
    cause = report.cause
    if cause is not None:
        lines.append(f"Cause: {cause.title} ({cause.id})")
        if cause.explanation:
            lines.append(cause.explanation)
        if cause.fix:
            lines.append(f"Fix: {cause.fix}")
        lines.append("")
    root = report.root or report.event
    if root is not None:
        lines.append(f"Root: {_site_line(root)}")
        if root.location is not None:
            lines.append(f"  in {root.location.function}: {root.location.code}")
        for summary in root.inputs:
            lines.append(f"  input  {one_line(summary)}")
        if root.output is not None:
            lines.append(f"  output {one_line(replace(root.output, name=''))}")
    if report.event is not None and report.event != root:
        reason = f" ({report.reason})" if report.reason else ""
        lines.append(f"Stopped at: {_site_line(report.event)}{reason}")
    if report.step is not None:
        lines.append(f"Optimizer steps completed: {report.step}")
    if len(report.lineage) > 1:
        lines.append("Lineage (root first):")
        for i, site in enumerate(report.lineage, 1):
            lines.append(f"  {i}. {_site_line(site)}")
    return "\n".join(lines).strip("\n")


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
    return _serialize(_suite(SUITE_NAME, [case], time))


# -- the data report --------------------------------------------------------------------


def _is_error(problem: Mapping[str, Any]) -> bool:
    # The contract's minimal problem has no severity: every listed problem is then an error.
    return problem.get("severity", "error") == "error"


def problem_line(problem: Mapping[str, Any]) -> str:
    """`nan in 'x': 3 — 3 NaN values at (0, 1), ...` (key only when there is one)."""
    key = problem.get("key")
    where = f" in {key!r}" if key is not None else ""
    count = problem.get("count")
    detail = problem.get("detail") or ""
    head = f"{problem.get('check', '?')}{where}"
    if count not in (None, 0, 1):
        head += f" (×{count})"
    return f"{head}: {detail}" if detail else head


def group_problems(problems: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Problems grouped by file, files in order of first appearance."""
    by_file: dict[str, list[Mapping[str, Any]]] = {}
    for problem in problems:
        by_file.setdefault(str(problem.get("file", "")), []).append(problem)
    return by_file


def data_junit(data_report: Mapping[str, Any], files: Sequence[str] | None = None, time: float = 0.0) -> str:
    """The data report as JUnit XML: one test case per data file.

    `files`, when given, lists every scanned file so clean ones appear as passing cases
    (the report itself only names files with problems). Without it, and with no problems
    at all, a single passing case stands for the whole scan.
    """
    by_file = group_problems(data_report.get("problems") or [])
    names = list(dict.fromkeys([*(files or []), *by_file]))
    cases = []
    for name in names:
        case = _element("testcase", {"classname": DATA_CLASSNAME, "name": name, "time": "0.000"})
        problems = by_file.get(name, [])
        errors = [p for p in problems if _is_error(p)]
        warnings = [p for p in problems if not _is_error(p)]
        if errors:
            checks = ", ".join(dict.fromkeys(str(p.get("check")) for p in errors))
            noun = "problem" if len(errors) == 1 else "problems"
            attrib = {"message": f"{len(errors)} {noun} in {name}: {checks}", "type": str(errors[0].get("check"))}
            case.append(_element("failure", attrib, "\n".join(problem_line(p) for p in errors)))
        if warnings:
            case.append(_element("system-out", None, "\n".join("warning: " + problem_line(p) for p in warnings)))
        cases.append(case)
    if not cases:
        scanned = data_report.get("files_scanned", 0)
        cases.append(_element("testcase", {"classname": DATA_CLASSNAME, "name": f"check-data ({scanned} files)",
                                           "time": "0.000"}))
    return _serialize(_suite(f"{SUITE_NAME}.check-data", cases, time))


def write_text(path: Any, text: str) -> None:
    """Write a report file; a path that cannot be written is the user's error (exit 2)."""
    try:
        with open(path, "w", encoding="utf-8", errors="backslashreplace") as handle:
            handle.write(text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
