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

from testbed import remote, ssh
from testbed.errors import TestbedError, UsageError
from testbed.providers.chameleon.provider import ChameleonProvider
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
        p.cloud.poll_interval = 0.02
        p.cloud.destroy_timeout = 10
        m = Made(p, store, lines)
        made.append(m)
        return m

    yield _make
    for m in made:  # never leave ssh masters behind
        remote.close_connections(NAME, [f"node{i}" for i in range(3)], remove=True)


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
    code = ("import sys, testbed.providers.chameleon.provider, testbed.providers; "
            "testbed.providers.provider_class('chameleon'); "
            "bad = [m for m in sys.modules if m == 'chi' or m.startswith(('chi.', 'openstack', 'blazarclient'))]; "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_two_clients_in_one_process_keep_their_own_site_while_threads_use_them(clean_env: pytest.MonkeyPatch) -> None:
    """python-chi holds one configuration per process: a run's supervisor queries the provider while its repair
    makes servers, each with its own client, and a client made (or used) in one thread must not move another's
    requests to its own site or credentials mid-call, nor leave the terminal's stdout swapped."""
    import threading

    from testbed.providers.chameleon import chi as chameleon_chi

    pytest.importorskip("chi")
    fakes = [FakeChameleon(fip_pool=[f"10.9.{i}.1"]).start() for i in range(2)]
    stdout = sys.stdout
    try:
        clients = [chameleon_chi.Chi(chameleon_chi.credentials_from_env(f.env(auth), site="CHI@UC"), site="CHI@UC")
                   for f, auth in zip(fakes, ("appcred", "password"), strict=True)]
        for i, c in enumerate(clients):
            assert c.fip_allocate(f"mine {i}")["floating_ip_address"] == f"10.9.{i}.1"
        wrong: list[str] = []

        def use(i: int) -> None:
            try:
                for _ in range(25):
                    if i == 2:  # a new client for the first site each time, as a provider query makes one
                        chameleon_chi.Chi(chameleon_chi.credentials_from_env(fakes[0].env(), site="CHI@UC"),
                                          site="CHI@UC").fips()
                        continue
                    got = [f["floating_ip_address"] for f in clients[i].fips()]
                    if got != [f"10.9.{i}.1"]:
                        wrong.append(f"client {i} saw {got}")
            except Exception as e:  # every failure is the finding
                wrong.append(f"client {i}: {e}")

        threads = [threading.Thread(target=use, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert wrong == []
        assert sys.stdout is stdout
    finally:
        for f in fakes:
            f.stop()


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
    before = len(m.lines)
    _destroy_leaves_nothing(m, fake)
    # destroy says what it released, one resource at a time (it was silent for as long as nova took)
    said = m.lines[before:]
    assert sum(ln.startswith("floating IP ") and ln.endswith(": released") for ln in said) == 3, said
    assert sum(ln.startswith("server ") and ln.endswith(": delete requested") for ln in said) == 3, said
    assert sum(ln.startswith("server ") and ": deleted after " in ln for ln in said) == 3, said
    assert any(ln.startswith("lease ") and ": delete" in ln for ln in said), said
    assert any(ln.startswith("key pair ") and ln.endswith(": deleted") for ln in said), said
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
    # Blazar keeps no reason on a lease (status_reason was dropped): what it shows is which event and which
    # reservation failed, and the help desk needs the lease id
    (lease,) = fake.leases.values()
    assert "status_reason" not in lease and lease["degraded"] is False
    assert "start_lease event failed" in ei.value.what and "physical:host reservation is in error" in ei.value.what
    assert lease["id"] in (ei.value.fix or "") and "help desk" in (ei.value.fix or "")
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


def test_reported_states_tell_a_run_which_servers_are_gone(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    """What a run asks before it judges a host lost: an ACTIVE server is up; one in ERROR, or deleted, is gone (a
    probe of it that times out is then lost, not slow); SHUTOFF is reported but is not gone by itself."""
    from testbed.run.liveness import Probe

    m = make(count=3)
    m.p.provision()
    assert m.p.reported_states() == {"node0": "up", "node1": "up", "node2": "up"}
    by_name = {srv["name"].rsplit("-", 1)[-1]: sid for sid, srv in fake.servers.items()}
    fake.servers[by_name["node0"]]["status"] = "ERROR"
    del fake.servers[by_name["node1"]]
    fake.servers[by_name["node2"]]["status"] = "SHUTOFF"
    states = m.p.reported_states()
    assert states == {"node0": "error", "node1": "gone", "node2": "shutoff"}
    assert [Probe(h, 0.0, 5.0, "slow", provider=st).lost for h, st in sorted(states.items())] == [True, True, False]
    _destroy_leaves_nothing(m, fake)


# credentials as Chameleon users have them ---------------------------------------------------------------
def _use_env(env: pytest.MonkeyPatch, values: dict[str, str]) -> None:
    for k in list(os.environ):
        if k.startswith("OS_"):
            env.delenv(k)
    for k, v in values.items():
        env.setenv(k, v)


def _no_secret_on_disk(tb_home: Path, *secrets: str) -> None:
    for p in (tb_home / ".testbed").rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            assert not any(s.encode() in data for s in secrets), p


def test_oidc_password_openrc(fake: FakeChameleon, clean_env: pytest.MonkeyPatch, make: Callable[..., Made],
                              tb_home: Path) -> None:
    """The project's OpenStack RC file (v3oidcpassword): keystoneauth's OpenID Connect flow against the site's
    Keycloak (discovery, password grant), keystone's OS-FEDERATION auth, then a project-scoped token."""
    _use_env(clean_env, fake.env("oidc"))
    m = make(count=1, project=fake.project)  # provider.project picks the project by name
    (h,) = m.p.provision()
    assert h.user == "cc"
    flow = [p for _, p in fake.requests if p.startswith(("/oidc", "/identity"))][:4]
    assert flow == ["/oidc/.well-known/openid-configuration", "/oidc/token",
                    "/identity/v3/OS-FEDERATION/identity_providers/chameleon/protocols/openid/auth",
                    "/identity/v3/auth/tokens"]
    _no_secret_on_disk(tb_home, fake.oidc_user[1])
    _destroy_leaves_nothing(m, fake)


def test_jupyterhub_access_token(fake: FakeChameleon, clean_env: pytest.MonkeyPatch, make: Callable[..., Made],
                                 tb_home: Path) -> None:
    """A notebook on Chameleon's JupyterHub (v3oidcaccesstoken, as jupyterhub-chameleon sets it): the access token
    the server started with has expired; python-chi asks the Hub for a fresh one, keystone's OS-FEDERATION auth
    takes it as a bearer token and rescopes it to OS_PROJECT_NAME. Provision and destroy work end to end."""
    env = fake.jupyter_env(token_ttl=-60)
    _use_env(clean_env, env)
    m = make(count=1)
    (h,) = m.p.provision()
    assert h.user == "cc" and fake.hub_requests >= 1
    flow = [p for _, p in fake.requests if p.startswith(("/hub", "/identity"))][:3]
    assert flow == ["/hub/api/users/alice",
                    "/identity/v3/OS-FEDERATION/identity_providers/chameleon/protocols/openid/auth",
                    "/identity/v3/auth/tokens"]
    _no_secret_on_disk(tb_home, env["OS_ACCESS_TOKEN"], fake.hub_token)
    _destroy_leaves_nothing(m, fake)
    # outside the Hub the expired token is refused, with what to do
    for k in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_USER"):
        clean_env.delenv(k)
    with pytest.raises(TestbedError) as ei:
        make(count=1).p.provision()
    _assert_clear(ei.value, "refused the credentials", "401", where="Chameleon CHI@UC",
                  fix="access token has expired")
    assert fake.leaked() == {"leases": 0, "servers": 0, "fips": 0}


def test_jupyterhub_that_hangs_is_one_message(fake: FakeChameleon, clean_env: pytest.MonkeyPatch,
                                             make: Callable[..., Made]) -> None:
    """The Hub takes the request for a fresh access token and never answers (python-chi's call has no timeout):
    provisioning stops after HUB_TIMEOUT with the Hub named, before anything is made."""
    import socket

    from testbed.providers.chameleon import chi as chameleon_chi

    clean_env.setattr(chameleon_chi, "HUB_TIMEOUT", 1.0, raising=False)
    with socket.socket() as hub:
        hub.bind(("127.0.0.1", 0))
        hub.listen(8)
        url = f"http://127.0.0.1:{hub.getsockname()[1]}/hub/api"
        _use_env(clean_env, {**fake.jupyter_env(token_ttl=-60), "JUPYTERHUB_API_URL": url})
        with pytest.raises(TestbedError) as ei:
            make(count=1).p.provision()
    _assert_clear(ei.value, "no fresh access token", f"JupyterHub at {url} did not answer within 1 s",
                  where="JupyterHub", fix="Stop My Server")
    assert fake.leaked() == {"leases": 0, "servers": 0, "fips": 0} and not fake.keypairs

def test_oidc_wrong_password_and_no_password(fake: FakeChameleon, clean_env: pytest.MonkeyPatch,
                                             make: Callable[..., Made]) -> None:
    _use_env(clean_env, {**fake.env("oidc"), "OS_PASSWORD": "not-it"})
    m = make(count=1)
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "refused the credentials", "401", "Invalid user credentials", where="Chameleon CHI@UC",
                  fix="Chameleon CLI password")
    assert "not-it" not in ei.value.render()
    assert fake.leaked() == {"leases": 0, "servers": 0, "fips": 0}
    # the openrc reads the password from the terminal: sourced by a script, OS_PASSWORD is empty
    clean_env.setenv("OS_PASSWORD", "")
    n = len(fake.requests)
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "OS_PASSWORD not set", "v3oidcpassword", where="OS_", fix="Chameleon CLI password")
    assert len(fake.requests) == n


def test_os_cloud_from_the_dashboards_clouds_yaml(fake: FakeChameleon, clean_env: pytest.MonkeyPatch,
                                                  make: Callable[..., Made], tb_home: Path) -> None:
    """OS_CLOUD names the application credential's entry in the clouds.yaml the dashboard offers (its auth_url
    has no /v3); no other OS_* variable is needed."""
    cfg = tb_home / "clouds.yaml"
    cfg.write_text(fake.clouds_yaml("chi-uc"))
    _use_env(clean_env, {"OS_CLOUD": "chi-uc", "OS_CLIENT_CONFIG_FILE": str(cfg)})
    m = make(count=1)
    m.p.provision()
    assert ("POST", "/identity/v3/auth/tokens") in fake.requests
    _no_secret_on_disk(tb_home, fake.app_cred[1])
    _destroy_leaves_nothing(m, fake)
    clean_env.setenv("OS_CLOUD", "chi-tacc")
    n = len(fake.requests)
    with pytest.raises(TestbedError) as ei:
        make(count=1).p.provision()
    _assert_clear(ei.value, "OS_CLOUD=chi-tacc", "not found", where=str(cfg), fix="chi-uc")
    assert len(fake.requests) == n


def test_application_credential_ignores_a_stray_project(fake: FakeChameleon, clean_env: pytest.MonkeyPatch,
                                                        make: Callable[..., Made]) -> None:
    """keystone refuses an application credential that asks for a scope; an OS_PROJECT_ID left from an earlier
    openrc (python-chi reads every OS_* variable) must not reach it."""
    import requests

    r = requests.post(f"{fake.base}/identity/v3/auth/tokens", timeout=10, json={"auth": {
        "identity": {"methods": ["application_credential"], "application_credential": {
            "id": fake.app_cred[0], "secret": fake.app_cred[1]}}, "scope": {"project": {"id": fake.project_id}}}})
    assert r.status_code == 401 and "cannot request a scope" in r.json()["error"]["message"]
    _use_env(clean_env, {**fake.env(), "OS_PROJECT_ID": fake.project_id, "OS_PROJECT_NAME": fake.project,
                         "OS_USERNAME": "someone@example.edu"})
    m = make(count=1)
    m.p.provision()
    _destroy_leaves_nothing(m, fake)


def test_unsupported_auth_type_refused_before_any_request(fake: FakeChameleon, clean_env: pytest.MonkeyPatch,
                                                          make: Callable[..., Made]) -> None:
    _use_env(clean_env, {**fake.env(), "OS_AUTH_TYPE": "v3samlpassword"})
    with pytest.raises(TestbedError) as ei:
        make(count=1).p.provision()
    _assert_clear(ei.value, "v3samlpassword", "not supported", where="OS_AUTH_TYPE", fix="application credential")
    assert fake.requests == []


# leases as Blazar answers --------------------------------------------------------------------------------
def test_unknown_node_type_is_no_hosts(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    """Blazar answers a node type it has no hosts of like a full calendar: 500 "Not enough hosts available"."""
    m = make(node_type="compute_skylak")
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "no 3 free compute_skylak nodes", "HTTP 500", "Not enough hosts available",
                  where="blazar", fix="check its spelling")
    assert m.kinds() == {} and not fake.leases
    _destroy_leaves_nothing(m, fake)


def test_lease_longer_than_chameleon_allows(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    end = (datetime.now(UTC) + timedelta(days=8)).strftime("%Y-%m-%d %H:%M")
    m = make(count=1, end=end)
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "longer than Chameleon allows", "HTTP 403", "maximum lease duration", where="blazar",
                  fix="7 days")
    assert not fake.leases
    _destroy_leaves_nothing(m, fake)


def test_lease_refused_by_the_allocation_check(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    fake.allocation_refusal = "Lease would exceed the project's remaining allocation (SUs)."
    m = make()
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "Blazar refused creating the lease", "HTTP 400", "remaining allocation",
                  where="blazar", fix="remaining SUs")
    assert not fake.leases and fake.leaked() == {"leases": 0, "servers": 0, "fips": 0}
    _destroy_leaves_nothing(m, fake)


def test_bad_dates_refused_before_any_request(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    for settings, what in (({"start": "2020-01-01 00:00"}, "start in the past"),
                           ({"start": "2031-01-02 00:00", "end": "2031-01-01 00:00"}, "before it starts"),
                           ({"end": "2021-01-01 00:00"}, "before it starts")):
        with pytest.raises(UsageError) as ei:
            make(count=1, **settings).p.provision()
        assert what in ei.value.what and ei.value.code == 2
    assert fake.requests == []
    with pytest.raises(ValueError, match="start"):  # not Blazar's format: refused with the spec
        make(count=1, start="tomorrow 10am")


def test_degraded_lease_is_reported(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    fake.lease_degraded = True
    m = make(count=1)
    m.p.provision()
    assert any("degraded" in ln and "reservation lost a resource" in ln for ln in m.lines), m.lines
    _destroy_leaves_nothing(m, fake)


def test_lease_wait_backs_off_with_a_clear_progress_line(fake: FakeChameleon, make: Callable[..., Made],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Real pacing (5 s first, growing to 30 s, jittered), recorded instead of slept."""
    from testbed.providers.base import Pacer

    fake.lease_polls = 8
    slept: list[float] = []

    def record(self: Pacer) -> float:
        slept.append(self.next())
        return slept[-1]

    monkeypatch.setattr(Pacer, "sleep", record)
    m = make(count=1)
    m.p.cloud.poll_interval = 5.0
    m.p.settings.lease_timeout = 3600
    m.p.provision()
    lease_pauses = slept[:7]
    assert all(4.0 <= d <= 36.0 for d in lease_pauses), lease_pauses  # x1.5 each time, capped at 30 s, +-20 %
    assert lease_pauses[-1] > lease_pauses[0] * 2 and max(slept) <= 30 * 1.2
    line = next(ln for ln in m.lines if ": STARTING after" in ln)
    assert "Blazar takes minutes" in line and "gives up at 1h 00m" in line
    _destroy_leaves_nothing(m, fake)


def test_backoff_is_bounded_and_jittered(monkeypatch: pytest.MonkeyPatch) -> None:
    import time as _time

    from testbed.providers import base
    from testbed.providers.chameleon.cloud import Cloud

    p = Cloud.__new__(Cloud)  # backoff needs only poll_interval
    p.poll_interval = 5.0
    b = p.backoff(_time.monotonic() + 3600)
    delays = [b.next() for _ in range(12)]
    assert 4.0 <= delays[0] <= 6.0 and all(d <= 36.0 for d in delays) and len({round(d, 3) for d in delays}) > 6
    slept: list[float] = []
    monkeypatch.setattr(base.time, "sleep", slept.append)
    p.backoff(_time.monotonic() + 0.5).sleep()
    assert slept and slept[0] <= 0.5  # never past the deadline


def test_extension_refusals_are_told_apart(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    m = make(count=1, hours=2)
    m.p.provision()
    (lease,) = fake.leases.values()
    fake.extend_conflict = "hosts"
    with pytest.raises(TestbedError) as ei:
        m.p.extend(3)
    _assert_clear(ei.value, "nodes are reserved by someone else", "Not enough hosts available", where="blazar",
                  fix="fewer hours")
    fake.extend_conflict = "fips"
    with pytest.raises(TestbedError) as ei:
        m.p.extend(3)
    _assert_clear(ei.value, "reserved floating IPs are reserved by someone else", "Not enough floating IPs",
                  where="blazar", fix="fewer hours")
    assert "nodes are reserved" not in ei.value.what
    fake.extend_conflict = False
    with pytest.raises(TestbedError) as ei:
        m.p.extend(24 * 7)
    _assert_clear(ei.value, "7 days at most", "HTTP 400", "maximum lease duration", where="blazar",
                  fix="fewer hours")
    fake.update_window = 3600
    with pytest.raises(TestbedError) as ei:
        m.p.extend(1)
    _assert_clear(ei.value, "only close to the lease end", "HTTP 400", where="blazar", fix="nearer the end")
    fake.update_window = None
    lease["status"] = "UPDATING"
    with pytest.raises(TestbedError) as ei:
        m.p.extend(1)
    _assert_clear(ei.value, "changing status", "Invalid lease status.", where="blazar", fix="wait a minute")
    lease["status"] = "ACTIVE"
    assert m.p.extend(1).endswith("Z")
    fake.update_window = 4 * 3600  # inside the window, 7 days count from the current end, not the start
    assert m.p.extend(24 * 7 - 1).endswith("Z")
    _destroy_leaves_nothing(m, fake)


# nova and neutron as they answer ------------------------------------------------------------------------
def test_server_deploy_fails(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    fake.fail_build = {"node1": "Exceeded maximum number of retries. Exhausted all hosts available for retrying "
                                "build failures for instance x."}
    m = make()
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "node1 went to ERROR", "Exceeded maximum number of retries", where="nova",
                  fix=f"testbed provision {NAME}")
    assert "Traceback" not in ei.value.what  # nova hides a code-500 fault's details from users
    _destroy_leaves_nothing(m, fake)


def test_server_that_will_never_be_active_fails_fast(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    fake.stuck_build = {"node0"}

    def hook(line: str) -> None:
        if "node0: BUILD" in line:
            (srv,) = [s for s in fake.servers.values() if s["name"].endswith("node0")]
            srv.update(status="SHUTOFF")

    m = make(count=1, hook=hook)
    m.p.settings.server_timeout = 600
    import time as _time

    t0 = _time.monotonic()
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    assert _time.monotonic() - t0 < 20
    _assert_clear(ei.value, "node0 is SHUTOFF", "will not become ACTIVE", where="nova", fix=f"testbed destroy {NAME}")
    _destroy_leaves_nothing(m, fake)


def test_floating_ip_quota(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    fake.quota_fips = 1
    m = make(count=2, reserve_floating_ips=False)
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    _assert_clear(ei.value, "quota exceeded", "409", "Quota exceeded for resources: ['floatingip']",
                  where="neutron", fix="larger quota")
    _destroy_leaves_nothing(m, fake)


def test_floating_ip_moves_but_not_onto_a_port_that_has_one(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    """neutron moves an associated floating IP to another port; it refuses (409) a port that already has one."""
    import requests

    m = make(count=2, reserve_floating_ips=False)
    m.p.provision()
    tok = next(t for t, proj in fake.tokens.items() if proj)
    a, b = list(fake.fips.values())
    r = requests.put(f"{fake.base}/network/v2.0/floatingips/{a['id']}", headers={"X-Auth-Token": tok},
                     json={"floatingip": {"port_id": b["port_id"]}}, timeout=10)
    assert r.status_code == 409 and r.json()["NeutronError"]["type"] == "FloatingIPPortAlreadyAssociated"
    assert "already has a floating IP" in r.json()["NeutronError"]["message"]
    _destroy_leaves_nothing(m, fake)


# destroy as the services answer --------------------------------------------------------------------------
def test_lease_going_to_error_on_delete_is_reported_at_once(fake: FakeChameleon, make: Callable[..., Made]) -> None:
    import time as _time

    m = make(count=1)
    m.p.provision()
    m.p.cloud.destroy_timeout = 600
    fake.lease_delete_error = True
    t0 = _time.monotonic()
    with pytest.raises(TestbedError) as ei:
        m.p.destroy()
    assert _time.monotonic() - t0 < 20, "waited on a lease in ERROR"
    _assert_clear(ei.value, "left 1 lease", "went to ERROR while being deleted", "Failed to cleanly end lease",
                  where="Chameleon CHI@UC", fix="help desk")
    (lease,) = fake.leases.values()
    assert lease["status"] == "ERROR" and lease["id"] in (ei.value.fix or "")
    assert m.kinds() == {"lease": 1}
    fake.lease_delete_error = False  # ERROR -> DELETING is allowed: destroy again
    _destroy_leaves_nothing(m, fake)


@pytest.mark.parametrize("ends_in_error", [False, True])
def test_lease_delete_that_times_out_in_blazar(fake: FakeChameleon, make: Callable[..., Made],
                                               ends_in_error: bool) -> None:
    """Blazar ends a lease inside the DELETE call; when that RPC call times out the API answers 500 and the
    lease stays DELETING, then goes, or turns ERROR (reported as soon as it does)."""
    m = make(count=1)
    m.p.provision()
    m.p.cloud.destroy_timeout = 600
    fake.lease_delete_polls = 3
    fake.lease_delete_error = ends_in_error
    if not ends_in_error:
        _destroy_leaves_nothing(m, fake)
        assert any("still deleting it" in ln for ln in m.lines)
        return
    with pytest.raises(TestbedError) as ei:
        m.p.destroy()
    _assert_clear(ei.value, "went to ERROR while being deleted", where="Chameleon CHI@UC", fix="help desk")
    assert m.kinds() == {"lease": 1}
    fake.lease_delete_error = False
    fake.lease_delete_polls = 0
    _destroy_leaves_nothing(m, fake)


def test_server_going_to_error_on_delete_is_reported_at_once(fake: FakeChameleon,
                                                             make: Callable[..., Made]) -> None:
    m = make(count=2)
    m.p.provision()
    m.p.cloud.destroy_timeout = 600
    fake.fail_server_delete = {"node1"}
    with pytest.raises(TestbedError) as ei:
        m.p.destroy()
    _assert_clear(ei.value, "left 1 server", "node1", "went to ERROR while being deleted", "Timeout reached",
                  where="Chameleon CHI@UC", fix=f"testbed destroy {NAME}")
    assert m.kinds() == {"server": 1}
    _destroy_leaves_nothing(m, fake)  # nova deletes it on the second try


# Ctrl-C at any moment -------------------------------------------------------------------------------------
@pytest.fixture
def sigint() -> Iterator[None]:
    """Python's own SIGINT handler (ansible-runner, run in-process by earlier tests, swaps in a flag-setter)."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("method,path,nth", [
    ("POST", "/reservation/v1/leases", 1),         # the lease made, its id not yet back
    ("POST", "/compute/v2.1/servers", 2),          # the second server made, its id not yet back
    ("POST", "/network/v2.0/floatingips", 1),      # an address allocated, its id not yet back
    ("PUT", "/network/v2.0/floatingips/", 1),      # an address being attached
    ("GET", "/reservation/v1/leases/", 1),         # while Blazar starts the lease
])
def test_ctrl_c_inside_a_request(fake: FakeChameleon, make: Callable[..., Made], method: str, path: str,
                                 nth: int, sigint: None) -> None:
    """A Ctrl-C that lands while a request is answered (between the service's answer and the state write):
    everything billing is still found and released by destroy."""
    import _thread

    seen: list[str] = []

    def on_request(meth: str, p: str) -> None:
        if meth == method and p.startswith(path):
            seen.append(p)
            if len(seen) == nth:
                _thread.interrupt_main()

    fake.on_request = on_request
    m = make(count=2, reserve_floating_ips=False)
    with pytest.raises(TestbedError) as ei:
        m.p.provision()
    fake.on_request = None
    assert ei.value.code == 130 and "interrupted" in ei.value.what, ei.value.render()
    assert m.store.testbed(NAME)["status"] == "interrupted"
    _destroy_leaves_nothing(m, fake)


def test_ctrl_c_during_destroy_keeps_the_rest_recorded(fake: FakeChameleon, make: Callable[..., Made],
                                                       sigint: None) -> None:
    import _thread

    m = make(count=2)
    m.p.provision()
    fired: list[str] = []

    def on_request(meth: str, p: str) -> None:
        if meth == "DELETE" and p.startswith("/compute/v2.1/servers/") and not fired:
            fired.append(p)
            _thread.interrupt_main()

    fake.on_request = on_request
    with pytest.raises(TestbedError) as ei:
        m.p.destroy()
    fake.on_request = None
    _assert_clear(ei.value, "destroy of", "interrupted", "still recorded", where="Chameleon CHI@UC",
                  fix=f"testbed destroy {NAME}")
    assert ei.value.code == 130 and m.kinds().get("lease") == 1
    _destroy_leaves_nothing(m, fake)


def test_repair_replaces_one_server_on_the_lease_and_rebinds_its_floating_ip(
        fake: FakeChameleon, make: Callable[..., Made]) -> None:
    """The failed host's server is deleted and a new one made on the same lease's reservation; its floating IP is
    bound to the new server; the other server is never touched; the new host key is pinned; nothing leaks."""
    m = make(count=2)
    hosts = {h.name: h for h in m.p.provision()}
    old = {h: hosts[h].facts["server_id"] for h in hosts}
    node_rid = next(r["id"] for r in next(iter(fake.leases.values()))["reservations"]
                    if r["resource_type"] == "physical:host")
    fake.requests.clear()
    done = m.p.repair("node1")
    assert done.hosts == ["node1"] and done.replaced == ["node1"] and done.seconds > 0
    assert done.how == "replaced by a new server on the same lease"
    after = {h.name: h for h in m.store.hosts(NAME)}
    assert after["node0"].facts["server_id"] == old["node0"]
    new = after["node1"].facts["server_id"]
    assert new != old["node1"] and old["node1"] not in fake.servers and new in fake.servers
    assert fake.servers[new]["_reservation"] == node_rid  # on the same lease
    assert after["node1"].address == hosts["node1"].address  # the same floating IP, bound again
    changed = [(meth, p) for meth, p in fake.requests if meth in ("POST", "PUT", "DELETE") and "auth/tokens" not in p]
    assert not [c for c in changed if old["node0"] in c[1]], changed
    assert any(meth == "DELETE" and old["node1"] in p for meth, p in changed), changed
    assert m.kinds() == {"lease": 1, "keypair": 1, "server": 2, "fip": 2}
    r = subprocess.run(["ssh", "-F", str(ssh.ssh_config_path(NAME)), "node1", "id -un"], capture_output=True,
                       text=True, timeout=20)
    assert r.stdout.strip() == "cc", r.stderr
    _destroy_leaves_nothing(m, fake)
