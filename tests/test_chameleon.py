"""The Chameleon provider: the real python-chi client against a fake Chameleon site on 127.0.0.1.

The fake's floating IPs are loopback addresses where real sshd daemons (started here, as root) answer for the
user ``cc``; binding a floating IP installs the server's key pair there. The failure matrix checks that each
failure gives one clear message (what, where, fix) and that ``destroy`` afterwards leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fakes.chameleon_api import FakeChameleon, LoopbackSshd

from testbed import ssh
from testbed.errors import TestbedError, UsageError
from testbed.providers.chameleon import ChameleonProvider
from testbed.spec import TestbedSpec
from testbed.state import Store

ROOT = Path(__file__).resolve().parents[1]
NAME = "chameleon"

pytestmark = pytest.mark.timeout(60)


def _can_run_sshd() -> str | None:
    if os.geteuid() != 0:
        return "needs root (sshd on loopback addresses, mount namespaces)"
    for tool in ("/usr/sbin/sshd", shutil.which("unshare"), shutil.which("ssh-keyscan")):
        if not tool or not os.path.exists(tool):
            return f"missing {tool}"
    return None


@pytest.fixture(scope="module")
def sshd() -> Iterator[LoopbackSshd]:
    reason = _can_run_sshd()
    if reason:
        pytest.skip(reason)
    d = LoopbackSshd(3).start()
    yield d
    d.stop()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tb_home: Path) -> pytest.MonkeyPatch:
    for k in list(os.environ):
        if k.startswith("OS_"):
            monkeypatch.delenv(k)
    return monkeypatch


@pytest.fixture
def fake(sshd: LoopbackSshd, clean_env: pytest.MonkeyPatch) -> Iterator[FakeChameleon]:
    sshd.reset()
    f = FakeChameleon(fip_pool=list(sshd.addresses), ssh_hook=sshd.hook).start()
    for k, v in f.env().items():
        clean_env.setenv(k, v)
    yield f
    f.stop()


class Made:
    """A provider under test with its store and the progress lines it printed."""

    def __init__(self, provider: ChameleonProvider, store: Store, lines: list[str]):
        self.p = provider
        self.store = store
        self.lines = lines

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.store.resources(NAME):
            out[r["kind"]] = out.get(r["kind"], 0) + 1
        return out


@pytest.fixture
def make(tb_home: Path) -> Iterator[Callable[..., Made]]:
    made: list[Made] = []

    def _make(count: int = 3, hook: Callable[[str], None] | None = None, **settings: Any) -> Made:
        spec = TestbedSpec.model_validate({"name": NAME, "user": "cc", "provider": {
            "kind": "chameleon", "count": count, "lease_timeout": 30, "server_timeout": 30, "ssh_timeout": 20,
            **settings}})
        store = Store(tb_home / ".testbed" / "state.db")
        lines: list[str] = []

        def progress(line: str) -> None:
            lines.append(line)
            if hook:
                hook(line)

        p = ChameleonProvider(spec, store, progress=progress)
        p.poll_interval = 0.02
        p.destroy_timeout = 10
        m = Made(p, store, lines)
        made.append(m)
        return m

    yield _make
    for m in made:  # never leave ssh masters behind
        ssh.close_connections(NAME, [f"node{i}" for i in range(3)], remove=True)


def _assert_clear(e: TestbedError, *what: str, where: str, fix: str) -> None:
    text = e.render()
    for w in what:
        assert w in e.what, text
    assert e.where and where in e.where, text
    assert e.fix and fix in e.fix, text
    assert "Traceback" not in text


def _destroy_leaves_nothing(m: Made, fake: FakeChameleon) -> None:
    m.p.destroy()
    assert fake.leaked() == {"leases": 0, "servers": 0, "fips": 0}
    assert m.store.resources(NAME) == []
    assert m.store.testbed(NAME) is None
    assert not fake.keypairs


# imports, credentials ---------------------------------------------------------------------------------
def test_import_does_not_load_chi() -> None:
    code = ("import sys, testbed.providers.chameleon, testbed.providers; "
            "testbed.providers.provider_class('chameleon'); "
            "bad = [m for m in sys.modules if m == 'chi' or m.startswith(('chi.', 'openstack', 'blazarclient'))]; "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_missing_credentials_refused_before_any_request(fake: FakeChameleon, clean_env: pytest.MonkeyPatch,
                                                        make: Callable[..., Made]) -> None:
    for k in list(os.environ):
        if k.startswith("OS_"):
            clean_env.delenv(k)
    m = make()
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "no Chameleon credentials", "OS_AUTH_URL", where="OS_", fix="source your Chameleon openrc")
    assert "OS_APPLICATION_CREDENTIAL_ID" in ei.value.what
    assert fake.requests == []
    # half an application credential names exactly what is missing
    clean_env.setenv("OS_AUTH_URL", fake.env()["OS_AUTH_URL"])
    clean_env.setenv("OS_AUTH_TYPE", "v3applicationcredential")
    clean_env.setenv("OS_APPLICATION_CREDENTIAL_ID", "x")
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    assert "OS_APPLICATION_CREDENTIAL_SECRET" in ei.value.what and "OS_AUTH_URL" not in ei.value.what
    # an openrc for another site
    for k, v in fake.env().items():
        clean_env.setenv(k, v)
    clean_env.setenv("OS_REGION_NAME", "CHI@TACC")
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "CHI@TACC", "CHI@UC", where="OS_REGION_NAME", fix="openrc")
    assert fake.requests == []


def test_wrong_secret_is_one_clear_message(fake: FakeChameleon, clean_env: pytest.MonkeyPatch,
                                           make: Callable[..., Made]) -> None:
    clean_env.setenv("OS_APPLICATION_CREDENTIAL_SECRET", "wrong")
    m = make(count=1)
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "refused the credentials", "401", where="Chameleon CHI@UC", fix="openrc")
    assert "wrong" not in ei.value.render()
    assert fake.leaked() == {"leases": 0, "servers": 0, "fips": 0}


# the happy path ---------------------------------------------------------------------------------------
def test_provision_ssh_destroy(fake: FakeChameleon, sshd: LoopbackSshd, make: Callable[..., Made],
                               capfd: pytest.CaptureFixture[str], tb_home: Path) -> None:
    m = make()
    hosts = m.p.provision()
    out, err = capfd.readouterr()
    assert out == "" and err == "", "python-chi chatter reached the terminal"
    assert [h.name for h in hosts] == ["node0", "node1", "node2"]
    assert {h.user for h in hosts} == {"cc"}
    assert sorted(h.address for h in hosts) == sorted(sshd.addresses)
    assert [h.name for h in m.store.hosts(NAME)] == ["node0", "node1", "node2"]
    assert hosts[0].groups == ["master"] and hosts[1].groups == ["workers"]
    # the nodes reach each other at their fixed IPs (a floating IP is NAT: nothing can bind to it, e.g. jitc's
    # master socket); runs get those as MASTER_ADDR and in hostfiles
    fixed = {p["fixed_ips"][0]["ip_address"] for p in fake.ports.values()}
    for h in m.store.hosts(NAME):
        assert h.facts["private_address"] and h.mesh_address == h.facts["private_address"] != h.address
        assert h.mesh_address in fixed
    assert m.kinds() == {"lease": 1, "keypair": 1, "server": 3, "fip": 3}
    assert m.store.testbed(NAME)["status"] == "up"
    # the lease asked for nodes and floating IPs; servers went on its reservation with the testbed's key
    (lease,) = fake.leases.values()
    assert {r["resource_type"] for r in lease["reservations"]} == {"physical:host", "virtual:floatingip"}
    node_rid = next(r["id"] for r in lease["reservations"] if r["resource_type"] == "physical:host")
    assert {s["_reservation"] for s in fake.servers.values()} == {node_rid}
    _, pub = ssh.ensure_keypair(NAME)
    assert [k["public_key"] for k in fake.keypairs.values()] == [pub]
    cfg = ssh.ssh_config_path(NAME)
    for h in hosts:
        r = subprocess.run(["ssh", "-F", str(cfg), h.name, "true"], capture_output=True, text=True, timeout=20)
        assert r.returncode == 0, r.stderr
    r = subprocess.run(["ssh", "-F", str(cfg), "-o", "ControlPath=none", "node1", "id -un"], capture_output=True,
                       text=True, timeout=20)
    assert r.stdout.strip() == "cc", r.stderr
    assert ssh.inventory_path(NAME).exists()
    assert any("lease" in ln and "ACTIVE" in ln for ln in m.lines)
    d = m.p.describe()
    assert d["lease"] == lease["id"] and d["lease_end"].endswith("Z") and "warning" not in d
    # no secret anywhere on disk
    secret = fake.app_cred[1].encode()
    for p in (tb_home / ".testbed").rglob("*"):
        if p.is_file():
            assert secret not in p.read_bytes(), p
    # destroy used nova/neutron directly: one DELETE per floating IP (chi's Server.delete() would leak them)
    _destroy_leaves_nothing(m, fake)
    assert sum(1 for meth, p in fake.requests if meth == "DELETE" and p.startswith("/network/v2.0/floatingips/")) == 3
    assert not any(p.startswith("/v2.0/") for _, p in fake.requests)
    assert sorted(fake.fip_pool) == sorted(sshd.addresses)


def test_provision_again_reuses_everything(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    m = make(count=2)
    first = m.p.provision()
    posts = [p for meth, p in fake.requests if meth in ("POST", "PUT") and "auth/tokens" not in p]
    second = make(count=2).p.provision()
    again = [p for meth, p in fake.requests if meth in ("POST", "PUT") and "auth/tokens" not in p]
    assert [h.to_dict() for h in first] == [h.to_dict() for h in second]
    assert again == posts, "a second provision created or changed something"
    assert m.kinds() == {"lease": 1, "keypair": 1, "server": 2, "fip": 2}
    _destroy_leaves_nothing(m, fake)


def test_destroy_twice_and_destroy_of_nothing(fake: FakeChameleon, clean_env: pytest.MonkeyPatch,
                                              make: Callable[..., Made]) -> None:
    m = make(count=1)
    m.p.provision()
    _destroy_leaves_nothing(m, fake)
    n = len(fake.requests)
    for k in list(os.environ):
        if k.startswith("OS_"):
            clean_env.delenv(k)
    m.p.destroy()  # nothing recorded: no credentials needed, no request sent
    assert len(fake.requests) == n


def test_password_credentials(fake: FakeChameleon, clean_env: pytest.MonkeyPatch, make: Callable[..., Made]) -> None:
    for k in list(os.environ):
        if k.startswith("OS_"):
            clean_env.delenv(k)
    for k, v in fake.env("password").items():
        clean_env.setenv(k, v)
    m = make(count=1, reserve_floating_ips=False)
    (h,) = m.p.provision()
    assert h.user == "cc"
    assert m.kinds() == {"lease": 1, "keypair": 1, "server": 1, "fip": 1}
    (lease,) = fake.leases.values()
    assert [r["resource_type"] for r in lease["reservations"]] == ["physical:host"]
    _destroy_leaves_nothing(m, fake)


# the failure matrix -----------------------------------------------------------------------------------
def test_lease_goes_to_error(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    fake.lease_error = True
    m = make()
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "lease", "went to ERROR", where="blazar", fix=f"testbed destroy {NAME}")
    assert m.kinds() == {"lease": 1}
    assert m.store.testbed(NAME)["status"] == "failed"
    _destroy_leaves_nothing(m, fake)


def test_server_create_500_for_one_of_three(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    fake.fail_server_create = {2}
    m = make()
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "creating server", "node1", "HTTP 500", "Unexpected API Error", where="nova",
                  fix=f"testbed destroy {NAME}")
    assert m.kinds() == {"lease": 1, "keypair": 1, "server": 1}
    _destroy_leaves_nothing(m, fake)


def test_quota_exceeded(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    fake.quota_instances = 2
    m = make()
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "quota exceeded", "HTTP 403", "Quota exceeded for instances", where="nova",
                  fix="larger quota")
    assert m.kinds()["server"] == 2
    _destroy_leaves_nothing(m, fake)


def test_floating_ip_pool_empty_when_reserving(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    fake.fip_pool = fake.fip_pool[:2]  # three nodes, two addresses left
    m = make()
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "floating-IP pool is empty", "Not enough floating IPs available", where="blazar",
                  fix="floating_ips: false")
    assert m.kinds() == {}
    _destroy_leaves_nothing(m, fake)


def test_floating_ip_pool_empty_on_demand(fake: FakeChameleon, sshd: LoopbackSshd,
                                          make: Callable[..., Made]) -> None:
    fake.fip_pool = fake.fip_pool[:1]
    m = make(count=2, reserve_floating_ips=False)
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "floating-IP pool is empty", "409", "No more IP addresses available", where="neutron",
                  fix=f"testbed destroy {NAME}")
    assert m.kinds() == {"lease": 1, "keypair": 1, "server": 2, "fip": 1}
    _destroy_leaves_nothing(m, fake)
    assert fake.fip_pool == sshd.addresses[:1]


def test_server_never_leaves_build(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    fake.stuck_build = {"node2"}
    m = make()
    m.p.settings.server_timeout = 1  # below the spec's minimum, to keep the test short
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "not ACTIVE after 1 s", "node2", "BUILD", where="nova", fix=f"testbed destroy {NAME}")
    assert m.kinds() == {"lease": 1, "keypair": 1, "server": 3}
    _destroy_leaves_nothing(m, fake)


@pytest.mark.parametrize("at", [": STARTING", "node1: creating", "node0: BUILD", "floating IP"])
def test_ctrl_c_mid_provision(fake: FakeChameleon, make: Callable[..., Made], at: str) -> None:
    fired: list[str] = []

    def hook(line: str) -> None:
        if at in line and not fired:
            fired.append(line)
            raise KeyboardInterrupt

    m = make(hook=hook)
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "interrupted", "recorded so far", where="Chameleon CHI@UC",
                  fix=f"testbed destroy {NAME}")
    assert ei.value.code == 130 and fired
    recorded = m.kinds()
    held = fake.leaked()
    assert recorded.get("lease", 0) == held["leases"]
    assert recorded.get("server", 0) == held["servers"]
    assert recorded.get("fip", 0) >= sum(1 for f in fake.fips.values() if f["port_id"])
    _destroy_leaves_nothing(m, fake)


def test_provision_again_after_a_failure_resumes(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    """A server stuck in BUILD that then fails is replaced; the rest is reused; nothing leaks."""
    fake.stuck_build = {"node1"}
    m = make()
    m.p.settings.server_timeout = 1
    with pytest.raises(TestbedError):
        m.p.provision()
    (stuck,) = [s for s in fake.servers.values() if s["name"].endswith("node1")]
    stuck.update(status="ERROR", fault={"code": 500, "message": "No valid host was found."})
    fake.stuck_build = set()
    m2 = make()
    hosts = m2.p.provision()
    assert [h.name for h in hosts] == ["node0", "node1", "node2"]
    assert stuck["id"] not in fake.servers and len(fake.servers) == 3
    assert sum(1 for meth, p in fake.requests if meth == "POST" and p == "/reservation/v1/leases") == 1
    assert any("in ERROR, replacing it" in ln for ln in m2.lines)
    _destroy_leaves_nothing(m2, fake)


def test_future_lease_is_recorded_and_reported(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    start = (datetime.now(UTC) + timedelta(days=2)).strftime("%Y-%m-%d %H:%M")
    m = make(count=1, start=start)
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "starts only at", start, where="blazar", fix=f"testbed provision {NAME}")
    assert m.kinds() == {"lease": 1}
    _destroy_leaves_nothing(m, fake)


def test_destroy_finds_what_was_never_recorded(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    """A crash between nova's answer and the state write: destroy still finds the server by name."""
    fake.stuck_build = {"*"}
    m = make(count=2)
    m.p.settings.server_timeout = 1
    with pytest.raises(TestbedError):
        m.p.provision()
    for r in m.store.resources(NAME, "server"):
        m.store.remove_resource(NAME, "server", r["id"])
    m.store.remove_resource(NAME, "lease", next(iter(fake.leases)))
    _destroy_leaves_nothing(m, fake)


