"""``testbed check`` (and ``doctor``, and ``status --orphans``) against the fakes of the cloud APIs on 127.0.0.1:
every "ok" is a check that ran (a Keystone token, a TPU API list call, a namespace made), every "no" says why and
what to do, and a provider that could not be asked is named with the reason, never counted as holding nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from localbed import invoke

from testbed.distribution import install_command

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def no_cloud(tb_home: Path, monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No cloud credentials of this machine's user reach the test, and Google's library never asks a metadata
    server (the network stays on loopback)."""
    for k in list(os.environ):
        if k.startswith(("OS_", "JUPYTERHUB_")) or k in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT",
                                                          "TESTBED_TPU_ANONYMOUS", "SSH_AUTH_SOCK"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tb_home / "no-gcloud"))
    try:
        from google.auth.compute_engine import _metadata
    except ImportError:
        pass
    else:
        monkeypatch.setattr(_metadata, "_NO_GCE_CHECK", True)
    return monkeypatch


@pytest.fixture
def chameleon(no_cloud: pytest.MonkeyPatch) -> Iterator[Any]:
    pytest.importorskip("chi")
    from fakes.chameleon_api import FakeChameleon

    fake = FakeChameleon().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def tpu(no_cloud: pytest.MonkeyPatch) -> Iterator[Any]:
    pytest.importorskip("google.cloud.tpu_v2")
    from fakes.tpu_api import FakeTpuApi

    with FakeTpuApi() as fake:
        no_cloud.setenv("TESTBED_TPU_ANONYMOUS", "1")
        yield fake


def _check(*args: str) -> tuple[int, dict[str, Any]]:
    code, out, exc = invoke("check", *args, "--json")
    assert exc is None or isinstance(exc, SystemExit), (out, exc)
    return code, json.loads(out)


def _rows(data: dict[str, Any], provider: str) -> dict[str, dict[str, Any]]:
    rep = next(p for p in data["providers"] if p["provider"] == provider)
    return {c["check"]: c for c in rep["checks"]}


def _report(data: dict[str, Any], provider: str) -> dict[str, Any]:
    return next(p for p in data["providers"] if p["provider"] == provider)


def _inventory(tb_home: Path, name: str, text: str) -> None:
    (tb_home / "inventories").mkdir(exist_ok=True)
    (tb_home / "inventories" / f"{name}.yml").write_text(text)


# chameleon ----------------------------------------------------------------------------------------------------
def test_chameleon_credentials_accepted_with_project_site_and_quotas(chameleon: Any,
                                                                      no_cloud: pytest.MonkeyPatch) -> None:
    fake = chameleon
    fake.quota_instances, fake.quota_fips = 5, 3
    for k, v in fake.env().items():
        no_cloud.setenv(k, v)
    code, data = _check("chameleon")
    assert code == 0 and data["ok"], data
    rows = _rows(data, "chameleon")
    assert rows["extra"]["ok"] and "python-chi" in rows["extra"]["detail"]
    assert rows["credentials"]["ok"] and "v3applicationcredential from environment" in rows["credentials"]["detail"]
    assert rows["accepted"]["ok"] and "issued a token for alice in project CHI-123456" in rows["accepted"]["detail"]
    assert rows["quota: instances"]["detail"] == "0 used of 5" and rows["quota: floating IPs"]["detail"] == \
        "0 used of 3"
    assert rows["allocation"]["ok"] is None and not rows["allocation"]["required"]
    ctx = _report(data, "chameleon")["context"]
    assert ctx["site"] == "CHI@UC" and ctx["project"] == f"CHI-123456 ({fake.project_id})"
    # each ok is a request the site answered: a token, nova's limits, neutron's quota details
    assert {("POST", "/identity/v3/auth/tokens"), ("GET", "/compute/v2.1/limits"),
            ("GET", f"/network/v2.0/quotas/{fake.project_id}/details.json")} <= set(fake.requests)
    code, out, _ = invoke("check", "chameleon")
    assert code == 0 and "chameleon: usable (auth v3applicationcredential, site CHI@UC, project CHI-123456" in out
    assert fake.app_cred[1] not in out


