"""Reports: per-suite parsers, tables, checks and matplotlib figures for a collected run.

``build_report(results/<suite>/<run-id>, fmt="md"|"html")`` writes ``report/`` inside the run folder.
"""

from testbed.report.build import ReportResult, build_report
from testbed.report.registry import reporter
from testbed.report.suites import known_suites

__all__ = ["ReportResult", "build_report", "known_suites", "reporter"]
