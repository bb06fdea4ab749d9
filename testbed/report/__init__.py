"""Reports: per-suite parsers, tables, checks and matplotlib figures for a collected run.

``build_report(results/<suite>/<run-id>, fmt="md"|"html")`` writes ``report/`` inside the run folder.
"""

from testbed.report.build import ReportResult, build_report
from testbed.report.registry import known_suites, reporter

__all__ = ["ReportResult", "build_report", "known_suites", "reporter"]
