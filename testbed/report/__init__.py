"""Reports: per-suite parsers, tables, checks and matplotlib figures for a collected run.

``testbed.report.build.build_report(results/<suite>/<run-id>, fmt="md"|"html")`` writes ``report/`` inside the
run folder. Nothing is imported here: a suite's ``report.py`` imports ``testbed.results``, which imports parts of
this package, and building a report imports ``testbed.results`` (an import here would close that ring).
"""
