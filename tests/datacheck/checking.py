"""Helpers for the data-check tests: check one file, pick problems by check."""
from __future__ import annotations

from nandoctor.datacheck.checks import CheckOptions
from nandoctor.datacheck.scan import check_file


def problems_of(path, **options):
    return check_file(str(path), CheckOptions(**options))


def only(problems, check):
    return [p for p in problems if p.check == check]
