"""Whether each provider can be used from here (``testbed check``, as SkyPilot's ``sky check``).

Per provider kind: its extra installed, credentials found (and where), accepted by the service's own auth
endpoint when it answers (a Keystone token for Chameleon, one authenticated list call for the TPU API), the
project, region, zone or allocation in use, and quotas where the API gives them; for the local provider root,
its tools and network namespaces. Every row says what was checked; a row that could not be checked says why and
counts as not ok. Nothing here writes state or prints: it returns :class:`Report` records for the CLI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from testbed.distribution import install_command
from testbed.errors import TestbedError, has_module
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.spec import TestbedSpec
    from testbed.state import Store

KINDS = ("local", "lab", "chameleon", "gcp-tpu", "slurm")
HTTP_TIMEOUT = 15.0  # one auth or list request of a check
EXTRAS = {"chameleon": ("chameleon", ("chi", "blazarclient", "openstack"), "python-chi"),
          "gcp-tpu": ("tpu", ("google.cloud.tpu_v2", "google.auth"), "google-cloud-tpu")}
"""kind -> (the extra's name, the modules it brings, the distribution whose version is shown)."""


@dataclass
class Row:
    """One thing checked: ``ok`` None means it could not be checked (``detail`` says why)."""

    check: str
    ok: bool | None
    detail: str
    fix: str = ""
    required: bool = True  # a required row that is not ok makes the provider unusable

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "ok": self.ok, "required": self.required, "detail": self.detail,
                "fix": self.fix}


@dataclass
class Report:
    """What was checked for one provider (for one testbed's settings when ``testbed`` is set)."""

    provider: str
    testbed: str | None = None
    rows: list[Row] = field(default_factory=list)
    context: dict[str, str] = field(default_factory=dict)  # site, region, project, zone, auth type, ...

    @property
    def usable(self) -> bool:
        return all(r.ok is True for r in self.rows if r.required)

    @property
    def failed(self) -> Row | None:
        """The first required row that is not ok."""
        return next((r for r in self.rows if r.required and r.ok is not True), None)

    def add(self, check: str, ok: bool | None, detail: str, fix: str = "", *, required: bool = True) -> Row:
        row = Row(check, ok, detail, fix if ok is not True else "", required)
        self.rows.append(row)
        return row

    def failure(self, check: str, e: TestbedError) -> Row:
        return self.add(check, False, e.what, e.fix or "")

    def to_json(self) -> dict[str, Any]:
        bad = self.failed
        return {"provider": self.provider, "testbed": self.testbed, "usable": self.usable,
                "reason": f"{bad.check}: {bad.detail}" if bad else None, "fix": bad.fix if bad else None,
                "context": self.context, "checks": [r.to_json() for r in self.rows]}


def check(kind: str, spec: TestbedSpec | None = None, *, quotas: bool = True) -> Report:
    """Check provider ``kind`` with ``spec``'s settings (None: the provider's defaults and the environment)."""
    fn = {"local": _local, "lab": _lab, "chameleon": _chameleon, "gcp-tpu": _tpu, "slurm": _slurm}[kind]
    rep = Report(kind, spec.name if spec else None)
    fn(rep, spec, quotas)
    return rep


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return f"{dist} {metadata.version(dist)}"
    except metadata.PackageNotFoundError:
        return dist


def _extra(rep: Report) -> bool:
    extra, modules, dist = EXTRAS[rep.provider]
    missing = [m for m in modules if not has_module(m)]
    if missing:
        rep.add("extra", False, f"the '{extra}' extra is not installed (no module {', '.join(missing)})",
                f"{install_command(extra)} (in the environment testbed runs from)")
        return False
    rep.add("extra", True, f"'{extra}' installed ({_version(dist)})")
    return True


# local, lab -------------------------------------------------------------------------------------------------
def _local(rep: Report, spec: TestbedSpec | None, quotas: bool) -> None:
    from testbed.providers.local.provider import REQUIRED_TOOLS

    linux = sys.platform.startswith("linux")
    rep.add("linux", linux, sys.platform, "the local provider needs Linux (network namespaces)")
    root = os.geteuid() == 0
    rep.add("root", root, "running as root" if root else f"running as uid {os.geteuid()}",
            "run as root (sudo -E testbed ...): namespaces, mounts and veth links need it")
    missing = {t: p for t, p in REQUIRED_TOOLS.items() if shutil.which(t) is None}
    rep.add("tools", not missing, ", ".join(sorted(REQUIRED_TOOLS)) + " on PATH" if not missing else
            f"missing: {', '.join(missing)}", f"apt-get install -y {' '.join(sorted(set(missing.values())))}")
    sshd = "/usr/sbin/sshd"
    has_sshd = os.access(sshd, os.X_OK)
    rep.add("sshd", has_sshd, sshd if has_sshd else f"no executable {sshd}", "apt-get install -y openssh-server")
    if not (linux and root and shutil.which("unshare")):
        rep.add("network namespaces", None, "not checked: needs Linux, root and unshare")
        return
    try:  # a namespace made and dropped at once: what each local host gets, without leaving anything
        r = subprocess.run(["unshare", "--net", "--mount", "--", "true"], capture_output=True, text=True,
                           timeout=10, check=False)
        ok, why = r.returncode == 0, (r.stderr or r.stdout).strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        ok, why = False, str(e)
    rep.add("network namespaces", ok, "a network and mount namespace can be made" if ok else
            f"unshare --net --mount failed: {why[:200]}",
            "run on a host (or a privileged container) that allows namespaces (CAP_SYS_ADMIN)")