def test_chameleon_says_whether_images_can_be_baked_at_the_site(chameleon: Any, no_cloud: pytest.MonkeyPatch,
                                                                 tb_home: Path) -> None:
    """A bare-metal site (CHI@UC): an 'images' row that says no, why and cc-snapshot, without making Chameleon
    unusable; a testbed at a KVM site (its spec's site and flavor): yes. Decided from names, no request."""
    from fakes.chameleon_api import FakeChameleon

    for k, v in chameleon.env().items():
        no_cloud.setenv(k, v)
    code, data = _check("chameleon")
    row = _rows(data, "chameleon")["images"]
    assert code == 0 and _report(data, "chameleon")["usable"] and row["ok"] is False and not row["required"]
    assert "CHI@UC is a bare-metal site (flavor baremetal)" in row["detail"] and "refused" in row["detail"]
    assert "sudo cc-snapshot NAME" in row["fix"] and "content address" in row["fix"]
    code, out, _ = invoke("check", "chameleon")
    assert code == 0 and "fix (images): on a node, 'sudo cc-snapshot NAME'" in out
    kvm = FakeChameleon(region="KVM@LAB").start()
    try:
        for k, v in kvm.env().items():
            no_cloud.setenv(k, v)
        _inventory(tb_home, "vms", "provider: {kind: chameleon, site: KVM@LAB, flavor: m1.large}\nuser: cc\n")
        code, data = _check("vms")
        row = _rows(data, "chameleon")["images"]
        assert code == 0 and row["ok"] is True
        assert "Nova snapshots a server at KVM@LAB (flavor m1.large)" in row["detail"]
        assert not [r for r in kvm.requests if "image" in r[1] or "action" in r[1]]
    finally:
        kvm.stop()


def test_chameleon_refused_missing_and_unreachable_credentials_exit_1(chameleon: Any,
                                                                       no_cloud: pytest.MonkeyPatch) -> None:
    fake = chameleon
    code, data = _check("chameleon")  # nothing in the environment: no request at all
    assert code == 1 and not data["ok"] and fake.requests == []
    rows = _rows(data, "chameleon")
    assert rows["credentials"]["ok"] is False and "OS_AUTH_URL" in rows["credentials"]["detail"]
    assert "openrc" in rows["credentials"]["fix"] and rows["accepted"]["ok"] is None
    assert _report(data, "chameleon")["reason"].startswith("credentials: no Chameleon credentials")
    for k, v in {**fake.env(), "OS_APPLICATION_CREDENTIAL_SECRET": "not-it"}.items():
        no_cloud.setenv(k, v)
    code, data = _check("chameleon")
    rows = _rows(data, "chameleon")
    assert code == 1 and rows["credentials"]["ok"] and rows["accepted"]["ok"] is False, rows
    assert "refused by keystone" in rows["accepted"]["detail"] and "401" in rows["accepted"]["detail"]
    assert "Application Credentials" in rows["accepted"]["fix"]
    code, out, _ = invoke("check", "chameleon")
    assert code == 1 and "chameleon: not usable" in out and "fix (accepted):" in out and "not-it" not in out
    no_cloud.setenv("OS_AUTH_URL", "http://127.0.0.1:9/identity/v3")  # nothing listens there
    code, data = _check("chameleon")
    assert code == 1 and "cannot reach keystone at http://127.0.0.1:9" in _rows(data, "chameleon")["accepted"][
        "detail"]


def test_chameleon_jupyterhub_access_token(chameleon: Any, no_cloud: pytest.MonkeyPatch) -> None:
    """A notebook on Chameleon's JupyterHub: OS_AUTH_TYPE=v3oidcaccesstoken with an access token that expired
    minutes after the server started; python-chi asks the Hub for a fresh one, keystone's OS-FEDERATION auth takes
    it as a bearer token and the unscoped token is rescoped to the project."""
    fake = chameleon
    for k, v in fake.jupyter_env(token_ttl=-60).items():
        no_cloud.setenv(k, v)
    code, data = _check("chameleon")
    rows = _rows(data, "chameleon")
    assert code == 0 and rows["accepted"]["ok"], rows
    assert "v3oidcaccesstoken" in rows["credentials"]["detail"] and "JupyterHub" in rows["credentials"]["detail"]
    assert fake.hub_requests >= 1
    assert [p for m, p in fake.requests if p.startswith("/identity")][:2] == [
        "/identity/v3/OS-FEDERATION/identity_providers/chameleon/protocols/openid/auth", "/identity/v3/auth/tokens"]
    # outside the Hub the same expired token is refused, with what to do about it
    for k in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_USER"):
        no_cloud.delenv(k)
    code, data = _check("chameleon")
    rows = _rows(data, "chameleon")
    assert code == 1 and rows["accepted"]["ok"] is False and "401" in rows["accepted"]["detail"]
    assert "access token has expired" in rows["accepted"]["fix"]
    no_cloud.setenv("OS_ACCESS_TOKEN", fake.access_token())  # a fresh one (exported by hand)
    code, data = _check("chameleon")
    assert code == 0 and _rows(data, "chameleon")["accepted"]["ok"]


