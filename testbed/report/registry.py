"""Suite name -> reporter. Suites register a run reporter with ``@reporter("name")`` and, for reports across
the runs of a campaign, a campaign reporter with ``@campaign_reporter("name")``; :mod:`testbed.report.suites`
registers the built-in ones and looks them up."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from testbed.report.model import Report
from testbed.report.rundir import RunDir

if TYPE_CHECKING:
    from testbed.report.rundir import Campaign

Reporter = Callable[[RunDir, Report], None]
CampaignReporter = Callable[["Campaign", Report], None]

_REPORTERS: dict[str, Reporter] = {}
_CAMPAIGN_REPORTERS: dict[str, CampaignReporter] = {}
_TABLES: dict[tuple[str, str], frozenset[str]] = {}  # (run|campaign, suite) -> the tables its reporter makes


def reporter(*suites: str, tables: Iterable[str] | None = None) -> Callable[[Reporter], Reporter]:
    """Register ``fn`` as the reporter of each named suite; ``tables``: the tables it makes (what the suite's
    references may name; None: not declared, and no reference of the suite is checked before a run)."""

    def deco(fn: Reporter) -> Reporter:
        for suite in suites:
            _REPORTERS[suite] = fn
            if tables is not None:
                _TABLES["run", suite] = frozenset(tables)
        return fn

    return deco


def campaign_reporter(*suites: str, tables: Iterable[str] | None = None
                      ) -> Callable[[CampaignReporter], CampaignReporter]:
    """Register ``fn`` as the cross-run (campaign) reporter of each named suite; ``tables`` as for reporter."""

    def deco(fn: CampaignReporter) -> CampaignReporter:
        for suite in suites:
            _CAMPAIGN_REPORTERS[suite] = fn
            if tables is not None:
                _TABLES["campaign", suite] = frozenset(tables)
        return fn

    return deco


def tables_of(kind: str, suite: str) -> frozenset[str] | None:
    """The tables the ``kind`` (run or campaign) reporter of ``suite`` declared (None: it declared none)."""
    return _TABLES.get((kind, suite))
