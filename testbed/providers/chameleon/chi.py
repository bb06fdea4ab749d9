"""The one place that talks to python-chi: credentials, a quiet context, calls that return plain dicts.

python-chi is imported lazily (``Chi()``), its ``print()`` chatter and library logging are kept off the
terminal, and it is configured explicitly from the OpenStack environment (never ``use_site()``, which does an
un-timed lookup on the internet). Where chi's object API hides an id or an error (``Server.submit`` drops the
created server, ``create_lease`` swallows Blazar's message) the call goes through chi's own clients instead.
Every failure leaves here as :class:`ApiError` (status + the service's own message); the provider decides
what it means for the user. Credentials are held only in memory and never appear in a message.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn
from urllib.parse import quote

from testbed.errors import TestbedError, require_extra

EXTRA = "chameleon"  # the pip extra that brings python-chi and python-blazarclient (pyproject.toml)
OPENRC_FIX = ("source your Chameleon openrc: an application credential's (the site's dashboard, Identity > "
              "Application Credentials; OS_AUTH_TYPE=v3applicationcredential) or the project's OpenStack RC file "
              "(Project > API Access; OS_AUTH_TYPE=v3oidcpassword, it asks for your Chameleon CLI password); or set "
              "OS_CLOUD to the application credential's entry in the clouds.yaml the dashboard offers; in "
              "Chameleon's JupyterHub the environment already holds them (v3oidcaccesstoken)")
# Chameleon's JupyterHub (jupyterhub-chameleon) starts each notebook server with OS_AUTH_TYPE=v3oidcaccesstoken and
# OS_ACCESS_TOKEN, a Keycloak access token that expires in minutes; python-chi then asks the Hub for a fresh one
# (GET $JUPYTERHUB_API_URL/users/$JUPYTERHUB_USER with $JUPYTERHUB_API_TOKEN: auth_state.access_token), as here
HUB_VARS = ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_USER")
HUB_TIMEOUT = 20.0  # seconds for the Hub to answer that request (python-chi's own call waits forever)
HUB_FIX = ("retry in a minute; if it repeats, restart your notebook server so that the Hub logs you in again "
           "(File > Hub Control Panel > Stop My Server, then Start My Server); or export a fresh OS_ACCESS_TOKEN, "
           "or source an application credential's openrc instead")

# python-chi keeps one configuration per process (oslo.config's CONF, its cached keystone session, the Hub's
# settings), ``quiet`` swaps sys.stdout and ``_no_os_env`` os.environ: every configuration and every call holds
# this lock, and a Chi whose settings are not the ones in place puts its own back first. Two Chi in one process (a
# run's supervisor queries the provider while its repair creates servers) otherwise reset each other's
# credentials mid-request.
_LOCK = threading.RLock()
_IN_PLACE: list[tuple[object, ...] | None] = [None]  # the settings python-chi holds now

QUIET_LOGGERS = ("chi", "neutronclient", "neutronclient.v2_0.client", "keystoneauth", "keystoneauth1",
                 "openstack", "blazarclient", "novaclient", "glanceclient", "keystoneclient", "stevedore",
                 "oslo_config", "urllib3")

# keystoneauth option -> the OS_* variable an openrc sets it with, per auth type: (option, variable, required)
AUTH_VARS: dict[str, list[tuple[str, str, bool]]] = {
    "v3applicationcredential": [("application_credential_id", "OS_APPLICATION_CREDENTIAL_ID", True),
                                ("application_credential_secret", "OS_APPLICATION_CREDENTIAL_SECRET", True)],
    "v3oidcpassword": [("username", "OS_USERNAME", True), ("password", "OS_PASSWORD", True),
                       ("identity_provider", "OS_IDENTITY_PROVIDER", True), ("protocol", "OS_PROTOCOL", True),
                       ("client_id", "OS_CLIENT_ID", True), ("client_secret", "OS_CLIENT_SECRET", False),
                       ("discovery_endpoint", "OS_DISCOVERY_ENDPOINT", False),
                       ("access_token_endpoint", "OS_ACCESS_TOKEN_ENDPOINT", False),
                       ("access_token_type", "OS_ACCESS_TOKEN_TYPE", False), ("scope", "OS_OPENID_SCOPE", False)],
    "v3password": [("username", "OS_USERNAME", True), ("password", "OS_PASSWORD", True),
                   ("user_domain_name", "OS_USER_DOMAIN_NAME", False),
                   ("user_domain_id", "OS_USER_DOMAIN_ID", False)],
    "v3token": [("token", "OS_TOKEN", True)],
    "v3oidcaccesstoken": [("access_token", "OS_ACCESS_TOKEN", True),
                          ("identity_provider", "OS_IDENTITY_PROVIDER", True), ("protocol", "OS_PROTOCOL", True)],
}
# a token for these must name its project (an application credential carries its own and may not ask for one)
SCOPED = ("v3oidcpassword", "v3password", "v3token", "v3oidcaccesstoken")
SCOPE_VARS = [("project_id", "OS_PROJECT_ID"), ("project_name", "OS_PROJECT_NAME"),
              ("project_domain_name", "OS_PROJECT_DOMAIN_NAME"), ("project_domain_id", "OS_PROJECT_DOMAIN_ID")]
AUTH_ALIASES = {"password": "v3password", "applicationcredential": "v3applicationcredential",
                "v3applicationcredential": "v3applicationcredential", "token": "v3token",
                "v3oidcpassword": "v3oidcpassword", "oidcpassword": "v3oidcpassword",
                "v3oidcaccesstoken": "v3oidcaccesstoken", "oidcaccesstoken": "v3oidcaccesstoken"}


@dataclass(repr=False)
class Credentials:
    """What the OpenStack environment says about how to log in (secrets in ``fields``, never printed)."""

    auth_url: str
    auth_type: str
    region: str | None
    fields: dict[str, str] = field(default_factory=dict)
    source: str = "environment (OS_* variables)"
    hub: dict[str, str] = field(default_factory=dict)  # JupyterHub's API (HUB_VARS) that renews an access token

    def __repr__(self) -> str:  # never show secrets, even in a debugger or a traceback
        return f"Credentials(auth_url={self.auth_url!r}, auth_type={self.auth_type!r}, region={self.region!r})"


def _v3(url: str) -> str:
    """Keystone's v3 root: an auth URL without its version (as clouds.yaml files give it) gets /v3."""
    url = url.rstrip("/")
    return url if re.search(r"/v3$", url) else url + "/v3"