def _lab(rep: Report, spec: TestbedSpec | None, quotas: bool) -> None:
    tools = ("ssh", "ssh-keygen", "ssh-keyscan")
    missing = [t for t in tools if shutil.which(t) is None]
    rep.add("ssh client", not missing, ", ".join(tools) + " on PATH" if not missing else
            f"missing: {', '.join(missing)}", "apt-get install -y openssh-client")
    agent = os.environ.get("SSH_AUTH_SOCK")
    rep.add("ssh agent", None if not agent else True, f"SSH_AUTH_SOCK={agent}" if agent else "no SSH_AUTH_SOCK "
            "(only key files are offered)", required=False)
    if spec is None:
        return
    from testbed.providers.lab.provider import LabProvider

    hosts = LabProvider(spec, cast("Store", None)).hosts_from_spec()  # reads the spec only
    keys = sorted({h.key for h in hosts if h.key})
    gone = [k for k in keys if not os.path.isfile(k)]
    if gone:
        rep.add("keys", False, f"no such key file: {', '.join(gone)}", "set provider.key (or the host's key) to "
                "your private key")
    else:
        rep.add("keys", True, ", ".join(keys) if keys else "the testbed's own key (made at provision; "
                "put its .pub in each host's authorized_keys)")
    rep.context["hosts"] = ", ".join(f"{h.user}@{h.address}:{h.port}" for h in hosts)


def _slurm(rep: Report, spec: TestbedSpec | None, quotas: bool) -> None:
    """The ssh client; with a spec: the key, the login node answering, Slurm answering there (its version), the
    partition (and its node count) and the account (where the cluster keeps accounting)."""
    import tempfile
    from pathlib import Path

    from testbed.providers.slurm.cli import Login
    from testbed.providers.slurm.settings import SlurmSettings

    missing = [t for t in ("ssh", "ssh-keygen") if shutil.which(t) is None]
    rep.add("ssh client", not missing, "ssh, ssh-keygen on PATH" if not missing else f"missing: {', '.join(missing)}",
            "apt-get install -y openssh-client")
    if spec is None or missing:
        return
    s = spec.provider
    assert isinstance(s, SlurmSettings)
    user = s.login.user or spec.user
    key = os.path.expanduser(s.login.key) if s.login.key else None
    if key and not os.path.isfile(key):
        rep.add("key", False, f"no such key file: {key}", "set provider.login.key to your private key")
        return
    rep.add("key", True, key or "the testbed's own key (made at provision; put its .pub in ~/.ssh/authorized_keys "
            "on the cluster)")
    if key is None:
        rep.add("login node", None, "not checked: the testbed's key is made at provision")
        return
    rep.context["login"] = f"{user}@{s.login.address}:{s.login.port}"
    with tempfile.TemporaryDirectory(prefix="tb-check-") as tmp:  # nothing recorded: a check writes no state
        login = Login(s.login.address, user, s.login.port, key, s.login.proxy_jump, Path(tmp) / "known_hosts", None,
                      s.connect_timeout)
        try:
            major, minor = login.version()
            rep.add("login node", True, f"answers; Slurm {major}.{minor:02d}")
            parts = login.partitions()
            part = s.partition or login.default_partition()
        except TestbedError as e:
            rep.failure("login node", e)
            return
        if part in parts:
            rep.add("partition", True, f"{part}: {plural(parts[part], 'node')}")
        else:
            rep.add("partition", False, f"no partition '{part}'" if part else "no default partition",
                    f"set provider.partition to one of: {', '.join(sorted(parts)) or 'none listed'}")
        if s.account:
            accounts = login.accounts()
            if accounts is None:
                rep.add("account", None, "not checked: the cluster keeps no accounting database", required=False)
            else:
                rep.add("account", s.account in accounts, s.account if s.account in accounts else
                        f"you have no account '{s.account}'", f"your accounts: {', '.join(accounts) or 'none'}")
        rep.context["partition"] = part or ""


