"""End to end through the CLI: the real cloud clients against the fakes, whose machines are real hosts.

The fake Chameleon hands out floating IPs and the fake TPU API worker IPs that belong to local-testbed
hosts, so provision -> status -> exec -> setup/run -> destroy runs over real SSH, and after destroy the
fakes hold nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from localbed import assert_succeeded, chameleon_cloud, invoke, lose_a_host_mid_run, tpu_cloud

pytestmark = pytest.mark.local


E2E_SPEC = ("provider:\n  kind: chameleon\n  site: CHI@UC\n  count: 2\n  image: CC-Ubuntu20.04\n  lease_timeout: 60\n"
            "  server_timeout: 60\n  ssh_timeout: 60\nuser: cc\n")

ENVDUMP = """\
name: envdump
placement: {hosts: 2}
steps:
  launch:
    command: "env > env.txt; echo rank {{ rank }} done"
outputs: [env.txt]
timeouts: {poll: 0.5}
"""


def _plant_secrets(monkeypatch: pytest.MonkeyPatch, where: Path) -> list[str]:
    """Secrets in every form users hold them besides the openrc's OS_* variables: a GCP service-account key,
    gcloud's application-default credentials, a clouds.yaml, tokens in the environment. Returns the values."""
    import secrets

    where.mkdir()
    values = {k: f"{k.lower()}-{secrets.token_hex(8)}" for k in
              ("pem_line", "key_id", "adc_secret", "adc_refresh", "clouds_pw", "github", "hf", "wandb")}
    pem = "MIIEv" + values["pem_line"] + "A" * 40
    values["pem_line"] = pem
    (where / "sa.json").write_text(json.dumps(
        {"type": "service_account", "private_key_id": values["key_id"], "client_email": "sa@p.iam.gserviceaccount.com",
         "private_key": f"-----BEGIN PRIVATE KEY-----\n{pem}\n-----END PRIVATE KEY-----\n"}))
    (where / "gcloud").mkdir()
    (where / "gcloud" / "application_default_credentials.json").write_text(json.dumps(
        {"type": "authorized_user", "client_id": "1-x.apps.googleusercontent.com",
         "client_secret": values["adc_secret"], "refresh_token": values["adc_refresh"]}))
    (where / "clouds.yaml").write_text(f"clouds:\n  other:\n    auth:\n      password: {values['clouds_pw']}\n")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(where / "sa.json"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(where / "gcloud"))
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(where / "clouds.yaml"))
    monkeypatch.setenv("GITHUB_TOKEN", values["github"])
    monkeypatch.setenv("HF_TOKEN", values["hf"])
    monkeypatch.setenv("WANDB_API_KEY", values["wandb"])
    return list(values.values())


def _leaks(roots: list[Path], values: list[str]) -> list[str]:
    """Every file under ``roots`` holding one of ``values`` (as "path: first bytes of the value")."""
    out = []
    for root in roots:
        for p in root.rglob("*"):
            if p.is_file() and not p.is_symlink():
                data = p.read_bytes()
                out += [f"{p}: {v[:10]}…" for v in values if v.encode() in data]
    return out


@pytest.fixture
def bed2(local_testbed) -> Iterator[object]:
    yield local_testbed(hosts=2, name="machines")


def test_chameleon_end_to_end_on_real_hosts(bed2, monkeypatch: pytest.MonkeyPatch) -> None:
    bed = bed2
    with chameleon_cloud(bed, monkeypatch, E2E_SPEC + "profile: datastall-emulator\n") as fake:
        planted = _plant_secrets(monkeypatch, Path(bed.cwd).parent / "planted")
        code, out, exc = invoke("provision", "chameleon", "--json")
        assert code == 0, (out, exc)
        hosts = json.loads(out)["hosts"]
        assert [h["user"] for h in hosts] == ["cc", "cc"]
        assert sorted(h["address"] for h in hosts) == sorted(h.address for h in bed.hosts)
        code, out, _ = invoke("status", "chameleon", "--json")
        assert code == 0 and "lease_end" in json.loads(out)
        code, out, exc = invoke("exec", "chameleon", "--json", "--", "id -un; sudo -n true && echo sudo-ok")
        assert code == 0, (out, exc)
        assert all(r["stdout"].split() == ["cc", "sudo-ok"] for r in json.loads(out))
        from testbed import setup as setup_mod

        if "datastall-emulator" in setup_mod.available_profiles():
            code, out, exc = invoke("setup", "chameleon", "--suite", "datastall-emulator", "--check", "--json")
            assert exc is None or isinstance(exc, SystemExit), (out, exc)
            res = json.loads(out[out.index("{"):])
            assert res["check"] is True
            assert all(h["unreachable"] == 0 for h in res["hosts"].values()), res
        # a run, collected and reported: nothing testbed writes (state home, Ansible artifacts, run logs, results,
        # manifest, reports) holds any of the secrets above
        (Path(bed.cwd) / "experiments").mkdir(exist_ok=True)
        (Path(bed.cwd) / "experiments" / "envdump.yml").write_text(ENVDUMP)
        code, out, exc = invoke("run", "envdump", "--on", "chameleon", "--no-setup", "--collect", "--json")
        assert code == 0, (out, exc)
        code, out, exc = invoke("report", "results")
        assert code == 0, (out, exc)
        assert list(Path(bed.cwd, "results", "envdump").glob("*/*/env.txt"))
        code, out, exc = invoke("destroy", "chameleon", "--yes")
        assert code == 0, (out, exc)
        assert fake.leaked() == {"leases": 0, "servers": 0, "fips": 0}
        assert not _leaks([Path(bed.cwd)], [*planted, fake.app_cred[1]])


