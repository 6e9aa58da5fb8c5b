"""Placeholder terminal renderer."""
from nandoctor.report.json_report import render_json
def print_report(report, context_lines=2):
    print(render_json(report)[:3000])
