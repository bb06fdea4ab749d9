"""Expiry, the dead-man's switch and the ledger.

Unit parts (durations, release times, prices, the ledger from state) need nothing. The switch is tested for real:
the local provider's watchdog destroys a local testbed with no CLI running; against the fake Chameleon and TPU
APIs, whose machines are real local hosts, the agent on those hosts releases every resource with the narrow
credential it was given, after the controller side is gone (its SSH masters closed, no testbed process left).
The fakes listen on the local testbed's bridge address so that its hosts can reach them.
"""

from __future__ import annotations

import calendar
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from localbed import chameleon_cloud, invoke, tpu_cloud

from testbed import expiry
from testbed.expiry import Expiry


def _until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout} s: {what}")


# units -------------------------------------------------------------------------------------------------
def test_durations_parse_and_refuse() -> None:
    assert expiry.parse_duration("8h") == 8 * 3600
    assert expiry.parse_duration("90m") == 5400
    assert expiry.parse_duration("2d") == 2 * 86400
    assert expiry.parse_duration("45s") == 45
    assert expiry.parse_duration(1.5) == 5400
    for bad in ("soon", "0h", "-3h", "31d", "8 hours", ""):
        with pytest.raises(ValueError):
            expiry.parse_duration(bad)


def test_release_time_is_the_earlier_of_deadline_and_idle_limit() -> None:
    e = Expiry(expire_at=1000.0, idle_after=100.0, touched=500.0)
    assert e.release_at() == 600.0
    assert e.release_at(last_run=950.0) == 1000.0  # a run ended late: the hard deadline comes first
    assert Expiry(idle_after=60.0, touched=10.0).release_at(last_run=100.0) == 160.0
    assert Expiry().release_at() is None and not Expiry().active


def test_tpu_prices_per_chip_hour_and_user_override(tmp_path: Path) -> None:
    table = expiry.prices(tmp_path)
    rate, basis = expiry.tpu_rate(table, "v4-16", "us-central2-b", spot=False)
    assert rate == pytest.approx(8 * 3.22) and "8 chips" in basis  # v4-16: 16 cores = 8 chips
    rate, _ = expiry.tpu_rate(table, "v5litepod-8", "us-west4-a", spot=True)
    assert rate == pytest.approx(8 * 0.48)
    (tmp_path / "prices.json").write_text(json.dumps({"tpu": {"v4": {"us-central2": {"on_demand": 1.0}}}}))
    table = expiry.prices(tmp_path)
    assert expiry.tpu_rate(table, "v4-8", "us-central2-b", spot=False)[0] == pytest.approx(4.0)
    assert expiry.tpu_rate(table, "v4-8", "us-central2-b", spot=True)[0] is None  # the user's row has no spot
    assert expiry.tpu_rate(table, "v2-8", "europe-west4-a", spot=False)[0] == pytest.approx(4 * 1.125)
    (tmp_path / "prices.json").write_text("{broken")
    from testbed.errors import TestbedError

    with pytest.raises(TestbedError, match="price overrides"):
        expiry.prices(tmp_path)


