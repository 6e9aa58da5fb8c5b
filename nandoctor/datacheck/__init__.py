"""`nandoctor check-data`: find NaN, Inf and other problems in dataset files before training.

`scan()` walks files and folders (and `file.py:dataset` targets) and returns a `DataReport`.
"""
from nandoctor.datacheck.checks import CheckOptions
from nandoctor.datacheck.model import DataReport, Problem
from nandoctor.datacheck.scan import scan

__all__ = ["CheckOptions", "DataReport", "Problem", "scan"]
