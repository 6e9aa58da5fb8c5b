"""Diagnosis: name the cause of a detection and the fix, from rules registered per op family."""
from __future__ import annotations

from nandoctor.report.model import Cause, RunReport


def diagnose(report: RunReport) -> Cause:
    return Cause("unknown", "Unknown cause", "No rule matched.", "")
