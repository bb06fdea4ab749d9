"""The look-up of a suite's built-in reporter (per run and per campaign), registered with testbed.report.registry.

testbed ships none now: every shipped suite's reporter is its folder's report.py (testbed.results); these
look-ups stay for a reporter registered in the package by a plug-in."""

from __future__ import annotations

from testbed.report import registry


def get_reporter(suite: str) -> registry.Reporter | None:
    """The run reporter registered for ``suite`` (None: the generic report)."""
    return registry._REPORTERS.get(suite)


def get_campaign_reporter(suite: str) -> registry.CampaignReporter | None:
    """The campaign reporter registered for ``suite`` (None: a table of its runs)."""
    return registry._CAMPAIGN_REPORTERS.get(suite)


def known_suites() -> list[str]:
    """The suites with a built-in run reporter."""
    return sorted(registry._REPORTERS)