@contextlib.contextmanager
def _silent_hub() -> Iterator[str]:
    """A JupyterHub API URL on 127.0.0.1 where connections are taken and never answered (a Hub that hangs)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}/hub/api"


@pytest.mark.timeout(30)
def test_chameleon_jupyterhub_that_hangs_or_refuses_is_one_message(chameleon: Any,
                                                                   no_cloud: pytest.MonkeyPatch) -> None:
    """python-chi asks the Hub for a fresh access token with no timeout and swallows any failure (the expired token
    then goes to keystone, whose 401 blames the token): testbed bounds the call and names the Hub."""
    from testbed.providers.chameleon import chi as chameleon_chi

    fake = chameleon
    for k, v in fake.jupyter_env(token_ttl=-60).items():
        no_cloud.setenv(k, v)
    no_cloud.setattr(chameleon_chi, "HUB_TIMEOUT", 1.0, raising=False)
    with _silent_hub() as url:
        no_cloud.setenv("JUPYTERHUB_API_URL", url)
        t0 = time.monotonic()
        code, data = _check("chameleon")
        took = time.monotonic() - t0
    row = _rows(data, "chameleon")["accepted"]
    assert code == 1 and row["ok"] is False, row
    assert f"JupyterHub at {url} did not answer within 1 s" in row["detail"], row
    assert "Stop My Server" in row["fix"] and took < 8, took
    no_cloud.setenv("JUPYTERHUB_API_URL", f"{fake.base}/hub/api")  # a Hub that refuses this server's API token
    no_cloud.setenv("JUPYTERHUB_API_TOKEN", "not-the-hubs")
    code, data = _check("chameleon")
    row = _rows(data, "chameleon")["accepted"]
    assert code == 1 and "JupyterHub at " in row["detail"] and "HTTP 403" in row["detail"], row
    assert "not-the-hubs" not in json.dumps(data)


# gcp-tpu ------------------------------------------------------------------------------------------------------
def test_tpu_check_lists_nodes_and_names_the_project_source(tpu: Any, tb_home: Path,
                                                            no_cloud: pytest.MonkeyPatch) -> None:
    fake = tpu
    _inventory(tb_home, "t1", f"provider:\n  kind: gcp-tpu\n  project: p1\n  zone: us-central2-b\n"
                              f"  endpoint: {fake.endpoint}\n")
    fake.handle("POST", "/v2/projects/p1/locations/us-central2-b/nodes?nodeId=x-0",
                {"acceleratorType": "v2-8", "runtimeVersion": "tpu-vm-base", "labels": {"managed-by": "testbed"}})
    code, data = _check("t1")
    rows = _rows(data, "gcp-tpu")
    assert code == 0 and data["ok"], rows
    assert rows["project"]["detail"] == f"p1 (from {tb_home / 'inventories' / 't1.yml'}: provider.project)"
    assert rows["accepted"]["detail"].startswith("the TPU API listed 1 node in projects/p1/locations/"
                                                 "us-central2-b (1 made by testbed)")
    assert "anonymous" in rows["credentials"]["detail"] and rows["quotas"]["ok"] is None
    assert _report(data, "gcp-tpu")["testbed"] == "t1"
    # the refusal of the service's auth is a "no" with its fix, exit 1
    fake.fail_next("GET", "UNAUTHENTICATED", "Request had invalid authentication credentials.")
    code, data = _check("t1")
    rows = _rows(data, "gcp-tpu")
    assert code == 1 and rows["accepted"]["ok"] is False and "refused the credentials" in rows["accepted"]["detail"]
    assert "application-default login" in rows["accepted"]["fix"]


def test_tpu_without_a_project_is_refused_naming_google_cloud_project(tpu: Any, tb_home: Path,
                                                                      no_cloud: pytest.MonkeyPatch) -> None:
    """The packaged TPU inventory names no placeholder project: with no GOOGLE_CLOUD_PROJECT (and no ADC project)
    provision is refused before any request, and the message names GOOGLE_CLOUD_PROJECT and provider.project."""
    from testbed.errors import UsageError
    from testbed.providers.gcp_tpu.provider import TpuProvider
    from testbed.spec import load_testbed
    from testbed.state import Store

    fake = tpu
    spec = load_testbed("tpu")  # the one that ships
    assert spec.provider.project is None  # type: ignore[union-attr]
    spec.provider = spec.provider.model_copy(update={"endpoint": fake.endpoint})
    p = TpuProvider(spec, Store(tb_home / ".testbed" / "state.db"))
    with pytest.raises(UsageError) as ei:
        p.provision()
    assert "GOOGLE_CLOUD_PROJECT" in ei.value.what and "provider.project" in (ei.value.where or "")
    assert "export GOOGLE_CLOUD_PROJECT" in (ei.value.fix or "") and "Traceback" not in ei.value.render()
    assert fake.api_requests() == []
    _inventory(tb_home, "t2", f"provider:\n  kind: gcp-tpu\n  endpoint: {fake.endpoint}\n")
    code, data = _check("t2")
    rows = _rows(data, "gcp-tpu")
    assert code == 1 and rows["project"]["ok"] is False and "GOOGLE_CLOUD_PROJECT" in rows["project"]["detail"]
    assert "accepted" not in rows and fake.api_requests() == []
    no_cloud.setenv("GOOGLE_CLOUD_PROJECT", "from-env")
    code, data = _check("t2")
    rows = _rows(data, "gcp-tpu")
    assert code == 0 and rows["project"]["detail"] == "from-env (from GOOGLE_CLOUD_PROJECT)"
    assert "projects/from-env/locations/us-central1-f" in rows["accepted"]["detail"]


# local, the machine, targets ----------------------------------------------------------------------------------
def test_local_rows_are_checks(no_cloud: pytest.MonkeyPatch) -> None:
    code, data = _check("local")
    rows = _rows(data, "local")
    assert set(rows) == {"linux", "root", "tools", "sshd", "network namespaces"}
    root = os.geteuid() == 0
    assert rows["root"]["ok"] is root
    if root:  # a namespace really made (and dropped)
        assert rows["network namespaces"]["ok"] is ((rows["tools"]["ok"] and rows["sshd"]["ok"]) or
                                                     rows["network namespaces"]["ok"])
    no_cloud.setattr(os, "geteuid", lambda: 1000)  # as a user without root
    code, data = _check("local")
    rows = _rows(data, "local")
    assert code == 1 and rows["root"]["ok"] is False and "sudo" in rows["root"]["fix"]
    assert rows["network namespaces"]["ok"] is None and rows["network namespaces"]["detail"].startswith(
        "not checked")
    assert _report(data, "local")["reason"].startswith("root:")


def test_unknown_target_is_refused_before_any_check(no_cloud: pytest.MonkeyPatch) -> None:
    from testbed.errors import UsageError

    _, out, exc = invoke("check", "local", "nosuch")  # the valid one is not checked either
    assert isinstance(exc, UsageError) and exc.code == 2 and out == ""
    assert "'nosuch' is neither a provider (local, lab, chameleon, gcp-tpu, slurm) nor a testbed" in exc.what


# no extra installed -------------------------------------------------------------------------------------------
HIDE_EXTRAS = ("import sys\n"
               "for m in ('google', 'chi', 'blazarclient', 'openstack'):\n"
               "    sys.modules[m] = None  # what an install without the extras looks like to import and find_spec\n"
               "sys.argv = ['testbed', *sys.argv[1:]]\n"
               "from testbed.cli import main\n"
               "main()\n")


def _without_extras(tb_home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OS_", "GOOGLE_", "JUPYTERHUB_"))}
    env.update(PYTHONPATH=str(ROOT), COLUMNS="200", NO_GCE_CHECK="true", CLOUDSDK_CONFIG=str(tb_home / "no-gcloud"))
    return subprocess.run([sys.executable, "-c", HIDE_EXTRAS, *args], cwd=tb_home, env=env, capture_output=True,
                          text=True, timeout=60)


def test_no_command_crashes_for_a_missing_extra(tb_home: Path) -> None:
    """Without google-cloud-tpu (no 'google' package at all) and python-chi, doctor and check say which extra is
    missing and how to install it; the provider asked about exits 1; status --orphans names both as not asked."""
    r = _without_extras(tb_home, "doctor")
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert install_command("tpu") in r.stdout and install_command("chameleon") in r.stdout, r.stdout
    r = _without_extras(tb_home, "check", "gcp-tpu", "--json")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    rep = json.loads(r.stdout)["providers"][0]
    assert rep["reason"].startswith("extra: the 'tpu' extra is not installed") and rep["fix"].startswith(
        install_command("tpu"))
    r = _without_extras(tb_home, "check", "chameleon", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["providers"][0]["reason"].startswith(
        "extra: the 'chameleon' extra is not installed"), r.stdout + r.stderr
    r = _without_extras(tb_home, "status", "--orphans")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "none found" not in r.stdout and "no provider could be asked" in r.stdout
    assert "not asked: chameleon for testbed chameleon: extra: the 'chameleon' extra is not installed" in r.stdout
    assert "not asked: gcp-tpu for testbed tpu: extra: the 'tpu' extra is not installed" in r.stdout


# status --orphans ---------------------------------------------------------------------------------------------
def test_orphans_name_each_provider_not_asked_and_why(no_cloud: pytest.MonkeyPatch, tb_home: Path) -> None:
    """No credentials anywhere: not 'none found', but each cloud testbed with the reason it was not asked."""
    code, out, exc = invoke("status", "--orphans", "--json")
    assert code == 0, (out, exc)
    data = json.loads(out)
    assert data["orphans"] == []
    asked = {a["testbed"]: a for a in data["orphans_asked"]}
    assert set(asked) == {"chameleon", "tpu"} and not any(a["asked"] for a in asked.values())
    assert asked["chameleon"]["why"].startswith("credentials: no Chameleon credentials") and asked["chameleon"]["fix"]
    assert "credentials" in asked["tpu"]["why"] and "application-default login" in asked["tpu"]["fix"]
    code, out, exc = invoke("status", "--orphans")
    assert code == 0 and "none found" not in out and "no provider could be asked, so none were looked for" in out
    assert "not asked: chameleon for testbed chameleon: credentials: no Chameleon credentials" in out


def test_orphans_name_each_provider_asked(chameleon: Any, tpu: Any, tb_home: Path,
                                          no_cloud: pytest.MonkeyPatch) -> None:
    """Asked at the fakes: each asked testbed with where and how many it found; the packaged chameleon spec (another
    site than the credentials') and tpu spec (no endpoint for anonymous credentials) not asked, with why; a refused
    login is a reason too."""
    for k, v in chameleon.env().items():
        no_cloud.setenv(k, v)
    _inventory(tb_home, "cham", "provider:\n  kind: chameleon\n  site: CHI@UC\nuser: cc\n")
    _inventory(tb_home, "t1", f"provider:\n  kind: gcp-tpu\n  project: p1\n  zone: us-central2-b\n"
                              f"  endpoint: {tpu.endpoint}\n")
    tpu.handle("POST", "/v2/projects/p1/locations/us-central2-b/nodes?nodeId=t1-0",
               {"acceleratorType": "v2-8", "runtimeVersion": "tpu-vm-base", "labels": {"testbed": "t1"}})
    code, out, exc = invoke("status", "--orphans", "--json")
    assert code == 0, (out, exc)
    data = json.loads(out)
    asked = {a["testbed"]: a for a in data["orphans_asked"]}
    assert asked["cham"] == {"testbed": "cham", "provider": "chameleon", "asked": True,
                             "where": f"site CHI@UC, project CHI-123456 ({chameleon.project_id})", "found": 0}
    assert asked["t1"]["asked"] and asked["t1"]["found"] == 1 and asked["t1"]["where"] == "project p1, zone " \
                                                                                          "us-central2-b"
    assert [(o["testbed"], o["id"]) for o in data["orphans"]] == [("t1", "t1-0")]
    assert not asked["chameleon"]["asked"] and "CHI@UC but the testbed asks for CHI@TACC" in asked["chameleon"]["why"]
    assert not asked["tpu"]["asked"] and "TESTBED_TPU_ANONYMOUS" in asked["tpu"]["why"]
    code, out, _ = invoke("status", "--orphans")
    assert "asked chameleon for testbed cham (site CHI@UC" in out and "asked gcp-tpu for testbed t1" in out
    tpu.handle("DELETE", "/v2/projects/p1/locations/us-central2-b/nodes/t1-0", {})
    tpu.settle()
    code, out, _ = invoke("status", "--orphans")
    assert "orphans: none found at the providers asked" in out and "not asked: gcp-tpu for testbed tpu" in out
    no_cloud.setenv("OS_APPLICATION_CREDENTIAL_SECRET", "not-it")
    code, out, exc = invoke("status", "--orphans", "--json")
    asked = {a["testbed"]: a for a in json.loads(out)["orphans_asked"]}
    assert not asked["cham"]["asked"] and asked["cham"]["why"].startswith("accepted: refused by keystone")


def test_a_bare_check_exits_1_when_a_provider_is_not_usable_and_names_it(chameleon: Any,
                                                                           no_cloud: pytest.MonkeyPatch) -> None:
    """Every provider kind is asked about when none is named: one not usable (no Chameleon credentials here) is
    exit 1, never a silent 0 over a 'not usable' line; the plain output names it and how to check only the others."""
    code, data = _check()
    assert not _report(data, "chameleon")["usable"]
    assert code == 1 and not data["ok"], data
    code, out, _ = invoke("check")
    assert code == 1 and "chameleon: not usable" in out, out