def test_tpu_end_to_end_on_real_hosts(bed2, monkeypatch: pytest.MonkeyPatch) -> None:
    bed = bed2
    # a project without a 'default' network: the spec names its VPC
    with tpu_cloud(bed, monkeypatch, "  zone: us-central2-b\n  accelerator_type: v4-16\n  network: lab-vpc\n"
                   "  subnetwork: tpu-sub\nprofile: isca-resnet18\n",
                   networks={"lab-vpc": {"tpu-sub": "us-central2"}}, project_os_login=True) as fake:
        code, out, exc = invoke("provision", "tpu", "--json")
        assert code == 0, (out, exc)
        hosts = json.loads(out)["hosts"]
        assert len(hosts) == 2 and all(h["facts"].get("tpu") for h in hosts)
        assert all(h["user"] == "tpu" for h in hosts)  # the gcp-tpu default: TPU VMs refuse root
        code, out, exc = invoke("exec", "tpu", "--json", "--", "id -un")
        assert code == 0, (out, exc)
        assert [r["stdout"].strip() for r in json.loads(out)] == ["tpu", "tpu"]
        code, out, exc = invoke("run", "isca-resnet18", "--on", "tpu", "--dry-run")
        assert code == 0, (out, exc)
        assert "reproduce_injections.py" in out
        code, out, exc = invoke("destroy", "tpu", "--yes")
        assert code == 0, (out, exc)
        assert not fake.nodes and not fake.qrs


def _survived(evs: list, host: str) -> None:  # type: ignore[type-arg]
    """The run lost ``host`` with no fault fired, repaired it (made anew, with an empty disk: the run uploaded
    to it again, its checkpoint gone with the old disk) and succeeded."""
    repaired = [e for e in evs if e.kind == "repaired" and e.host]
    assert [(e.host, e.detail["replaced"]) for e in repaired] == [(host, [host])]
    assert any(e.kind == "failed" and "host unreachable" in e.detail["reason"] for e in evs)
    assert not any(e.kind == "fault" for e in evs)
    resumed = next(e for e in evs if e.kind == "resumed").detail
    assert resumed["checkpoint"] is None and resumed["resumed_step"] == 0
    assert resumed["why"] == f"the checkpoint lived on {host}, replaced with a new disk"
    assert resumed["steps_lost"] == resumed["last_step"] > 0


def test_chameleon_run_survives_a_lost_node_by_replacing_its_server(bed2, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bare-metal node dies mid-run with no fault fired (nova shows its server ERROR): the run's recovery replaces
    its server on the lease (the fake really deletes it and makes another, the floating IP bound again), uploads the
    run, relaunches."""
    from testbed.state import Store

    bed = bed2
    with chameleon_cloud(bed, monkeypatch, E2E_SPEC, boots=True) as fake:
        code, out, exc = invoke("provision", "chameleon", "--json")
        assert code == 0, (out, exc)
        before = {h["name"]: h["facts"]["server_id"] for h in json.loads(out)["hosts"]}
        status, evs = lose_a_host_mid_run(bed, "chameleon", cloud=fake.node_failed)
        assert_succeeded(status, evs)
        _survived(evs, "node1")
        after = {h.name: h.facts["server_id"] for h in Store.open_default().hosts("chameleon")}
        assert after["node0"] == before["node0"] and after["node1"] != before["node1"]
        assert before["node1"] not in fake.servers and after["node1"] in fake.servers
        code, out, exc = invoke("destroy", "chameleon", "--yes")
        assert code == 0, (out, exc)
        assert fake.leaked() == {"leases": 0, "servers": 0, "fips": 0}


def test_tpu_run_survives_a_lost_worker_by_recreating_its_node(bed2, monkeypatch: pytest.MonkeyPatch) -> None:
    """A TPU VM dies mid-run (the API shows its node TERMINATED): the run's recovery deletes and recreates its node in
    the fake (the other node untouched), the run is uploaded to it and relaunched; destroy leaves the fake empty."""
    bed = bed2
    addrs = [h.address for h in bed.hosts]
    with tpu_cloud(bed, monkeypatch, "  zone: us-central1-f\n  accelerator_type: v2-8\n  count: 2\n",
                   ip_for=lambda node, k: addrs[int(node.rsplit("-", 1)[1]) % len(addrs)], boots=True) as fake:
        code, out, exc = invoke("provision", "tpu", "--json")
        assert code == 0, (out, exc)
        ids = {n: fake.node(n)["id"] for n in ("tpu-0", "tpu-1")}
        status, evs = lose_a_host_mid_run(
            bed, "tpu", cloud=lambda addr: fake.set_state(f"tpu-{addrs.index(addr)}", "TERMINATED"))
        assert_succeeded(status, evs)
        _survived(evs, "tpu-1-w0")
        assert fake.node("tpu-0")["id"] == ids["tpu-0"] and fake.node("tpu-1")["id"] != ids["tpu-1"]
        code, out, exc = invoke("destroy", "tpu", "--yes")
        assert code == 0, (out, exc)
        assert not fake.nodes and not fake.qrs
