"""One Chameleon testbed's dealings with its site, held by the provider (not inherited): the names of what it
makes, the connection (python-chi behind :mod:`testbed.providers.chameleon.chi`, imported only when connecting),
one clear message for every failed call, and the pacing of every wait. The lease, release and switch modules take
this object, so they never need the provider.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from testbed import paths
from testbed.errors import TestbedError
from testbed.providers.base import Pacer, Progress
from testbed.providers.chameleon import chi
from testbed.providers.chameleon.chi import HUB_FIX, ApiError
from testbed.providers.chameleon.settings import ChameleonSettings

if TYPE_CHECKING:
    from testbed.providers.chameleon.chi import ApiError, Chi
    from testbed.spec import TestbedSpec
    from testbed.state import Store

BLAZAR_FMT = "%Y-%m-%d %H:%M"
LEASE_JSON_FMT = "%Y-%m-%dT%H:%M:%S.%f"
# Blazar's lease statuses (blazar.status.LeaseStatus): stable PENDING, ACTIVE, TERMINATED, ERROR; transitional
# CREATING, STARTING, UPDATING, TERMINATING, DELETING. A deleted lease is gone (404), never "DELETED".
LEASE_GONE = ("TERMINATED", "TERMINATING", "DELETING")
# nova statuses (nova.api.openstack.common._STATE_MAP) a server being built never leaves by itself
SERVER_STUCK = ("SHUTOFF", "SUSPENDED", "PAUSED", "SHELVED", "SHELVED_OFFLOADED", "RESCUE", "SOFT_DELETED",
                "DELETED")
SSH_PORT = 22
REPORT_EVERY = 30.0  # seconds between "still waiting" progress lines
WARN_BEFORE_END = timedelta(hours=1)
BACKOFF = 1.5  # each poll waits this much longer than the last, up to BACKOFF_CAP x the first
BACKOFF_CAP = 6.0
JITTER = 0.2  # +-20 %: many testbeds polling one site do not fall into step


def _utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _parse_lease_time(value: str) -> datetime:
    """Blazar's lease times (naive UTC): '2026-11-22T01:41:00.000000' or '2026-11-22 01:41'."""
    for fmt in (LEASE_JSON_FMT, "%Y-%m-%dT%H:%M:%S", BLAZAR_FMT, "%Y-%m-%d %H:%M:%S"):
        try:
            return datetime.strptime(value.rstrip("Z"), fmt)
        except ValueError:
            continue
    raise ValueError(f"not a lease time: {value!r}")


