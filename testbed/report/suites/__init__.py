"""Built-in suite reporters (per run and per campaign), registered on import, and the look-up of any reporter."""

from __future__ import annotations

from testbed.report import registry
from testbed.report.suites import (  # noqa: F401
    datastall,
    datastall_campaign,
)


def get_reporter(suite: str) -> registry.Reporter | None:
    """The run reporter registered for ``suite`` (None: the generic report)."""
    return registry._REPORTERS.get(suite)


def get_campaign_reporter(suite: str) -> registry.CampaignReporter | None:
    """The campaign reporter registered for ``suite`` (None: a table of its runs)."""
    return registry._CAMPAIGN_REPORTERS.get(suite)


def known_suites() -> list[str]:
    """The suites with a run reporter."""
    return sorted(registry._REPORTERS)