def test_ledger_lists_every_testbed_with_resources_cost_and_expiry(tb_home: Path) -> None:
    """Three testbeds recorded as providers record them (no cloud): the ledger shows what each holds, its cost
    and its next release, as a table and as JSON."""
    from testbed.state import Store

    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "tpu.yml").write_text(
        "provider:\n  kind: gcp-tpu\n  project: p\n  zone: us-central2-b\n  accelerator_type: v4-16\n  count: 2\n")
    (tb_home / "inventories" / "cham.yml").write_text("provider:\n  kind: chameleon\n  count: 3\n")
    st = Store.open_default()
    now = time.time()
    st.upsert_testbed("tpu", "gcp-tpu", None, "up", {"zone": "us-central2-b"})
    for i in range(2):
        st.add_resource("tpu", "tpu-node", f"tpu-{i}", name=f"projects/p/locations/us-central2-b/nodes/tpu-{i}")
    st.update_testbed_info("tpu", expiry=Expiry(expire_at=now + 3600, idle_after=600, touched=now,
                                                switch="agent", armed=["tpu-0-w0"]).to_json())
    st.upsert_testbed("cham", "chameleon", None, "up", {"lease_end": "2099-01-01T00:00:00Z", "lease_id": "L1"})
    st.add_resource("cham", "lease", "L1", name="tb-cham", end="2099-01-01T00:00:00Z")
    for i in range(3):
        st.add_resource("cham", "server", f"s{i}", host=f"node{i}")
    st.upsert_testbed("lab1", "lab", None, "up", {})  # holds nothing that bills: its spec is not even loaded
    code, out, exc = invoke("status", "--json")
    assert code == 0, (out, exc)
    data = json.loads(out)
    rows = {r["name"]: r for r in data["testbeds"]}
    assert set(rows) == {"tpu", "cham", "lab1"}
    assert rows["lab1"]["cost"] is None and "note" not in rows["lab1"] and rows["lab1"]["expiry"] is None
    t = rows["tpu"]
    assert [r["id"] for r in t["resources"]] == ["tpu-0", "tpu-1"]
    assert t["cost"]["unit"] == "USD" and t["cost"]["per_hour"] == pytest.approx(2 * 8 * 3.22)
    assert t["expiry"]["switch"] == "agent" and t["expiry"]["idle_after"] == 600
    assert t["expiry"]["release_at"] == expiry.iso(now + 600)  # idle limit before the deadline
    c = rows["cham"]
    assert c["cost"] == {**c["cost"], "unit": "SU", "per_hour": 3.0} and c["lease_end"] == "2099-01-01T00:00:00Z"
    assert c["expiry"] is None
    assert data["totals"]["USD"]["per_hour"] == pytest.approx(2 * 8 * 3.22)
    code, out, exc = invoke("status")
    assert code == 0, (out, exc)
    assert "tpu" in out and "cham" in out and "SU/h" in out and "agent" in out


def _cli(*args: str) -> tuple[int, str]:
    """The real entry point (exit codes and one-message errors as a user sees them)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "testbed", *args], capture_output=True, text=True, timeout=120,
                       check=False)
    return r.returncode, r.stdout + r.stderr


def test_bad_expiry_is_refused_before_anything(tb_home: Path) -> None:
    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "lab1.yml").write_text(
        "provider:\n  kind: lab\n  hosts:\n    - {name: a, address: 127.0.0.1}\nidle_after: 2h\n")
    code, out = _cli("provision", "lab1", "--expire", "soon")
    assert code == 2 and "--expire" in out and "Traceback" not in out
    code, out = _cli("provision", "lab1")
    assert code == 2 and "cannot expire" in out and "Traceback" not in out  # lab machines: not testbed's to release
    code, out = _cli("extend", "lab1")
    assert code == 2 and "--hours or --expire" in out
    from testbed.state import Store

    assert Store.open_default().testbeds() == []


# the local provider's watchdog ---------------------------------------------------------------------------
def _netns_of(bed: object) -> list[str]:
    prov = bed.provider  # type: ignore[attr-defined]
    return [sl.netns for sl in prov.slots() if Path(f"/run/netns/{sl.netns}").exists()]


def test_local_testbed_releases_itself_at_expiry(local_testbed, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESTBED_DEADMAN_INTERVAL", "0.5")
    bed = local_testbed(hosts=2, name="exp")
    os.chdir(bed.cwd)
    code, out, exc = invoke("provision", "exp", "--expire", "6s", "--json")
    assert code == 0, (out, exc)
    assert json.loads(out)["release_at"]
    code, out, _ = invoke("status", "--json")
    row = json.loads(out)["testbeds"][0]
    assert row["expiry"]["switch"] == "watchdog" and row["expiry"]["expire_at"]
    assert len(_netns_of(bed)) == 2
    # nothing of the CLI runs any more; the watchdog (its own session) destroys the testbed at the deadline
    _until(lambda: not _netns_of(bed) and bed.store.testbed("exp") is None, 60, "the local testbed released")


def test_local_idle_limit_waits_for_the_active_run(local_testbed, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESTBED_DEADMAN_INTERVAL", "0.5")
    bed = local_testbed(hosts=2, name="idle")
    os.chdir(bed.cwd)
    spec = json.loads((bed.cwd / "inventories" / "idle.yml").read_text())
    (bed.cwd / "inventories" / "idle.yml").write_text(json.dumps({**spec, "idle_after": "4s"}))
    (bed.cwd / "experiments").mkdir(exist_ok=True)
    (bed.cwd / "experiments" / "sleeper.yml").write_text(
        "name: sleeper\nplacement: {hosts: 2}\nsteps:\n  launch:\n    command: \"sleep 12; echo done\"\n"
        "timeouts: {poll: 0.5}\n")
    code, out, exc = invoke("provision", "idle")
    assert code == 0, (out, exc)
    code, out, exc = invoke("run", "sleeper", "--on", "idle", "--no-setup", "--detach")
    assert code == 0, (out, exc)
    t0 = time.monotonic()
    time.sleep(9)  # twice the idle limit, the run still going: nothing released
    assert len(_netns_of(bed)) == 2 and bed.store.testbed("idle") is not None
    _until(lambda: not _netns_of(bed) and bed.store.testbed("idle") is None, 60, "released after the run")
    assert time.monotonic() - t0 > 12  # not before the run ended
    runs = [r for r in bed.store.runs(10) if r.suite == "sleeper"]
    assert not runs or runs[0].status != "running"


# the agent on cloud hosts, against the fakes ---------------------------------------------------------------
def _http(method: str, url: str, body: object = None, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, {**dict(r.headers), "_body": r.read().decode()}
    except urllib.error.HTTPError as e:
        return e.code, {"_body": e.read().decode()}


def _agent_config(bed, host: str) -> dict:
    r = bed.provider.console(host, "cat /var/lib/testbed-deadman/config.json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _close_controller_side(name: str, hosts: list[str]) -> None:
    """What 'the laptop is gone' leaves: no SSH master of testbed's runs on this machine."""
    from testbed import remote

    remote.close_connections(name, hosts)


