"""The GCP TPU provider: the real google-cloud-tpu client (REST) against a fake TPU API on 127.0.0.1.

The fake's workers answer SSH on loopback addresses 127.0.20.1-16 where one real sshd (started here, as root)
listens; the fake writes the keys of each node's ``ssh-keys`` metadata to that sshd's authorized_keys.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fakes.tpu_api import DEFAULT_POOL, FakeTpuApi

from testbed import ssh
from testbed.errors import TestbedError, UsageError
from testbed.providers.gcp_tpu import ANONYMOUS_ENV, FAST_POLLING, QUEUED_RESOURCE, TpuProvider
from testbed.providers.settings import TpuSettings
from testbed.spec import TestbedSpec
from testbed.state import Store

ROOT = Path(__file__).resolve().parents[1]
SSHD = "/usr/sbin/sshd"


# fixtures ---------------------------------------------------------------------------------------------
def _tcp_up(addr: str, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if ssh.tcp_open(addr, 22, timeout=0.3):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="session")
def tpu_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One real sshd on 127.0.20.1-16:22 (the fake's TPU workers); yields its authorized_keys file."""
    if os.geteuid() != 0 or not os.access(SSHD, os.X_OK) or shutil.which("ssh-keyscan") is None:
        pytest.skip("needs root, openssh-server and openssh-client")
    d = tmp_path_factory.mktemp("tpu-sshd")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")], check=True)
    ak = d / "authorized_keys"
    ak.write_text("")
    conf = d / "sshd_config"
    conf.write_text("\n".join([
        "Port 22", *[f"ListenAddress {a}" for a in DEFAULT_POOL], f"HostKey {d / 'host_key'}",
        f"AuthorizedKeysFile {ak}", "StrictModes no", "UsePAM no", f"PidFile {d / 'sshd.pid'}",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "MaxStartups 100:30:200", "UseDNS no", "PrintMotd no", ""]))
    Path("/run/sshd").mkdir(exist_ok=True)
    subprocess.run([SSHD, "-f", str(conf), "-E", str(d / "sshd.log")], check=True)
    try:
        if not _tcp_up(DEFAULT_POOL[0], time.monotonic() + 10):
            pytest.skip(f"sshd did not listen on {DEFAULT_POOL[0]}:22: {(d / 'sshd.log').read_text()[-300:]}")
        yield ak
    finally:
        pid_file = d / "sshd.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass


@dataclass
class Bed:
    """A fake TPU API, a state store and a way to build providers for one test."""

    fake: FakeTpuApi
    store: Store
    lines: list[str] = field(default_factory=list)
    made: list[TpuProvider] = field(default_factory=list)

    def provider(self, name: str = "tb", progress: Callable[[str], None] | None = None,
                 **settings: object) -> TpuProvider:
        kw: dict[str, object] = {"project": "proj", "zone": "us-central1-f", "accelerator_type": "v2-8",
                                 "endpoint": self.fake.endpoint, "create_timeout": 20, "ssh_timeout": 10}
        kw.update(settings)
        spec = TestbedSpec(name=name, provider=TpuSettings(**kw), user="root")  # type: ignore[arg-type]
        p = TpuProvider(spec, self.store, progress or self.lines.append, polling=FAST_POLLING)
        self.made.append(p)
        return p

    def creates(self) -> int:
        return sum(1 for m, p in self.fake.api_requests() if m == "POST")


@pytest.fixture
def bed(tb_home: Path, tpu_sshd: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bed]:
    monkeypatch.setenv(ANONYMOUS_ENV, "1")
    tpu_sshd.write_text("")
    fake = FakeTpuApi(authorized_keys=tpu_sshd)
    fake.start()
    b = Bed(fake, Store(tb_home / ".testbed" / "state.db"))
    try:
        yield b
    finally:
        for p in b.made:  # never leak, whatever the test did
            try:
                p.progress = lambda _: None
                p.destroy()
            except TestbedError:
                pass
        fake.stop()