def test_destroy_failure_keeps_rows_and_reruns(fake: FakeChameleon, make: Callable[..., Made],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    m = make(count=1)
    m.p.provision()
    real = fake._nova

    def broken(method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        if method == "DELETE" and "/servers/" in path:
            return 503, {"computeFault": {"code": 503, "message": "Service Unavailable"}}
        return real(method, path, query, body)

    monkeypatch.setattr(fake, "_nova", broken)
    with pytest.raises(TestbedError) as ei:
        m.p.destroy()
    _assert_clear(ei.value, "left 1 server", "503", where="Chameleon CHI@UC", fix=f"testbed destroy {NAME}")
    assert m.kinds() == {"server": 1}
    assert fake.leaked()["servers"] == 1
    monkeypatch.setattr(fake, "_nova", real)
    _destroy_leaves_nothing(m, fake)


# status and extend ------------------------------------------------------------------------------------
def test_describe_warns_near_lease_end_without_network(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    m = make(count=1)
    m.store.upsert_testbed(NAME, "chameleon", None, "up", {"lease_id": "L1", "lease_end": "2030-01-01T12:00:00Z"})
    n = len(fake.requests)
    far = m.p.describe(now=datetime(2030, 1, 1, 8, 0))
    assert far["remaining"] == "4h 00m" and "warning" not in far
    near = m.p.describe(now=datetime(2030, 1, 1, 11, 20))
    assert near["remaining"] == "40m" and f"testbed extend {NAME} --hours" in near["warning"]
    over = m.p.describe(now=datetime(2030, 1, 1, 12, 5))
    assert "ended" in over["warning"]
    assert len(fake.requests) == n


def test_extend_moves_the_lease_end(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    m = make(count=1, hours=2)
    m.p.provision()
    (lease,) = fake.leases.values()
    before = datetime.strptime(lease["end_date"], "%Y-%m-%dT%H:%M:%S.%f")
    new_end = m.p.extend(3)
    after = datetime.strptime(lease["end_date"], "%Y-%m-%dT%H:%M:%S.%f")
    assert after - before == timedelta(hours=3)
    assert new_end == after.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert ("PUT", f"/reservation/v1/leases/{lease['id']}") in fake.requests
    d = m.p.describe(now=datetime.now(UTC).replace(tzinfo=None))
    assert d["lease_end"] == new_end and d["remaining"].startswith("4h")
    fake.extend_conflict = True
    with pytest.raises(TestbedError) as ei:
        m.p.extend(100)
    _assert_clear(ei.value, "cannot extend", where="blazar", fix="fewer hours")
    with pytest.raises(UsageError):
        m.p.extend(0)
    _destroy_leaves_nothing(m, fake)
    with pytest.raises(TestbedError) as ei:
        m.p.extend(1)
    assert "no lease recorded" in ei.value.what


def test_refresh_reports_server_state(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    m = make(count=1)
    m.p.provision()
    assert [h.state for h in m.p.refresh()] == ["up"]
    (sid,) = fake.servers
    fake.servers[sid]["status"] = "SHUTOFF"
    assert [h.state for h in m.p.refresh()] == ["shutoff"]
    _destroy_leaves_nothing(m, fake)
