"""Suite name -> reporter function. Suites register themselves with ``@reporter("name")``."""

from __future__ import annotations

from collections.abc import Callable

from testbed.report.model import Report
from testbed.report.rundir import RunDir

Reporter = Callable[[RunDir, Report], None]

_REPORTERS: dict[str, Reporter] = {}


def reporter(*suites: str) -> Callable[[Reporter], Reporter]:
    """Register ``fn`` as the reporter of each named suite."""

    def deco(fn: Reporter) -> Reporter:
        for suite in suites:
            _REPORTERS[suite] = fn
        return fn

    return deco


def get_reporter(suite: str) -> Reporter | None:
    import testbed.report.suites  # noqa: F401  (registers the built-in reporters)

    return _REPORTERS.get(suite)


def known_suites() -> list[str]:
    import testbed.report.suites  # noqa: F401

    return sorted(_REPORTERS)