def _ssh_true(p: TpuProvider, host: str) -> subprocess.CompletedProcess[str]:
    cfg = ssh.ssh_config_path(p.name)
    return subprocess.run(["ssh", "-F", str(cfg), host, "true"], capture_output=True, text=True, timeout=20)


def _assert_nothing_left(b: Bed, p: TpuProvider) -> None:
    assert b.fake.node_ids() == []
    assert b.fake.qr_ids() == []
    assert b.store.resources(p.name) == []
    assert b.store.testbed(p.name) is None


# happy paths -----------------------------------------------------------------------------------------
def test_single_v2_8_provision_status_ssh_destroy(bed: Bed) -> None:
    p = bed.provider()
    t0 = time.monotonic()
    hosts = p.provision()
    assert time.monotonic() - t0 < 15
    assert [h.name for h in hosts] == ["tb-0-w0"]
    h = hosts[0]
    assert h.address == DEFAULT_POOL[0] and h.user == "root" and h.groups == ["master"]
    assert h.facts["tpu"] is True and h.facts["accelerator_type"] == "v2-8" and h.facts["worker"] == 0
    # the node was asked for with the testbed key in metadata and testbed labels
    node = bed.fake.node("tb-0")
    _, pub = ssh.ensure_keypair("tb")
    assert node["metadata"]["ssh-keys"] == f"root:{pub}"
    assert node["labels"] == {"testbed": "tb", "managed-by": "testbed"}
    assert node["state"] == "READY"
    # state: hosts, ids, files
    assert [x.name for x in bed.store.hosts("tb")] == ["tb-0-w0"]
    assert [r["id"] for r in bed.store.resources("tb")] == ["tb-0"]
    assert bed.store.testbed("tb")["status"] == "up"
    assert ssh.inventory_path("tb").exists()
    assert "tb-0-w0" in ssh.known_hosts_path("tb").read_text()
    # status and refresh
    st = p.status()
    assert st["nodes"] == [{"node": "tb-0", "state": "READY", "health": "HEALTHY", "workers": 1,
                            "accelerator_type": "v2-8", "queued_resource": ""}]
    assert [x.state for x in p.refresh()] == ["up"]
    assert p.describe()["nodes"] == ["tb-0"]
    # plain ssh with the generated config
    r = _ssh_true(p, "tb-0-w0")
    assert r.returncode == 0, r.stderr
    p.destroy()
    _assert_nothing_left(bed, p)


def test_multi_host_v4_32_slice_is_four_hosts(bed: Bed) -> None:
    p = bed.provider(accelerator_type="v4-32", zone="us-central2-b")
    hosts = p.provision()
    assert [h.name for h in hosts] == [f"tb-0-w{k}" for k in range(4)]
    assert [h.address for h in hosts] == DEFAULT_POOL[:4]
    # the workers reach each other at their internal IPs (runs get those as MASTER_ADDR), the controller at these
    assert all(h.mesh_address == h.facts["internal_ip"] != h.address for h in hosts)
    assert [h.facts["worker"] for h in hosts] == [0, 1, 2, 3]
    assert all(h.facts["workers"] == 4 and h.facts["tpu"] for h in hosts)
    assert hosts[0].groups == ["master"] and hosts[3].groups == ["workers"]
    for h in hosts:
        r = _ssh_true(p, h.name)
        assert r.returncode == 0, (h.name, r.stderr)
    assert p.status()["nodes"][0]["workers"] == 4
    p.destroy()
    _assert_nothing_left(bed, p)


def test_two_nodes_and_internal_ips(bed: Bed) -> None:
    p = bed.provider(count=2, internal_ips=True, spot=True)
    hosts = p.provision()
    assert [h.name for h in hosts] == ["tb-0-w0", "tb-1-w0"]
    assert all(h.address == h.facts["internal_ip"] and not h.facts["external_ip"] for h in hosts)
    assert bed.fake.node("tb-1")["schedulingConfig"] == {"spot": True}
    assert bed.fake.node("tb-1")["networkConfig"].get("enableExternalIps", False) is False
    p.destroy()
    _assert_nothing_left(bed, p)