def _from_clouds_yaml(name: str, env: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """OS_* style values from the clouds.yaml entry ``name`` (openstacksdk's search path, secure.yaml merged)."""
    require_extra("openstack", EXTRA, "OS_CLOUD (openstacksdk reads clouds.yaml)")
    from openstack import exceptions as os_exc
    from openstack.config import loader

    files = list(loader.CONFIG_FILES)
    secure = list(loader.SECURE_FILES)
    if env.get("OS_CLIENT_CONFIG_FILE"):
        files.insert(0, env["OS_CLIENT_CONFIG_FILE"])
    if env.get("OS_CLIENT_SECURE_FILE"):
        secure.insert(0, env["OS_CLIENT_SECURE_FILE"])
    searched = env.get("OS_CLIENT_CONFIG_FILE") or "clouds.yaml (./, ~/.config/openstack/, /etc/openstack/)"
    try:
        with warnings.catch_warnings():  # openstacksdk's deprecation notices are not the user's business
            warnings.simplefilter("ignore")
            cfg = loader.OpenStackConfig(config_files=files, secure_files=secure, load_envvars=False)
            region = cfg.get_one(cloud=name)
    except os_exc.ConfigException as e:
        loaded = locals().get("cfg")
        found = getattr(loaded, "config_filename", None)
        known = sorted(k for k in (getattr(loaded, "cloud_config", None) or {}).get("clouds", {})
                       if k not in ("defaults", "envvars")) if found else []
        raise TestbedError(f"OS_CLOUD={name}: {e}" + ("" if found else " (no clouds.yaml found)"),
                           where=found or searched,
                           fix=(f"set OS_CLOUD to one of {', '.join(known)}" if known else
                                "download clouds.yaml with a new application credential (Identity > Application "
                                "Credentials) to ~/.config/openstack/, or unset OS_CLOUD and source an openrc")
                           ) from None
    conf = region.config
    where = cfg.config_filename or searched
    out = {"OS_AUTH_TYPE": str(conf.get("auth_type") or ""), "OS_REGION_NAME": str(conf.get("region_name") or "")}
    for k, v in (conf.get("auth") or {}).items():
        if v not in (None, ""):
            out["OS_" + k.upper()] = str(v)
    return out, f"{where}: clouds.{name}"


def credentials_from_env(env: Mapping[str, str] | None = None, *, site: str | None = None) -> Credentials:
    """Read credentials from OS_* variables (or OS_CLOUD's clouds.yaml entry); a clear TestbedError, before any
    network call, when they are missing or of a kind testbed cannot use."""
    if env is None:
        with _LOCK:  # not while a configuration hides the OS_* variables
            env = dict(os.environ)
    source = "environment (OS_* variables)"
    hub = {k: (env.get(k) or "").strip() for k in HUB_VARS}
    hub = hub if all(hub.values()) else {}  # inside Chameleon's JupyterHub: the Hub renews the access token
    cloud = (env.get("OS_CLOUD") or "").strip()
    if cloud:
        env, source = _from_clouds_yaml(cloud, env)

    def get(k: str) -> str:
        return (env.get(k) or "").strip()

    raw_type = get("OS_AUTH_TYPE") or get("OS_AUTH_METHOD")
    if not raw_type:
        raw_type = "v3password" if get("OS_USERNAME") else "v3applicationcredential"  # the preferred one
    auth_type = AUTH_ALIASES.get(raw_type, raw_type)
    if auth_type not in AUTH_VARS:
        raise TestbedError(f"Chameleon credentials of type '{raw_type}' are not supported",
                           where=f"{source}: OS_AUTH_TYPE",
                           fix=f"use an application credential or the v3oidcpassword openrc: {OPENRC_FIX}")
    needed = [] if get("OS_AUTH_URL") else ["OS_AUTH_URL"]
    fields: dict[str, str] = {}
    for opt, var, required in AUTH_VARS[auth_type]:
        if get(var):
            fields[opt] = get(var)
        elif required and not (var == "OS_ACCESS_TOKEN" and hub):
            needed.append(var)
    if auth_type == "v3oidcpassword" and not (get("OS_DISCOVERY_ENDPOINT") or get("OS_ACCESS_TOKEN_ENDPOINT")):
        needed.append("OS_DISCOVERY_ENDPOINT")
    if auth_type in SCOPED:
        if not (get("OS_PROJECT_ID") or get("OS_PROJECT_NAME")):
            needed.append("OS_PROJECT_ID")
        fields.update({opt: get(var) for opt, var in SCOPE_VARS if get(var)})
        if "project_name" in fields and not ("project_domain_name" in fields or "project_domain_id" in fields):
            fields["project_domain_name"] = "chameleon"  # Chameleon's projects live in the 'chameleon' domain
        if auth_type == "v3password" and not ("user_domain_name" in fields or "user_domain_id" in fields):
            fields["user_domain_name"] = "Default"
    if needed:
        hint = (" (the openrc asks for your Chameleon CLI password when sourced in a terminal; a script that "
                "sources it gets none)" if needed == ["OS_PASSWORD"] and auth_type == "v3oidcpassword" else
                " (Chameleon's JupyterHub sets it; outside a Chameleon notebook, JUPYTERHUB_API_URL, "
                "JUPYTERHUB_API_TOKEN and JUPYTERHUB_USER let testbed ask the Hub for it)"
                if "OS_ACCESS_TOKEN" in needed else "")
        raise TestbedError(f"no Chameleon credentials: {', '.join(needed)} not set (auth type {auth_type}){hint}",
                           where=source, fix=OPENRC_FIX)
    region = get("OS_REGION_NAME") or None
    if site and region and region != site:
        raise TestbedError(f"the OpenStack credentials are for {region} but the testbed asks for {site}",
                           where=f"OS_REGION_NAME ({source}) / inventories provider.site",
                           fix=f"use the openrc or clouds.yaml of {site} (credentials belong to one site), or set "
                               f"provider.site: {region}")
    if auth_type == "v3oidcaccesstoken" and hub:
        source += f"; the access token renewed by JupyterHub ({hub['JUPYTERHUB_API_URL']})"
    return Credentials(auth_url=_v3(get("OS_AUTH_URL")), auth_type=auth_type, region=region or site,
                       fields=fields, source=source, hub=hub if auth_type == "v3oidcaccesstoken" else {})


class _HubFailures:
    """What went wrong in the last renewals of the access token (python-chi logs a failed renewal and goes on with
    no token, so keystone's refusal would hide it): numbered, so that a call can tell whether one happened during
    it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.last = ""

    def add(self, why: str) -> None:
        with self.lock:
            self.count += 1
            self.last = why


HUB_FAILURES = _HubFailures()


def hub_refresher(hub: Mapping[str, str]) -> Callable[[], tuple[str, Any]]:
    """python-chi's ``chi.jupyterhub.refresh_access_token`` for the Hub in ``hub`` (HUB_VARS), with a timeout:
    ``GET $JUPYTERHUB_API_URL/users/$JUPYTERHUB_USER`` -> (auth_state.access_token, auth_state.expires_at). A
    failure is recorded in HUB_FAILURES, then raised (python-chi catches it)."""
    import requests

    api = (hub.get("JUPYTERHUB_API_URL") or "").rstrip("/")
    url = f"{api}/users/{quote(hub.get('JUPYTERHUB_USER') or '', safe='')}"

    failed_at, failed_why = -HUB_TIMEOUT, ""  # the Hub's last failure: python-chi asks again at once, several times

    def fail(why: str) -> NoReturn:
        nonlocal failed_at, failed_why
        failed_at, failed_why = time.monotonic(), why
        HUB_FAILURES.add(why)
        raise ApiError(None, why, service="JupyterHub", kind="hub")

    def refresh() -> tuple[str, Any]:
        if not hub:  # not in a JupyterHub: the token given is the only one (keystone says if it expired)
            raise ApiError(None, "no JupyterHub to renew the access token", service="JupyterHub", kind="hub")
        if time.monotonic() - failed_at < HUB_TIMEOUT:  # one wait per failure, not one per question
            fail(failed_why)
        try:
            res = requests.get(url, headers={"Authorization": f"token {hub['JUPYTERHUB_API_TOKEN']}"},
                               timeout=(HUB_TIMEOUT, HUB_TIMEOUT))
        except requests.Timeout:
            fail(f"JupyterHub at {api} did not answer within {HUB_TIMEOUT:g} s when asked for a fresh access token")
        except requests.RequestException as e:
            fail(f"cannot reach JupyterHub at {api} for a fresh access token: {type(e).__name__}")
        if res.status_code != 200:
            fail(f"JupyterHub at {api} refused to renew the access token (HTTP {res.status_code})")
        try:
            state = dict(res.json().get("auth_state") or {})
        except (ValueError, AttributeError, TypeError):
            state = {}
        if not state.get("access_token"):
            fail(f"JupyterHub at {api} gave no access token (the user's auth_state has none)")
        return str(state["access_token"]), state.get("expires_at")

    return refresh


class ApiError(Exception):
    """A failed cloud call: HTTP status (None: no answer) and the service's own message."""

    def __init__(self, status: int | None, message: str, *, service: str = "", kind: str = ""):
        super().__init__(message)
        self.status = status
        self.message = message
        self.service = service
        self.kind = kind  # "connect", "auth", "endpoint", "hub" (JupyterHub did not renew the token), ""


def _explain(exc: BaseException) -> ApiError:
    """Turn any client library's exception into an ApiError (status, message)."""
    if isinstance(exc, ApiError):
        return exc
    mod = type(exc).__module__
    name = type(exc).__name__
    status: int | None = None
    for attr in ("http_status", "status_code", "code"):
        v = getattr(exc, attr, None)
        if isinstance(v, int) and 100 <= v < 600:
            status = v
            break
    kwargs = getattr(exc, "kwargs", None)
    if isinstance(kwargs, dict) and isinstance(kwargs.get("code"), int):
        status = kwargs["code"]  # blazarclient keeps the real code there
    msg = ""
    for attr in ("details", "message"):
        v = vars(exc).get(attr)  # instance values only: blazarclient's class-level 'message' is a template
        if isinstance(v, str) and v.strip():
            msg = v.strip()
            break
    resp = getattr(exc, "response", None)  # an OpenID Connect provider's refusal: {"error", "error_description"}
    try:
        body = resp.json() if resp is not None else None
    except Exception:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        msg = f"{body['error']}: {body.get('error_description') or ''}".strip(": ")
    msg = msg or str(exc).strip() or name
    if msg.startswith("ERROR: "):
        msg = msg[len("ERROR: "):]
    kind = ""
    if "keystoneauth1" in mod or "requests" in mod or "urllib3" in mod:
        if name in ("ConnectFailure", "ConnectTimeout", "ConnectionError", "SSLError", "UnknownConnectionError",
                    "RetriableConnectionFailure", "ConnectionRefused"):
            kind = "connect"
        elif name in ("EndpointNotFound", "EmptyCatalog"):
            kind = "endpoint"
        elif name in ("Unauthorized", "AuthorizationFailure", "MissingAuthPlugin", "NoMatchingPlugin",
                      "InvalidOidcDiscoveryDocument", "OidcAccessTokenEndpointNotFound", "OidcPluginNotSupported",
                      "OidcGrantTypeMissmatch"):
            kind = "auth"
    if name in ("ConnectTimeout", "ReadTimeout", "Timeout") or "timed out" in msg.lower():
        kind = kind or "connect"
    if status == 401:
        kind = "auth"
    return ApiError(status, " ".join(msg.split())[:400], kind=kind)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Keep python-chi's print() chatter and library warnings off the user's terminal."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def _no_os_env() -> Iterator[None]:
    """OS_* variables hidden from this process's environment for a moment (python-chi reads them as defaults)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("OS_")}
    try:
        for k in saved:
            del os.environ[k]
        yield
    finally:
        os.environ.update(saved)


def _silence_loggers() -> None:
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _as_dict(obj: Any) -> dict[str, Any]:
    if isinstance(obj, dict):
        return obj
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    return dict(getattr(obj, "_info", {}) or {})


class Chi:
    """python-chi configured for one site from explicit credentials; every method returns plain data."""

    def __init__(self, creds: Credentials, *, site: str, project: str | None = None, http_timeout: float = 60):
        require_extra("chi", EXTRA, "the chameleon provider (python-chi)")
        fields = dict(creds.fields)
        if project and creds.auth_type in SCOPED:  # provider.project names the project to work in
            for k in ("project_id", "project_domain_id"):
                fields.pop(k, None)
            fields["project_name"] = project
            fields.setdefault("project_domain_name", "chameleon")
        self._options: list[tuple[str, Any]] = [
            ("auth_type", creds.auth_type), ("auth_url", creds.auth_url), ("region_name", creds.region or site),
            ("interface", "public"), ("timeout", int(max(1, http_timeout))), *fields.items()]
        self._hub = dict(creds.hub)
        self._settings = (*self._options, *sorted(self._hub.items()))
        self._refresh = hub_refresher(creds.hub)
        with _LOCK:
            _silence_loggers()
            with quiet():
                import chi  # lazy: ~1.3 s, and it reads OS_* at import
                import chi.context
                import chi.jupyterhub
                import chi.lease
                import chi.network
                import chi.server
            self.chi = chi
            self._configure()
        self.site = site
        self.region = creds.region or site
        self.auth_url = creds.auth_url

    def _configure(self) -> None:
        """Put this Chi's settings in python-chi's global context (the caller holds ``_LOCK``)."""
        chi = self.chi
        with quiet():
            with _no_os_env():  # forget what it read at import time: only ``creds`` below, no stray OS_* value
                chi.context.reset()  # (an OS_PROJECT_ID beside an application credential makes keystone refuse)
            for k, v in self._options:
                chi.set(k, v)
            # python-chi renews a v3oidcaccesstoken from JupyterHub when it knows the Hub (read at its import)
            chi.jupyterhub.hub_api_url = self._hub.get("JUPYTERHUB_API_URL") or None
            chi.jupyterhub.hub_token = self._hub.get("JUPYTERHUB_API_TOKEN") or None
            # its renewal, with a timeout and a failure that is not lost (always replaced: python-chi patches the
            # access-token plugin's class, so an earlier Chi's renewal would otherwise live on)
            chi.jupyterhub.refresh_access_token = self._refresh
        _silence_loggers()  # importing the clients may have reset levels
        _IN_PLACE[0] = self._settings

    @contextlib.contextmanager
    def call(self, service: str) -> Iterator[None]:
        """Run chi code quietly; any failure leaves as ApiError tagged with ``service`` (or as the Hub's failure,
        when the access token could not be renewed during the call)."""
        with _LOCK:
            if _IN_PLACE[0] != self._settings:
                self._configure()
            hub_failures = HUB_FAILURES.count
            try:
                with quiet():
                    yield
            except KeyboardInterrupt:
                raise
            except Exception as e:
                if HUB_FAILURES.count != hub_failures:  # the real cause: keystone only saw no token
                    raise ApiError(None, HUB_FAILURES.last, service="JupyterHub", kind="hub") from None
                if isinstance(e, ApiError):
                    raise
                err = _explain(e)
                err.service = service
                raise err from None

    # leases (blazar) ------------------------------------------------------------------------------
    def lease_get(self, lease_id: str) -> dict[str, Any] | None:
        try:
            with self.call("blazar"):
                return dict(self.chi.blazar().lease.get(lease_id))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def leases_named(self, name: str) -> list[dict[str, Any]]:
        with self.call("blazar"):
            return [dict(x) for x in self.chi.blazar().lease.list() if x.get("name") == name]

    def lease_create(self, name: str, *, start: str, end: str, node_type: str, count: int,
                     fips: int) -> dict[str, Any]:
        """POST /leases: a node reservation (and ``fips`` reserved floating IPs); returns the lease."""
        with self.call("blazar"):
            reservations: list[dict[str, Any]] = []
            self.chi.lease.add_node_reservation(reservations, count=count, node_type=node_type)
            if fips:
                self.chi.lease.add_fip_reservation(reservations, count=fips)
            return dict(self.chi.blazar().lease.create(name=name, start=start, end=end,
                                                       reservations=reservations, events=[]))

    def lease_set_end(self, lease_id: str, end: str) -> dict[str, Any]:
        """PUT /leases/{id} with a new end_date ('YYYY-MM-DD HH:MM', UTC)."""
        with self.call("blazar"):
            return dict(self.chi.blazar().lease.update(lease_id, end_date=end))

    def lease_delete(self, lease_id: str) -> bool:
        """True when a delete was sent, False when it was already gone."""
        try:
            with self.call("blazar"):
                self.chi.blazar().lease.delete(lease_id)
                return True
        except ApiError as e:
            if e.status == 404:
                return False
            raise

    # key pairs, servers (nova) --------------------------------------------------------------------
    def keypair_ensure(self, name: str, public_key: str) -> None:
        with self.call("nova"):
            self.chi.server.update_keypair(key_name=name, public_key=public_key)

    def keypair_delete(self, name: str) -> bool:
        try:
            with self.call("nova"):
                self.chi.nova().keypairs.delete(name)
                return True
        except ApiError as e:
            if e.status == 404:
                return False
            raise

    def server_create(self, name: str, *, reservation_id: str | None, image: str, flavor: str, key_name: str,
                      network: str) -> str:
        """POST /servers on the reservation; returns the new server's id at once (no waiting)."""
        with self.call("nova"):
            args = self.chi.server.instance_create_args(
                reservation_id, name=name, image=image, flavor=flavor, key=key_name,
                net_ids=[self.chi.network.get_network_id(network)])
            created = self.chi.connection().compute.create_server(**args)
            return str(created.id)

    def server_get(self, server_id: str) -> dict[str, Any] | None:
        try:
            with self.call("nova"):
                return _as_dict(self.chi.nova().servers.get(server_id))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def servers_named(self, prefix: str) -> list[dict[str, Any]]:
        with self.call("nova"):
            return [_as_dict(s) for s in self.chi.nova().servers.list() if s.name.startswith(prefix)]

    def server_delete(self, server_id: str) -> bool:
        try:
            with self.call("nova"):
                self.chi.nova().servers.delete(server_id)
                return True
        except ApiError as e:
            if e.status == 404:
                return False
            raise

    # images (nova createImage, glance v2) ---------------------------------------------------------------
    def server_create_image(self, server_id: str, name: str, metadata: dict[str, str]) -> str:
        """POST /servers/{id}/action createImage: the new image's id (novaclient reads it from the body at
        microversion 2.45 and later, from the Location header before); the image is still queued."""
        with self.call("nova"):
            return str(self.chi.nova().servers.create_image(server_id, name, metadata))

    def image_get(self, image_id: str) -> dict[str, Any] | None:
        """GET /v2/images/{id}; None when it is gone (404)."""
        try:
            with self.call("glance"):
                return dict(self.chi.glance().images.get(image_id))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def image_delete(self, image_id: str) -> bool:
        """True when a delete was sent, False when it was already gone."""
        try:
            with self.call("glance"):
                self.chi.glance().images.delete(image_id)
                return True
        except ApiError as e:
            if e.status == 404:
                return False
            raise

    # floating IPs (neutron) -----------------------------------------------------------------------
    def fips(self, **filters: str) -> list[dict[str, Any]]:
        with self.call("neutron"):
            return list(self.chi.neutron().list_floatingips(**filters)["floatingips"])

    def fip_get(self, fip_id: str) -> dict[str, Any] | None:
        try:
            with self.call("neutron"):
                return dict(self.chi.neutron().show_floatingip(fip_id)["floatingip"])
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def fip_allocate(self, description: str) -> dict[str, Any]:
        """POST /floatingips from the 'public' network (not reserved; released by ``fip_delete``)."""
        with self.call("neutron"):
            net = self.chi.network.get_network_id(self.chi.network.PUBLIC_NETWORK)
            return dict(self.chi.neutron().create_floatingip(
                {"floatingip": {"floating_network_id": net, "description": description}})["floatingip"])

    def fip_bind(self, fip_id: str, server_id: str) -> dict[str, Any]:
        """Bind the floating IP to the server's first port (PUT /floatingips/{id})."""
        with self.call("neutron"):
            ports = self.chi.neutron().list_ports(device_id=server_id)["ports"]
            if not ports:
                raise ApiError(None, f"server {server_id} has no network port yet")
            return dict(self.chi.neutron().update_floatingip(
                fip_id, {"floatingip": {"port_id": ports[0]["id"]}})["floatingip"])

    def fip_delete(self, fip_id: str) -> bool:
        """DELETE /floatingips/{id} (not chi's Server.delete(), which leaks them); False when already gone."""
        try:
            with self.call("neutron"):
                self.chi.neutron().delete_floatingip(fip_id)
                return True
        except ApiError as e:
            if e.status == 404:
                return False
            raise


    # keystone: who the credentials are, and the project's quotas (testbed check) --------------------------
    def whoami(self) -> dict[str, Any]:
        """Log in (keystone issues a token for the credentials): the user, the project and when the token ends."""
        with self.call("keystone"):
            adapter = self.chi.session()
            sess = getattr(adapter, "session", adapter)
            access = sess.auth.get_access(sess)
            return {"user": access.username or access.user_id, "user_id": access.user_id,
                    "project": access.project_name, "project_id": access.project_id,
                    "expires": access.expires.strftime("%Y-%m-%dT%H:%M:%SZ") if access.expires else None}

    def quotas(self, project_id: str) -> dict[str, tuple[int, int]]:
        """What the project holds and may hold (used, limit; -1: no limit): nova's instances and cores, neutron's
        floating IPs."""
        out: dict[str, tuple[int, int]] = {}
        with self.call("nova"):
            absolute = {x.name: x.value for x in self.chi.nova().limits.get().absolute}
        for name, used, limit in (("instances", "totalInstancesUsed", "maxTotalInstances"),
                                  ("cores", "totalCoresUsed", "maxTotalCores")):
            if limit in absolute:
                out[name] = (int(absolute.get(used) or 0), int(absolute[limit]))
        with self.call("neutron"):
            fip = self.chi.neutron().show_quota_details(project_id)["quota"].get("floatingip") or {}
        if "limit" in fip:
            out["floating IPs"] = (int(fip.get("used") or 0), int(fip["limit"]))
        return out

    # keystone: endpoints and application credentials (the dead-man's switch) ----------------------------
    def endpoint(self, service_type: str) -> str:
        """The public endpoint of ``service_type`` in this region, from the token's catalog."""
        with self.call("keystone"):
            url = self.chi.session().get_endpoint(service_type=service_type, interface="public",
                                                  region_name=self.region)
        if not url:
            raise ApiError(None, f"no {service_type} endpoint in the catalog", service="keystone", kind="endpoint")
        return str(url).rstrip("/")

    def _users_url(self) -> str:
        with self.call("keystone"):
            uid = self.chi.session().get_user_id()
        return f"{self.endpoint('identity')}/users/{uid}/application_credentials"

    def app_cred_get(self, cred_id: str) -> dict[str, Any] | None:
        """GET one of the user's application credentials (None: not found)."""
        try:
            with self.call("keystone"):
                r = self.chi.session().get(f"{self._users_url()}/{cred_id}")
                return dict(r.json()["application_credential"])
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def app_cred_create(self, name: str, *, access_rules: list[dict[str, str]], expires_at: str,
                        description: str) -> dict[str, Any]:
        """POST /v3/users/{me}/application_credentials: a restricted credential with these access rules; the
        answer holds its secret (shown once by keystone, never stored by testbed)."""
        body = {"application_credential": {"name": name, "description": description, "expires_at": expires_at,
                                           "unrestricted": False, "access_rules": access_rules}}
        with self.call("keystone"):
            r = self.chi.session().post(self._users_url(), json=body)
            return dict(r.json()["application_credential"])

    def app_cred_delete(self, cred_id: str) -> bool:
        """DELETE an application credential; False when it was already gone."""
        try:
            with self.call("keystone"):
                self.chi.session().delete(f"{self._users_url()}/{cred_id}")
                return True
        except ApiError as e:
            if e.status == 404:
                return False
            raise
