"""Suite name -> reporter. Suites register a run reporter with ``@reporter("name")`` and, for reports across
the runs of a campaign, a campaign reporter with ``@campaign_reporter("name")``; :mod:`testbed.report.suites`
registers the built-in ones and looks them up."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from testbed.report.model import Report
from testbed.report.rundir import RunDir

if TYPE_CHECKING:
    from testbed.report.rundir import Campaign

Reporter = Callable[[RunDir, Report], None]
CampaignReporter = Callable[["Campaign", Report], None]

_REPORTERS: dict[str, Reporter] = {}
_CAMPAIGN_REPORTERS: dict[str, CampaignReporter] = {}


def reporter(*suites: str) -> Callable[[Reporter], Reporter]:
    """Register ``fn`` as the reporter of each named suite."""

    def deco(fn: Reporter) -> Reporter:
        for suite in suites:
            _REPORTERS[suite] = fn
        return fn

    return deco


def campaign_reporter(*suites: str) -> Callable[[CampaignReporter], CampaignReporter]:
    """Register ``fn`` as the cross-run (campaign) reporter of each named suite."""

    def deco(fn: CampaignReporter) -> CampaignReporter:
        for suite in suites:
            _CAMPAIGN_REPORTERS[suite] = fn
        return fn

    return deco