def test_queued_resource_waits_for_active(bed: Bed) -> None:
    p = bed.provider(queued_resource=True, spot=True, count=2)
    hosts = p.provision()
    assert [h.name for h in hosts] == ["tb-0-w0", "tb-1-w0"]
    qr_lines = [ln for ln in bed.lines if ln.startswith("queued resource tb-qr:")]
    states = [ln.split(": ")[1].split(" ")[0] for ln in qr_lines]
    assert states[1:] == ["WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"], qr_lines
    assert bed.fake.qr_ids() == ["tb-qr"] and bed.fake.node_ids() == ["tb-0", "tb-1"]
    assert {r["kind"] for r in bed.store.resources("tb")} == {QUEUED_RESOURCE, "tpu-node"}
    assert p.status()["queued_resources"] == [{"queued_resource": "tb-qr", "state": "ACTIVE"}]
    assert _ssh_true(p, "tb-1-w0").returncode == 0
    p.destroy()
    _assert_nothing_left(bed, p)


def test_reprovision_is_idempotent(bed: Bed) -> None:
    p = bed.provider(accelerator_type="v4-32")
    first = p.provision()
    posts = bed.creates()
    second = bed.provider(accelerator_type="v4-32").provision()
    assert bed.creates() == posts  # nothing created, nothing deleted
    assert not [r for r in bed.fake.api_requests() if r[0] == "DELETE"]
    assert [h.to_dict() for h in first] == [h.to_dict() for h in second]
    assert bed.fake.node_ids() == ["tb-0"]
    p.destroy()
    _assert_nothing_left(bed, p)


def test_destroy_twice_and_destroy_of_vanished_resources(bed: Bed) -> None:
    p = bed.provider()
    p.provision()
    p.destroy()
    n = len(bed.fake.api_requests())
    p.destroy()  # nothing recorded: no API call at all
    assert len(bed.fake.api_requests()) == n
    # a resource recorded in state but already gone in the cloud: NotFound is "gone"
    bed.store.upsert_testbed("tb", "gcp-tpu", None, "up")
    bed.store.add_resource("tb", "tpu-node", "tb-0", name="x")
    bed.store.add_resource("tb", QUEUED_RESOURCE, "tb-qr", name="y")
    p.destroy()
    _assert_nothing_left(bed, p)


# failure matrix -----------------------------------------------------------------------------------------
MESSAGES: dict[str, str] = {}


def _record(case: str, e: TestbedError) -> None:
    MESSAGES[case] = e.render()
    print(f"\n[{case}]\n{e.render()}")


def test_resource_exhausted(bed: Bed) -> None:
    bed.fake.fail_next_create(429, "RESOURCE_EXHAUSTED")
    p = bed.provider()
    with pytest.raises(TestbedError) as ei:
        p.provision()
    e = ei.value
    _record("RESOURCE_EXHAUSTED", e)
    assert e.what.startswith("no TPU capacity or quota for v2-8 in us-central1-f")
    assert "another zone" in (e.fix or "") and "Traceback" not in e.render()
    assert bed.store.resources("tb") == []  # refused: nothing was created, nothing recorded
    assert bed.store.testbed("tb")["status"] == "failed"
    p.destroy()
    _assert_nothing_left(bed, p)


def test_resource_exhausted_on_queued_resource(bed: Bed) -> None:
    bed.fake.fail_next_create(429, "RESOURCE_EXHAUSTED", "Quota 'TPUV4sPodPerProjectPerZone' exceeded")
    p = bed.provider(queued_resource=True)
    with pytest.raises(TestbedError, match=r"no TPU capacity or quota.*Quota 'TPUV4sPod"):
        p.provision()
    p.destroy()
    _assert_nothing_left(bed, p)


def test_operation_ends_in_error(bed: Bed) -> None:
    bed.fake.fail_next_operation(13, "Internal error: TPU host failed to boot")
    p = bed.provider()
    with pytest.raises(TestbedError) as ei:
        p.provision()
    e = ei.value
    _record("operation error", e)
    assert e.what.startswith("the operation to create TPU node tb-0 ended in error: InternalServerError")
    assert "failed to boot" in e.what
    assert bed.fake.node_ids() == ["tb-0"]  # the failed create left a TERMINATED node behind...
    assert [r["id"] for r in bed.store.resources("tb")] == ["tb-0"]  # ...which state knows about
    p.destroy()
    _assert_nothing_left(bed, p)