# chameleon ----------------------------------------------------------------------------------------------------
def _chameleon(rep: Report, spec: TestbedSpec | None, quotas: bool) -> None:
    from testbed.providers.chameleon import chi as chameleon_chi
    from testbed.providers.chameleon.settings import ChameleonSettings

    settings = spec.provider if spec is not None else None
    assert settings is None or isinstance(settings, ChameleonSettings)
    extra = _extra(rep)
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
    from testbed.providers.chameleon.provider import snapshots

    if snapshots(site, flavor):
        rep.add("images", True, f"Nova snapshots a server at {site} (flavor {flavor}): 'testbed image bake' and "
                                "'setup --bake' make a private Glance image through its createImage", required=False)
    else:
        rep.add("images", False, f"{site} is a bare-metal site (flavor {flavor}): its nodes (Ironic) have no Nova "
                                 "snapshot, so 'testbed image bake' and 'setup --bake' are refused there",
                "on a node, 'sudo cc-snapshot NAME' makes a Glance image (testbed ssh TESTBED HOST first; it asks "
                "for your Chameleon password); boot from it with provider.image: NAME; or rely on the content "
                "address: an unchanged set-up is skipped", required=False)


def _keystone_refusal(e: Any, creds: Any, site: str) -> tuple[str, str]:
    """(detail, fix) of a failed login."""
    from testbed.providers.chameleon.cloud import auth_fix

    status = f"HTTP {e.status}" if e.status else "no answer"
    if e.kind == "hub":  # JupyterHub did not renew the access token: keystone never saw one
        from testbed.providers.chameleon.chi import HUB_FIX

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


# gcp-tpu ------------------------------------------------------------------------------------------------------
def _adc_source(creds: Any) -> str:
    """Where Application Default Credentials came from (google.auth.default's search order)."""
    key = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if key:
        return f"GOOGLE_APPLICATION_CREDENTIALS ({key})"
    try:
        from google.auth import _cloud_sdk

        well_known = _cloud_sdk.get_application_default_credentials_path()
    except Exception:  # a google-auth without it
        well_known = ""
    if well_known and os.path.isfile(well_known):
        return f"gcloud auth application-default login ({well_known})"
    if "compute_engine" in type(creds).__module__:
        return "the metadata server (this VM's service account)"
    return type(creds).__name__


def _tpu(rep: Report, spec: TestbedSpec | None, quotas: bool) -> None:
    from testbed.providers.base import _quiet
    from testbed.providers.gcp_tpu.cloud import ANONYMOUS_ENV, Cloud
    from testbed.providers.gcp_tpu.errors import api_error, is_api_error
    from testbed.providers.gcp_tpu.settings import TpuSettings
    from testbed.providers.gcp_tpu.wait import Polling
    from testbed.spec import TestbedSpec

    if spec is None:
        spec = TestbedSpec(name="gcp-tpu", provider=TpuSettings())
    p = Cloud(spec, cast("Store", None), _quiet, Polling())  # the checks read no state and write none
    s = p.settings
    rep.context.update({"zone": s.zone, "accelerator": s.accelerator_type,
                        **({"endpoint": s.endpoint} if s.endpoint else {})})
    extra = _extra(rep)
    if not extra:
        rep.add("credentials", None, "not checked: google-auth comes with the extra")
        return
    try:
        p.validate()
        creds, adc_project = p.credentials()
    except TestbedError as e:
        rep.failure("credentials", e)
        return
    anonymous = os.environ.get(ANONYMOUS_ENV) == "1"
    who = getattr(creds, "service_account_email", None)
    rep.add("credentials", True, f"anonymous ({ANONYMOUS_ENV}=1, endpoint {s.endpoint})" if anonymous else
            f"Application Default Credentials from {_adc_source(creds)}" + (f" ({who})" if who else ""))
    try:
        project, where = p.project(adc_project)
    except TestbedError as e:
        rep.failure("project", e)
        return
    rep.add("project", True, f"{project} (from {where})")
    rep.context["project"] = project
    try:
        c = p.client()
        nodes = list(c.list_nodes(parent=p.parent, timeout=HTTP_TIMEOUT, retry=None))
    except Exception as e:
        if not is_api_error(e):
            raise
        err = api_error(e, action="list TPU nodes", where=p.parent + (f" via {s.endpoint}" if s.endpoint else ""),
                        testbed=spec.name, zone=s.zone, accelerator=s.accelerator_type)
        rep.failure("accepted", err)
        return
    ours = sum(1 for n in nodes if dict(n.labels).get("managed-by") == "testbed")
    rep.add("accepted", True, f"the TPU API listed {plural(len(nodes), 'node')} in {p.parent} ({ours} made by testbed)")
    if quotas:
        rep.add("quotas", None, "not given by the TPU API: see IAM & Admin > Quotas in the console (service "
                "tpu.googleapis.com)", required=False)
