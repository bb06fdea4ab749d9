"""``testbed check chameleon``: whether this provider can be used from here (see :mod:`testbed.providers.usable`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from testbed.errors import TestbedError
from testbed.providers.chameleon import chi as chameleon_chi
from testbed.providers.chameleon.chi import HUB_FIX
from testbed.providers.chameleon.cloud import auth_fix
from testbed.providers.chameleon.provider import snapshots
from testbed.providers.chameleon.settings import ChameleonSettings
from testbed.providers.usable import HTTP_TIMEOUT, Report, extra_installed

if TYPE_CHECKING:
    from testbed.spec import TestbedSpec


def check(rep: Report, spec: TestbedSpec | None, quotas: bool) -> None:
    settings = spec.provider if spec is not None else None
    assert settings is None or isinstance(settings, ChameleonSettings)
    extra = extra_installed(rep)
    try:
        creds = chameleon_chi.credentials_from_env(site=settings.site if settings else None)
    except TestbedError as e:
        rep.failure("credentials", e)
        rep.add("accepted", None, "not checked: no credentials")
        return
    project = (settings.project if settings and settings.project and creds.auth_type in chameleon_chi.SCOPED
               else creds.fields.get("project_name") or creds.fields.get("project_id"))
    rep.add("credentials", True, f"{creds.auth_type} from {creds.source}")
    site = creds.region or (settings.site if settings else "")
    rep.context.update({"auth": creds.auth_type, "auth_url": creds.auth_url, "site": site or "?",
                        "project": project or "the application credential's own"})
    if not site:
        rep.add("site", False, "no site: OS_REGION_NAME is not set", "export OS_REGION_NAME=CHI@UC (or the site "
                "of your credentials), or name a testbed whose spec sets provider.site")
        return
    _chameleon_images(rep, site, settings.flavor if settings else ChameleonSettings().flavor)
    if not extra:
        rep.add("accepted", None, "not checked: python-chi is not installed")
        return
    try:
        api = chameleon_chi.Chi(creds, site=site, project=settings.project if settings else None,
                                http_timeout=HTTP_TIMEOUT)
        me = api.whoami()
    except TestbedError as e:
        rep.failure("accepted", e)
        return
    except chameleon_chi.ApiError as e:
        rep.add("accepted", False, *_keystone_refusal(e, creds, site))
        return
    rep.context.update({"project": f"{me['project']} ({me['project_id']})", "user": str(me["user"])})
    rep.add("accepted", True, f"keystone at {creds.auth_url} issued a token for {me['user']} in project "
                              f"{me['project']}" + (f", valid until {me['expires']}" if me.get("expires") else ""))
    if quotas:
        try:
            held = api.quotas(str(me["project_id"]))
        except chameleon_chi.ApiError as e:
            rep.add("quotas", None, f"not given ({e.service or 'API'}: HTTP {e.status}: {e.message})",
                    required=False)
        else:
            for name, (used, limit) in held.items():
                rep.add(f"quota: {name}", True, f"{used} used of {'no limit' if limit < 0 else limit}",
                        required=False)
    rep.add("allocation", None, "service units are not in the OpenStack APIs: see the project's allocation on "
            "chameleoncloud.org (Blazar refuses a lease it cannot pay for)", required=False)


def _chameleon_images(rep: Report, site: str, flavor: str) -> None:
    """Whether images of a set-up can be baked at ``site`` (from its name and the flavor: no request), as a row
    that never makes the provider unusable."""
    if snapshots(site, flavor):
        rep.add("images", True, f"Nova snapshots a server at {site} (flavor {flavor}): 'testbed image bake' and "
                                "'setup --bake' make a private Glance image through its createImage", required=False)
    else:
        rep.add("images", False, f"{site} is a bare-metal site (flavor {flavor}): its nodes (Ironic) have no Nova "
                                 "snapshot, so 'testbed image bake' and 'setup --bake' are refused there",
                "on a node, 'sudo cc-snapshot NAME' makes a Glance image (testbed ssh TESTBED HOST first; it asks "
                "for your Chameleon password); boot from it with provider.image: NAME; or rely on the content "
                "address: an unchanged set-up is skipped", required=False)


def _keystone_refusal(e: chameleon_chi.ApiError, creds: chameleon_chi.Credentials, site: str) -> tuple[str, str]:
    """(detail, fix) of a failed login."""
    status = f"HTTP {e.status}" if e.status else "no answer"
    if e.kind == "hub":  # JupyterHub did not renew the access token: keystone never saw one
        return e.message, HUB_FIX
    if e.kind == "auth":
        return f"refused by keystone at {creds.auth_url} ({status}: {e.message})", auth_fix(creds.auth_type,
                                                                                          creds.source, site)
    if e.kind == "connect":
        return (f"cannot reach keystone at {creds.auth_url}: {e.message}",
                "check OS_AUTH_URL and the network connection, then run 'testbed check chameleon' again")
    if e.kind == "endpoint":
        return (f"the token's catalog has no endpoint for {site}: {e.message}",
                "check that OS_REGION_NAME (or provider.site) is the site of these credentials")
    return f"keystone failed to issue a token ({status}: {e.message})", "retry; if it repeats, check status at " \
                                                                       "chameleoncloud.org"