def test_node_stuck_creating_times_out(bed: Bed) -> None:
    bed.fake.stuck.add("tb-0")
    p = bed.provider(create_timeout=5)
    t0 = time.monotonic()
    with pytest.raises(TestbedError) as ei:
        p.provision()
    assert 5 <= time.monotonic() - t0 < 10
    e = ei.value
    _record("stuck CREATING", e)
    assert e.what == "TPU node(s) not READY after 5 s: tb-0 (CREATING)"
    assert "testbed destroy tb" in (e.fix or "")
    p.destroy()  # deleting a CREATING node works
    _assert_nothing_left(bed, p)


def test_a_changed_host_key_is_refused_unless_testbed_remade_the_node(bed: Bed) -> None:
    """The pin policy of the provider base: a key that differs from the pin is refused while the node is the same
    one; once testbed itself recreates the node (preempted), the new key replaces the pin."""
    p = bed.provider(spot=True)
    p.provision()
    kh = ssh.known_hosts_path("tb")
    real = kh.read_text()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(kh.parent / "other")],
                   capture_output=True, check=True)
    forged = (kh.parent / "other.pub").read_text().split()
    kh.write_text(f"tb-0-w0 {forged[0]} {forged[1]}\n")  # as if another machine had answered at first
    with pytest.raises(TestbedError) as ei:
        p.provision()
    _record("host key changed", ei.value)
    assert "host key of tb-0-w0 changed since it was pinned" in ei.value.what
    assert "testbed forget-host tb tb-0-w0" in (ei.value.fix or "")
    assert kh.read_text().split() == ["tb-0-w0", *forged[:2]]  # the pin is untouched
    bed.fake.preempt("tb-0")
    p.provision()  # testbed deletes and recreates the node: its new key is pinned
    assert kh.read_text() == real
    assert _ssh_true(p, "tb-0-w0").returncode == 0
    p.destroy()
    _assert_nothing_left(bed, p)