def test_chameleon_expired_testbed_releases_itself(local_testbed, monkeypatch: pytest.MonkeyPatch) -> None:
    bed = local_testbed(hosts=2, name="machines")
    monkeypatch.setenv("TESTBED_DEADMAN_INTERVAL", "0.5")
    with chameleon_cloud(bed, monkeypatch, gateway=True) as fake:
        # a restricted application credential (keystone's default) cannot make the switch's: refused up front
        code, out = _cli("provision", "chameleon", "--expire", "40s")
        assert code == 2 and "unrestricted" in out, out
        assert fake.leaked() == {"leases": 0, "servers": 0, "fips": 0}
        fake.app_cred_unrestricted = True
        code, out, exc = invoke("provision", "chameleon", "--expire", "40s", "--json")
        assert code == 0, (out, exc)
        lease = next(iter(fake.leases.values()))
        assert lease["end_date"] < (time.strftime("%Y-%m-%dT%H:%M", time.gmtime(time.time() + 7 * 60)))
        assert len(fake.app_creds) == 1
        hosts = [h.name for h in bed.hosts]
        cfg = _agent_config(bed, hosts[0])
        assert {m for m, _ in cfg["requests"]} == {"DELETE"} and len(cfg["requests"]) == 3  # lease + 2 servers
        # the credential on the host can do nothing else: no reading, no other lease, no new credential
        status, hdrs = _http("POST", f"{cfg['auth']['auth_url']}/auth/tokens", {"auth": {"identity": {
            "methods": ["application_credential"],
            "application_credential": {"id": cfg["auth"]["id"], "secret": cfg["auth"]["secret"]}}}})
        assert status == 201
        tok = {"X-Auth-Token": hdrs["X-Subject-Token"]}
        assert _http("GET", f"{fake.base}/compute/v2.1/servers/detail", headers=tok)[0] == 401
        assert _http("DELETE", f"{fake.base}/reservation/v1/leases/someone-elses", headers=tok)[0] == 401
        assert _http("POST", f"{fake.base}/identity/v3/users/u1/application_credentials",
                     {"application_credential": {"name": "x"}}, headers=tok)[0] == 403
        code, out, _ = invoke("status", "--json")
        row = next(r for r in json.loads(out)["testbeds"] if r["name"] == "chameleon")
        assert row["cost"]["unit"] == "SU" and row["expiry"]["switch"] == "agent"
        # extend: a later expiry moves the lease end with it (Blazar's update); an earlier one reaches the agents
        code, out, exc = invoke("extend", "chameleon", "--expire", "2h")
        assert code == 0 and "lease of chameleon now ends" in out, (out, exc)
        assert lease["end_date"] >= time.strftime("%Y-%m-%dT%H:%M", time.gmtime(time.time() + 7190))
        code, out, exc = invoke("extend", "chameleon", "--expire", "15s")
        assert code == 0 and "not told" not in out, (out, exc)
        code, out, exc = invoke("status", "chameleon", "--json", "--probe")
        assert code == 0 and "(agent)" in json.loads(out)["next_release"], (out, exc)
        assert all(v.startswith("alive, releases at") for v in json.loads(out)["agents"].values()), out
        deadline = json.loads(bed.provider.console(hosts[0], "cat /var/lib/testbed-deadman/deadline.json").stdout)
        assert deadline["expire_at"] < time.time() + 16
        _close_controller_side("chameleon", hosts)
        # no controller: the agents release everything at the deadline
        _until(lambda: not fake.leases, 120, "the agents deleted the lease")
        assert any(bed.provider.console(h, "cat /var/lib/testbed-deadman/released.json").returncode == 0
                   for h in hosts)  # released by an agent (nothing else deletes a lease before its end)
        assert ("DELETE", f"/reservation/v1/leases/{lease['id']}") in fake.requests
        fake.settle()
        assert fake.leaked() == {"leases": 0, "servers": 0, "fips": 0}
        code, out, exc = invoke("destroy", "chameleon", "--yes")  # forgets it, and revokes the credential
        assert code == 0, (out, exc)
        assert fake.app_creds == {}
        leaked = [p for p in Path(bed.cwd).rglob("*") if p.is_file() and not p.is_symlink()
                  and cfg["auth"]["secret"].encode() in p.read_bytes()]
        assert not leaked  # the switch's secret went to the hosts only (stdin of SSH), never to a file here


