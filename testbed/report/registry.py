"""Suite name -> reporter. Suites register a run reporter with ``@reporter("name")`` and, for reports across
the runs of a campaign, a campaign reporter with ``@campaign_reporter("name")``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from testbed.report.model import Report
from testbed.report.rundir import RunDir

if TYPE_CHECKING:
    from testbed.report.campaign import Campaign

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


def get_reporter(suite: str) -> Reporter | None:
    import testbed.report.suites  # noqa: F401  (registers the built-in reporters)

    return _REPORTERS.get(suite)


def get_campaign_reporter(suite: str) -> CampaignReporter | None:
    import testbed.report.suites  # noqa: F401

    return _CAMPAIGN_REPORTERS.get(suite)


def known_suites() -> list[str]:
    import testbed.report.suites  # noqa: F401

    return sorted(_REPORTERS)