def test_preemption_during_a_run_is_reported_and_recreated(bed: Bed) -> None:
    p = bed.provider(spot=True)
    p.provision()
    keys_before = ssh.known_hosts_path("tb").read_text()
    # a run is going on the worker when the node is preempted
    run = subprocess.Popen(ssh.ssh_argv("tb", "tb-0-w0", "sleep 1; echo done", mux="none"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    bed.fake.preempt("tb-0")
    hosts = p.refresh()
    assert [(h.name, h.state) for h in hosts] == [("tb-0-w0", "preempted")]
    assert bed.store.hosts("tb")[0].state == "preempted"
    assert p.status()["nodes"][0]["state"] == "PREEMPTED"
    run.communicate(timeout=20)
    print(f"\n[preemption]\nrefresh: {[(h.name, h.state) for h in hosts]}; status: {p.status()['nodes'][0]}")
    # provision deletes and recreates the preempted node
    deletes_before = sum(1 for m, _ in bed.fake.api_requests() if m == "DELETE")
    hosts = p.provision()
    assert sum(1 for m, _ in bed.fake.api_requests() if m == "DELETE") == deletes_before + 1
    assert any("PREEMPTED; deleting it to create it again" in ln for ln in bed.lines)
    assert [h.state for h in hosts] == ["up"] and [h.state for h in p.refresh()] == ["up"]
    assert bed.fake.node("tb-0")["state"] == "READY"
    assert ssh.known_hosts_path("tb").read_text().count("tb-0-w0") == keys_before.count("tb-0-w0")
    assert _ssh_true(p, "tb-0-w0").returncode == 0
    p.destroy()
    _assert_nothing_left(bed, p)


def test_transient_unavailable_is_retried(bed: Bed) -> None:
    bed.fake.fail_next("GET", "UNAVAILABLE", "backend unavailable", times=2, path="/nodes/tb-0")
    p = bed.provider()
    assert [h.name for h in p.provision()] == ["tb-0-w0"]
    p.destroy()
    _assert_nothing_left(bed, p)


def test_permission_denied(bed: Bed) -> None:
    bed.fake.fail_next("POST", "PERMISSION_DENIED", "Permission 'tpu.nodes.create' denied on 'projects/proj'")
    p = bed.provider()
    with pytest.raises(TestbedError) as ei:
        p.provision()
    _record("PERMISSION_DENIED", ei.value)
    assert ei.value.what.startswith("permission denied to create TPU node tb-0")
    assert "roles/tpu.admin" in (ei.value.fix or "")
    assert bed.store.resources("tb") == []
    p.destroy()
    _assert_nothing_left(bed, p)


def test_deadline_exceeded_on_create_keeps_the_id_for_destroy(bed: Bed) -> None:
    bed.fake.fail_next("POST", "DEADLINE_EXCEEDED", "Deadline expired before operation could complete")
    p = bed.provider()
    with pytest.raises(TestbedError) as ei:
        p.provision()
    _record("DEADLINE_EXCEEDED", ei.value)
    assert "did not answer in time" in ei.value.what
    # ambiguous: the node may exist, so its id stays recorded and destroy checks (NotFound = gone)
    assert [r["id"] for r in bed.store.resources("tb")] == ["tb-0"]
    p.destroy()
    _assert_nothing_left(bed, p)


def test_unreachable_endpoint(bed: Bed) -> None:
    p = bed.provider(endpoint="http://127.0.0.1:9")
    with pytest.raises(TestbedError) as ei:
        p.provision()
    _record("endpoint unreachable", ei.value)
    assert "TPU API is unavailable" in ei.value.what and "provider.endpoint" in (ei.value.fix or "")
    assert "Traceback" not in ei.value.render()


def test_fewer_nodes_in_the_spec_deletes_the_surplus(bed: Bed) -> None:
    bed.provider(count=2).provision()
    hosts = bed.provider(count=1).provision()
    assert [h.name for h in hosts] == ["tb-0-w0"]
    assert bed.fake.node_ids() == ["tb-0"] and [r["id"] for r in bed.store.resources("tb")] == ["tb-0"]
    bed.provider(count=1).destroy()
    assert bed.fake.node_ids() == []


def test_preempted_queued_resource_is_asked_again(bed: Bed) -> None:
    p = bed.provider(queued_resource=True, spot=True)
    p.provision()
    bed.fake.preempt("tb-0")
    assert [h.state for h in p.refresh()] == ["preempted"]
    hosts = p.provision()
    assert any("deleting it to ask again" in ln for ln in bed.lines)
    assert [h.state for h in hosts] == ["up"] and bed.fake.node("tb-0")["state"] == "READY"
    assert _ssh_true(p, "tb-0-w0").returncode == 0
    p.destroy()
    _assert_nothing_left(bed, p)


def test_destroy_while_the_api_is_down_then_again(bed: Bed) -> None:
    p = bed.provider()
    p.provision()
    bed.fake.fail_next("DELETE", "UNAVAILABLE", "The service is currently unavailable")
    with pytest.raises(TestbedError) as ei:
        p.destroy()
    _record("destroy while API down", ei.value)
    assert ei.value.what.startswith("could not delete TPU resource(s) tb-0: the TPU API is unavailable")
    assert "run 'testbed destroy tb' again" in (ei.value.fix or "")
    assert bed.store.testbed("tb")["status"] == "destroy-failed"
    assert [r["id"] for r in bed.store.resources("tb")] == ["tb-0"]
    p.destroy()
    _assert_nothing_left(bed, p)


def test_worker_that_never_answers_ssh(bed: Bed) -> None:
    bed.fake.ip_for = lambda node, k: "127.0.21.1"  # nothing listens there
    p = bed.provider(ssh_timeout=5)
    with pytest.raises(TestbedError) as ei:
        p.provision()
    _record("no SSH", ei.value)
    assert "TPU worker tb-0-w0 at 127.0.21.1:22 did not answer SSH within" in ei.value.what
    p.destroy()
    _assert_nothing_left(bed, p)


def test_ctrl_c_mid_provision(bed: Bed) -> None:
    def interrupt(line: str) -> None:
        bed.lines.append(line)
        if "create requested" in line:  # right after the API returned the operation
            raise KeyboardInterrupt

    p = bed.provider(accelerator_type="v4-32", progress=interrupt)
    with pytest.raises(TestbedError) as ei:
        p.provision()
    e = ei.value
    _record("Ctrl-C", e)
    assert e.code == 130
    assert "interrupted; 1 TPU resource(s) were requested" in e.what
    assert "testbed destroy tb" in (e.fix or "")
    assert bed.store.testbed("tb")["status"] == "interrupted"
    assert bed.fake.node_ids() == ["tb-0"]
    p.destroy()
    _assert_nothing_left(bed, p)


def test_ctrl_c_while_queued(bed: Bed) -> None:
    def interrupt(line: str) -> None:
        if "WAITING_FOR_RESOURCES" in line:
            raise KeyboardInterrupt

    p = bed.provider(queued_resource=True, progress=interrupt)
    with pytest.raises(TestbedError, match="interrupted"):
        p.provision()
    assert bed.fake.qr_ids() == ["tb-qr"]
    p.destroy()
    _assert_nothing_left(bed, p)


# configuration and credentials ------------------------------------------------------------------------
def test_missing_adc_is_refused_before_any_request(bed: Bed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from google.auth.compute_engine import _metadata

    monkeypatch.delenv(ANONYMOUS_ENV)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    monkeypatch.setattr(_metadata, "_NO_GCE_CHECK", True)  # never ask a metadata server
    p = bed.provider()
    with pytest.raises(TestbedError) as ei:
        p.provision()
    _record("missing ADC", ei.value)
    assert "Application Default Credentials" in ei.value.what
    assert "gcloud auth application-default login" in (ei.value.fix or "")
    assert bed.fake.api_requests() == []
    assert bed.store.testbed("tb") is None


def test_endpoint_needs_a_scheme(bed: Bed) -> None:
    p = bed.provider(endpoint=bed.fake.endpoint.removeprefix("http://"))
    with pytest.raises(UsageError, match="has no scheme") as ei:
        p.provision()
    assert "http://" in (ei.value.fix or "") and "provider.endpoint" in (ei.value.where or "")
    assert bed.fake.api_requests() == []


def test_anonymous_needs_an_endpoint(tb_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ANONYMOUS_ENV, "1")
    spec = TestbedSpec(name="tb", provider=TpuSettings(project="p"), user="root")
    with pytest.raises(UsageError, match=ANONYMOUS_ENV):
        TpuProvider(spec, Store(tb_home / "s.db")).provision()


def test_import_does_not_load_the_sdk() -> None:
    code = ("import sys, testbed.providers.gcp_tpu, testbed.providers.gcp_tpu_errors; "
            "bad = [m for m in sys.modules if m.startswith(('google.cloud.tpu_v2', 'google.api_core', 'google.auth', "
            "'grpc'))]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


def test_missing_extra_is_one_message_with_the_install_command(bed: Bed, monkeypatch: pytest.MonkeyPatch) -> None:
    """No google-cloud-tpu in this environment: a usage error naming `pip install 'testbed[tpu]'`, no request made
    (and, for chameleon, the same with python-chi)."""
    import sys

    from testbed.errors import UsageError

    monkeypatch.setitem(sys.modules, "google.cloud.tpu_v2", None)  # what a missing module looks like to find_spec
    p = bed.provider()
    with pytest.raises(UsageError) as e:
        p.provision()
    assert "pip install 'testbed[tpu]'" in (e.value.fix or "") and "tpu" in e.value.what
    assert bed.fake.api_requests() == []
    monkeypatch.setitem(sys.modules, "chi", None)
    from testbed.providers.chameleon_chi import Chi, Credentials

    with pytest.raises(UsageError) as e:
        Chi(Credentials("http://127.0.0.1:1/v3", "v3applicationcredential", None), site="CHI@UC")
    assert "pip install 'testbed[chameleon]'" in (e.value.fix or "")