REAPER_TPU = "  zone: us-central2-b\n  accelerator_type: v4-16\n  service_account: reaper@p.iam.gserviceaccount.com\n"


def _tpu_env(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    from testbed.providers.gcp_tpu import cloud, provider, wait

    monkeypatch.setenv(cloud.ANONYMOUS_ENV, "1")
    monkeypatch.setenv("TESTBED_TPU_METADATA_URL",
                       f"{endpoint}/computeMetadata/v1/instance/service-accounts/default/token")
    monkeypatch.setenv("TESTBED_DEADMAN_INTERVAL", "0.5")
    monkeypatch.setattr(provider, "Polling", lambda: wait.FAST_POLLING)


def test_tpu_expired_testbed_deletes_itself(local_testbed, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("google.cloud.tpu_v2")
    bed = local_testbed(hosts=2, name="machines")
    with tpu_cloud(bed, monkeypatch, REAPER_TPU, gateway=True) as fake:
        endpoint = fake.endpoint
        _tpu_env(monkeypatch, endpoint)
        fake.service_accounts["reaper@p.iam.gserviceaccount.com"] = [
            ("tpu.nodes.delete", "projects/p/locations/us-central2-b/nodes/tpu-")]
        code, out, exc = invoke("provision", "tpu", "--expire", "30s", "--json")
        assert code == 0, (out, exc)
        assert fake.node("tpu-0")["serviceAccount"]["email"] == "reaper@p.iam.gserviceaccount.com"
        hosts = [h["name"] for h in json.loads(out)["hosts"]]
        # the node's token (from the metadata server, as the agent gets it) may delete, not read or create
        status, _ = _http("GET", f"{endpoint}/computeMetadata/v1/instance/service-accounts/default/token",
                             headers={"Metadata-Flavor": "Google"})
        assert status == 404  # this machine is no TPU VM
        r = bed.provider.console(bed.hosts[0].name, (
            "python3 -c \"import json,urllib.request as u;"
            f"r=u.Request('{endpoint}/computeMetadata/v1/instance/service-accounts/default/token',"
            "headers={'Metadata-Flavor':'Google'});print(json.load(u.urlopen(r))['access_token'])\""))
        assert r.returncode == 0, r.stderr
        bearer = {"Authorization": f"Bearer {r.stdout.strip()}"}
        assert _http("GET", f"{endpoint}/v2/projects/p/locations/us-central2-b/nodes", headers=bearer)[0] == 403
        assert _http("DELETE", f"{endpoint}/v2/projects/p/locations/us-central2-b/nodes/other",
                     headers=bearer)[0] == 403
        code, out, _ = invoke("status", "--json")
        row = next(r for r in json.loads(out)["testbeds"] if r["name"] == "tpu")
        assert row["cost"]["unit"] == "USD" and row["cost"]["per_hour"] == pytest.approx(8 * 3.22)
        _close_controller_side("tpu", hosts)
        _until(lambda: all(r["json"]["state"] == "DELETING" for r in fake.nodes.values()), 120,
               "the agent deleted the node")
        assert any(bed.provider.console(h.name, "cat /var/lib/testbed-deadman/released.json").returncode == 0
                   for h in bed.hosts)
        fake.settle()
        assert not fake.nodes and not fake.qrs
        code, out, exc = invoke("destroy", "tpu", "--yes")
        assert code == 0, (out, exc)


def test_tpu_expiry_needs_a_service_account(tb_home: Path) -> None:
    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "tpu.yml").write_text(
        "provider:\n  kind: gcp-tpu\n  project: p\n  endpoint: http://127.0.0.1:9\nexpire: 2h\n")
    code, out = _cli("provision", "tpu")
    assert code == 2 and "service_account" in out and "Traceback" not in out


def test_tpu_idle_limit_waits_for_the_active_run(local_testbed, monkeypatch: pytest.MonkeyPatch) -> None:
    """idle_after on the fake TPU: a run on the hosts holds the release (the agent sees its ranks), with no
    controller side at all; released after the run ends and the idle limit passes."""
    pytest.importorskip("google.cloud.tpu_v2")
    bed = local_testbed(hosts=2, name="machines")
    with tpu_cloud(bed, monkeypatch, REAPER_TPU + "idle_after: 5s\n", gateway=True) as fake:
        _tpu_env(monkeypatch, fake.endpoint)
        fake.service_accounts["reaper@p.iam.gserviceaccount.com"] = [
            ("tpu.nodes.delete", "projects/p/locations/us-central2-b/nodes/tpu-")]
        (Path(bed.cwd) / "experiments").mkdir(exist_ok=True)
        (Path(bed.cwd) / "experiments" / "sleeper.yml").write_text(
            "name: sleeper\nplacement: {hosts: 2}\nsteps:\n  launch:\n    command: \"sleep 25; echo done\"\n"
            "timeouts: {poll: 0.5}\n")
        code, out, exc = invoke("provision", "tpu", "--json")
        assert code == 0, (out, exc)
        hosts = [h["name"] for h in json.loads(out)["hosts"]]
        code, out, exc = invoke("run", "sleeper", "--on", "tpu", "--no-setup", "--detach")
        assert code == 0, (out, exc)
        t0 = time.monotonic()
        from testbed.state import Store

        def launched() -> bool:  # every host runs its rank (the supervisor has done its part)
            return all(bed.provider.console(h.name, "ls /home/tpu/.testbed-runs/*/rank*.pid").returncode == 0
                       for h in bed.hosts)

        _until(launched, 30, "the ranks running on the hosts")
        run = next(r for r in Store.open_default().runs(5) if r.suite == "sleeper")
        sup = run.info.supervisor.pid if run.info.supervisor else None
        assert sup
        os.kill(sup, 9)  # the controller side of the run, gone: only the hosts know the run goes on
        _close_controller_side("tpu", hosts)
        time.sleep(10)  # twice the idle limit while the ranks run: nothing deleted
        assert fake.nodes and all(r["json"]["state"] == "READY" for r in fake.nodes.values())
        _until(lambda: all(r["json"]["state"] == "DELETING" for r in fake.nodes.values()), 120,
               "the agent deleted the node after the run")
        assert time.monotonic() - t0 > 28  # the ranks run 25 s from after t0, then the idle limit (5 s)
        fake.settle()
        assert not fake.nodes and not fake.qrs


def test_switch_off_stops_the_watchdog(local_testbed, monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed import deadman

    monkeypatch.setenv("TESTBED_DEADMAN_INTERVAL", "0.5")
    bed = local_testbed(hosts=1, name="off")
    os.chdir(bed.cwd)
    code, out, exc = invoke("provision", "off", "--expire", "20s")
    assert code == 0, (out, exc)
    t0 = time.monotonic()
    pid = deadman._watchdog_pid("off")
    assert pid is not None
    code, out, exc = invoke("extend", "off", "--hours", "1")
    assert code == 0 and "expires at" in out, (out, exc)
    code, out, exc = invoke("extend", "off", "--off")
    assert code == 0 and "switch off" in out, (out, exc)
    def gone() -> bool:  # exited (a zombie of this test process, its parent here, counts)
        try:
            return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z"
        except OSError:
            return True

    _until(gone, 10, "the watchdog gone")
    time.sleep(max(0.0, t0 + 22 - time.monotonic()))  # past the first deadline: nothing released
    assert len(_netns_of(bed)) == 1 and bed.store.testbed("off") is not None
    code, out, _ = invoke("status", "--json")
    assert json.loads(out)["testbeds"][0]["expiry"] is None


def test_orphans_are_found_at_the_provider(tb_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node labelled for a testbed but not in state (an interrupted command, or a state row lost) is listed with
    the command that releases it; a recorded node is not an orphan."""
    pytest.importorskip("google.cloud.tpu_v2")
    from fakes.tpu_api import FakeTpuApi

    from testbed.state import Store

    with FakeTpuApi() as fake:
        _tpu_env(monkeypatch, fake.endpoint)
        (tb_home / "inventories").mkdir()
        for name in ("tpu", "gone"):
            (tb_home / "inventories" / f"{name}.yml").write_text(
                f"provider:\n  kind: gcp-tpu\n  project: p\n  zone: us-central2-b\n  accelerator_type: v2-8\n"
                f"  endpoint: {fake.endpoint}\n")
        node = {"acceleratorType": "v2-8", "runtimeVersion": "tpu-vm-base"}
        for nid, tb in (("tpu-0", "tpu"), ("tpu-1", "tpu"), ("gone-0", "gone"), ("other", "someone")):
            status, _ = _http("POST", f"{fake.endpoint}/v2/projects/p/locations/us-central2-b/nodes?nodeId={nid}",
                              {**node, "labels": {"testbed": tb}})
            assert status == 200
        st = Store.open_default()
        st.upsert_testbed("tpu", "gcp-tpu", None, "up", {})
        st.add_resource("tpu", "tpu-node", "tpu-0")  # recorded; tpu-1 is not
        code, out, exc = invoke("status", "--orphans", "--json")
        assert code == 0, (out, exc)
        found = {(o["testbed"], o["id"]): o for o in json.loads(out)["orphans"]}
        assert set(found) == {("tpu", "tpu-1"), ("gone", "gone-0")}
        assert found[("gone", "gone-0")]["release"].startswith("gcloud compute tpus tpu-vm delete gone-0 --zone")
        code, out, exc = invoke("status", "--orphans")
        assert code == 0 and "gone-0" in out and "orphans" in out, (out, exc)


def test_a_past_expiry_is_not_reused(tb_home: Path) -> None:
    from testbed import deadman
    from testbed.errors import UsageError
    from testbed.spec import TestbedSpec

    spec = TestbedSpec(name="x", provider={"kind": "local"}, idle_after="1h")
    old = Expiry(expire_at=time.time() - 5, touched=time.time() - 100, switch="watchdog")
    with pytest.raises(UsageError, match="expired at"):
        deadman.planned(spec, None, old)
    e = deadman.planned(spec, "2h", old)
    assert e is not None and e.expire_at and e.expire_at > time.time() + 7000 and e.idle_after == 3600
    assert deadman.planned(TestbedSpec(name="x", provider={"kind": "local"}), None, None) is None


def test_tpu_release_plan_for_queued_resources(tb_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A queued resource is deleted with force (its nodes with it); nodes outside one one by one."""
    pytest.importorskip("google.cloud.tpu_v2")
    from testbed.handle import Testbed
    from testbed.providers.gcp_tpu import cloud

    monkeypatch.setenv(cloud.ANONYMOUS_ENV, "1")
    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "q.yml").write_text(
        "provider:\n  kind: gcp-tpu\n  project: p\n  zone: us-central2-b\n  accelerator_type: v4-8\n"
        "  endpoint: http://127.0.0.1:9\n  queued_resource: true\n  service_account: r@p.iam.gserviceaccount.com\n")
    tb = Testbed.open("q")
    tb.store.upsert_testbed("q", "gcp-tpu", None, "up", {})
    tb.store.add_resource("q", cloud.QUEUED_RESOURCE, "q-qr")
    tb.store.add_resource("q", cloud.NODE, "q-0", queued_resource="q-qr")
    tb.store.add_resource("q", cloud.NODE, "loose")
    plan = tb.provider().switch_release(Expiry(expire_at=time.time() + 60))
    assert plan["requests"] == [
        ["DELETE", "http://127.0.0.1:9/v2/projects/p/locations/us-central2-b/queuedResources/q-qr?force=true"],
        ["DELETE", "http://127.0.0.1:9/v2/projects/p/locations/us-central2-b/nodes/loose"]]
    assert plan["auth"]["type"] == "gce-metadata" and "metadata.google.internal" in plan["auth"]["url"]


def test_chameleon_lease_end_is_the_first_switch(local_testbed, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new lease ends no later than the expiry (Blazar's own mechanism): when the site's clock passes its end,
    Blazar alone takes the servers and addresses back, agent or not."""
    bed = local_testbed(hosts=2, name="machines")
    spec = "provider:\n  kind: chameleon\n  count: 2\n  hours: 48\n  ssh_timeout: 60\nuser: cc\nexpire: 2m\n"
    with chameleon_cloud(bed, monkeypatch, spec, gateway=True) as fake:
        fake.app_cred_unrestricted = True
        code, out, exc = invoke("provision", "chameleon")
        assert code == 0, (out, exc)
        lease = next(iter(fake.leases.values()))
        end, start = (calendar.timegm(time.strptime(lease[k][:16], "%Y-%m-%dT%H:%M")) for k in ("end_date",
                                                                                              "start_date"))
        assert 5 * 60 <= end - start <= 7 * 60  # not 48 h: the expiry (at least Blazar's 5 min)
        assert fake.leaked()["servers"] == 2
        fake.advance(8 * 60)
        _http("GET", f"{fake.base}/identity/v3")  # any request: the site notices the time
        assert fake.leaked() == {"leases": 0, "servers": 0, "fips": 0} and lease["status"] == "TERMINATED"
        code, out, exc = invoke("destroy", "chameleon", "--yes")
        assert code == 0, (out, exc)
        assert fake.app_creds == {} and not fake.leases


def test_chameleon_orphan_lease_is_listed_and_destroy_releases_it(tb_home: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A lease made by a provision interrupted before its id came back: listed as an orphan with the command that
    releases it, and that command leaves the site empty."""
    pytest.importorskip("chi")
    from fakes.chameleon_api import FakeChameleon

    from testbed.handle import Testbed

    fake = FakeChameleon().start()
    try:
        for k in [k for k in os.environ if k.startswith("OS_")]:
            monkeypatch.delenv(k)
        for k, v in fake.env().items():
            monkeypatch.setenv(k, v)
        (tb_home / "inventories").mkdir()
        (tb_home / "inventories" / "cham.yml").write_text("provider:\n  kind: chameleon\n  count: 1\nuser: cc\n")
        p = Testbed.open("cham").provider()
        api = p.cloud.connect()
        lease = api.lease_create(p.lease_name, start="now", end=time.strftime("%Y-%m-%d %H:%M",
                                 time.gmtime(time.time() + 3600)), node_type="compute_skylake", count=1, fips=0)
        code, out, exc = invoke("status", "--orphans", "--json")  # no state row at all: the OpenStack client
        assert code == 0, (out, exc)
        assert json.loads(out)["orphans"] == [{"testbed": "cham", "kind": "lease", "id": lease["id"],
                                               "release": f"openstack reservation lease delete {lease['id']}"}]
        p.store.upsert_testbed("cham", "chameleon", None, "interrupted", {})  # a provision interrupted
        code, out, exc = invoke("status", "--orphans", "--json")
        assert code == 0, (out, exc)
        assert [(o["testbed"], o["kind"], o["id"]) for o in json.loads(out)["orphans"]] == [
            ("cham", "lease", lease["id"])]
        release = json.loads(out)["orphans"][0]["release"]
        assert release.startswith("testbed destroy cham")
        code, out, exc = invoke(*release.split(" (")[0].split()[1:], "--yes")
        assert code == 0, (out, exc)
        assert fake.leaked() == {"leases": 0, "servers": 0, "fips": 0}
    finally:
        fake.stop()


def test_a_command_restarts_the_idle_clock(local_testbed, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESTBED_DEADMAN_INTERVAL", "0.5")
    bed = local_testbed(hosts=1, name="busy")
    os.chdir(bed.cwd)
    spec = json.loads((bed.cwd / "inventories" / "busy.yml").read_text())
    (bed.cwd / "inventories" / "busy.yml").write_text(json.dumps({**spec, "idle_after": "12s"}))
    code, out, exc = invoke("provision", "busy")
    assert code == 0, (out, exc)
    t0 = time.monotonic()
    for _ in range(4):  # a command every 5 s (plus its own time): never 12 s idle
        time.sleep(5)
        code, out, exc = invoke("exec", "busy", "--", "true")
        assert code == 0, (out, exc)
    assert len(_netns_of(bed)) == 1 and bed.store.testbed("busy") is not None  # over 20 s: past the limit
    _until(lambda: bed.store.testbed("busy") is None, 60, "released once idle")
    assert time.monotonic() - t0 > 20 + 12


def test_agent_sees_a_run_being_set_up_running_and_ended(tmp_path: Path) -> None:
    """The host-side check, on a folder laid out as tb-rank.sh lays it out."""
    import importlib.util
    import subprocess

    spec = importlib.util.spec_from_file_location("agent", Path(expiry.__file__).parent / "scripts" /
                                                  "deadman_agent.py")
    assert spec and spec.loader
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    home = tmp_path / "home" / "u"
    run = home / ".testbed-runs" / "r1"
    run.mkdir(parents=True)
    assert agent.run_active(homes=[str(home)])  # uploaded, no rank yet: being set up
    assert not agent.run_active(now=time.time() + agent.SETUP_GRACE + 1, homes=[str(home)])  # a set-up long dead
    proc = subprocess.Popen(["sleep", "30"])
    try:
        (run / "rank0.pid").write_text(str(proc.pid))
        assert agent.run_active(homes=[str(home)])
        (run / "rank0.exit").write_text("0")
        assert not agent.run_active(homes=[str(home)])
        (run / "rank0.exit").unlink()
    finally:
        proc.kill()
        proc.wait()
    assert not agent.run_active(homes=[str(home)])  # its process gone without an exit file (a killed host)


def test_a_repaired_host_gets_the_switch_and_its_credential_names_the_new_server(
        local_testbed, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server replaced by a repair has no agent, and the switch's credential may delete only the old one: the
    switch is armed again (a new credential naming the new server, the old one deleted, every host told)."""
    from testbed.handle import Testbed

    bed = local_testbed(hosts=2, name="machines")
    with chameleon_cloud(bed, monkeypatch, boots=True, gateway=True) as fake:
        fake.app_cred_unrestricted = True
        code, out, exc = invoke("provision", "chameleon", "--expire", "2h", "--json")
        assert code == 0, (out, exc)
        old_cred = next(iter(fake.app_creds))
        old_server = next(h.facts["server_id"] for h in Testbed.open("chameleon").hosts if h.name == "node1")
        bed.provider.kill_host("node1")
        done = Testbed.open("chameleon").repair("node1", setup=False)
        assert done.replaced == ["node1"]
        new_server = next(h.facts["server_id"] for h in Testbed.open("chameleon").hosts if h.name == "node1")
        assert new_server != old_server and list(fake.app_creds) != [old_cred] and len(fake.app_creds) == 1
        for machine in ("node0", "node1"):  # both agents hold the new credential and its requests
            cfg = _agent_config(bed, machine)
            urls = [u for _, u in cfg["requests"]]
            assert any(u.endswith(f"/servers/{new_server}") for u in urls), urls
            assert not any(u.endswith(f"/servers/{old_server}") for u in urls), urls
        code, out, exc = invoke("destroy", "chameleon", "--yes")
        assert code == 0, (out, exc)
        assert fake.leaked() == {"leases": 0, "servers": 0, "fips": 0} and fake.app_creds == {}


@pytest.mark.parametrize("name", ["deadman_agent.py", "deadman_ctl.py"])
def test_host_side_scripts_stay_python_36(name: str) -> None:
    """The agent and its control run in the host's own python3 (3.6 on the oldest images): their types are
    type comments (mypy checks them strictly), never annotations a 3.6 interpreter would evaluate."""
    import ast

    src = (Path(__file__).resolve().parents[1] / "testbed" / "scripts" / name).read_text()
    tree = ast.parse(src, feature_version=(3, 6), type_comments=True)
    funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    assert funcs and all(f.type_comment for f in funcs), [f.name for f in funcs if not f.type_comment]
    annotated = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.AnnAssign | ast.arg) and n.annotation]
    assert annotated == [] and "from __future__ import annotations" not in src