def _iso(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def _clock(secs: float) -> str:
    """A duration for progress lines: '45s', '3m 05s', '1h 02m'."""
    secs = int(max(0, secs))
    if secs < 60:
        return f"{secs}s"
    if secs < 3600:
        return f"{secs // 60}m {secs % 60:02d}s"
    return f"{secs // 3600}h {secs % 3600 // 60:02d}m"


def _span(td: timedelta) -> str:
    secs = int(td.total_seconds())
    sign = "-" if secs < 0 else ""
    secs = abs(secs)
    h, m = secs // 3600, (secs % 3600) // 60
    return f"{sign}{h}h {m:02d}m" if h else f"{sign}{m}m"


def auth_fix(kind: str, source: str, site: str) -> str:
    """What to do when the site refuses credentials of auth type ``kind`` (read from ``source``)."""
    if kind == "v3applicationcredential":
        return (f"the application credential ({source}) may have expired or been deleted, or be another "
                f"site's: create one in the {site} dashboard (Identity > Application Credentials) and source "
                "its openrc (or use its clouds.yaml)")
    if kind == "v3oidcpassword":
        return ("check your Chameleon CLI password (the openrc asks for it) and the openrc's OS_USERNAME and "
                f"OS_PROJECT_ID; or create an application credential in the {site} dashboard and source its "
                "openrc")
    if kind == "v3oidcaccesstoken":
        return ("the access token has expired (they last minutes) or the Hub could not renew it: in Chameleon's "
                "JupyterHub, log in again (File > Hub Control Panel > Stop My Server, then start it); "
                "elsewhere, export a fresh OS_ACCESS_TOKEN, or create an application credential in the "
                f"{site} dashboard and source its openrc")
    return f"source a fresh openrc for {site}; credentials belong to one site"


class Cloud:
    """A testbed's view of its Chameleon site: what the lease, release and switch steps need, and nothing else."""

    poll_interval: float = 5.0  # the first pause between status polls; backoff takes it to 30 s (tests lower it)
    destroy_timeout: float = 900.0  # waiting for deletions to finish
    http_timeout: float = 60.0  # every single HTTP request

    def __init__(self, spec: TestbedSpec, store: Store, progress: Progress, recorded: Callable[[], str]):
        self.spec, self.store, self.progress, self.recorded = spec, store, progress, recorded
        self.api: Chi | None = None  # connected once per command (preflight), reused by every step
        self.auth: tuple[str, str] = ("", "")  # the credentials' auth type and where they came from
        self.lease_end_cap: float | None = None  # a new lease ends no later than this (epoch): the testbed's expiry

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        return self.settings.kind

    # names --------------------------------------------------------------------------------------------
    @property
    def settings(self) -> ChameleonSettings:
        p = self.spec.provider
        assert isinstance(p, ChameleonSettings)
        return p

    @property
    def tag(self) -> str:
        """Short hash of the state home: two checkouts in one project never share names."""
        return hashlib.sha256(str(paths.state_home()).encode()).hexdigest()[:6]

    @property
    def prefix(self) -> str:
        return f"tb-{self.name}-{self.tag}"

    @property
    def lease_name(self) -> str:
        return self.prefix

    @property
    def keypair_name(self) -> str:
        return self.prefix

    def host_names(self) -> list[str]:
        return [f"node{i}" for i in range(self.settings.count)]

    def server_name(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    # plumbing -----------------------------------------------------------------------------------------
    def connect(self) -> Chi:
        """Credentials from the environment (a clear error before any request), then python-chi."""
        creds = chi.credentials_from_env(site=self.settings.site)
        self.auth = (creds.auth_type, creds.source)
        return chi.Chi(creds, site=self.settings.site, project=self.settings.project,
                      http_timeout=self.http_timeout)

    def where(self, service: str, thing: str) -> str:
        return f"Chameleon {self.settings.site}, {service}: {thing}"

    def auth_fix(self) -> str:
        kind, source = self.auth
        return auth_fix(kind, source, self.settings.site)

    def error(self, e: ApiError, doing: str, thing: str) -> TestbedError:
        """One clear message for a failed call: what happened, where, what to do."""
        s = self.settings
        m = e.message
        low = m.lower()
        where = self.where(e.service or "API", thing)
        status = f"HTTP {e.status}" if e.status else "no answer"
        after = (f"run 'testbed destroy {self.name}' to release what was made (ids are recorded), "
                 f"or 'testbed provision {self.name}' to retry (what exists is reused)")
        if e.kind == "hub":
            return TestbedError(f"no fresh access token while {doing}: {m}", where=self.where("JupyterHub", thing),
                                fix=HUB_FIX)
        if e.kind == "auth":
            return TestbedError(f"Chameleon refused the credentials while {doing} ({status}: {m})", where=where,
                                fix=self.auth_fix())
        if e.kind == "connect":
            return TestbedError(f"cannot reach Chameleon while {doing}: {m}", where=where,
                                fix="check OS_AUTH_URL and your network connection, then retry")
        if e.kind == "endpoint":
            return TestbedError(f"Chameleon's catalog has no {e.service or 'service'} endpoint for {s.site}: {m}",
                                where=where, fix=f"check that OS_AUTH_URL is the keystone of {s.site} and that "
                                                 "provider.site matches OS_REGION_NAME")
        if "quota" in low or e.status == 413 or "overlimit" in low or "over limit" in low:
            return TestbedError(f"quota exceeded while {doing} ({status}: {m})", where=where,
                                fix=f"{after}; free servers or floating IPs in the project, or ask the PI for a "
                                    "larger quota")
        if "not enough floating ips available" in low:  # blazar's floating IP plugin: none free for the period
            return TestbedError(f"the floating-IP pool is empty for the lease period: Chameleon has no "
                                f"{s.count} reservable floating IPs free then, while {doing} ({status}: {m})",
                                where=where,
                                fix="pick other dates (provider.start/end/hours), or set provider.floating_ips: "
                                    "false (fixed IPs, reachable only from inside Chameleon)")
        if "no more ip addresses" in low:  # neutron: the public network is out of addresses
            return TestbedError(f"the floating-IP pool is empty while {doing} ({status}: {m})", where=where,
                                fix=f"{after}; wait for addresses to free up, or set provider.floating_ips: "
                                    "false (fixed IPs, reachable only from inside Chameleon)")
        if "not enough hosts available" in low or "not enough resources available" in low:
            return TestbedError(f"no {s.count} free {s.node_type} {'node' if s.count == 1 else 'nodes'} for the lease "
                                f"period while {doing} ({status}: {m})", where=where,
                                fix="pick other dates (provider.start/end/hours), fewer nodes or another "
                                    f"node_type (check its spelling); see availability in the {s.site} host "
                                    "calendar")
        if "maximum lease duration" in low:  # Chameleon's enforcement (MaxLeaseDurationFilter)
            return TestbedError(f"the lease is longer than Chameleon allows while {doing} ({status}: {m})",
                                where=where, fix="shorten provider.hours (or start/end) to 7 days at most; "
                                                 f"'testbed extend {self.name}' adds time later")
        if "invalid lease status" in low:  # blazar: the lease is in a transitional status
            return TestbedError(f"Blazar refused {doing}: the lease is changing status (starting, updating or "
                                f"being deleted) ({status}: {m})", where=where,
                                fix="wait a minute and run the command again")
        if e.service == "blazar" and e.status in (400, 403) and "lease" in doing:
            # e.g. Chameleon's allocation check (blazar's ExternalServiceFilter), whose words vary
            return TestbedError(f"Blazar refused {doing} ({status}: {m})", where=where,
                                fix="Chameleon refuses a lease the project's allocation cannot pay for (node-hours "
                                    "x nodes): check its remaining SUs and end date on chameleoncloud.org, or "
                                    "ask for a shorter lease or fewer nodes")
        return TestbedError(f"{doing} failed ({status}: {m})", where=where, fix=after)

    @contextmanager
    def step(self, doing: str, thing: str) -> Iterator[None]:
        """Turn an ApiError inside into one TestbedError naming what was being done to what."""
        try:
            yield
        except ApiError as e:
            raise self.error(e, doing, thing) from None

    def backoff(self, deadline: float) -> Pacer:
        """The pauses of one wait that ends at ``deadline`` (monotonic)."""
        return Pacer(self.poll_interval, deadline, cap=self.poll_interval * BACKOFF_CAP, multiplier=BACKOFF,
                     jitter=JITTER)

