"""The GCP TPU provider: the real google-cloud-tpu client (REST) against a fake TPU API on 127.0.0.1.

The fake's workers answer SSH on loopback addresses 127.A.B.1-16 (a free net per test process) where one real sshd
(started here, as root) listens as a TPU VM's does: root may not log in, and the fake's guest agent writes the keys
of each node's ``ssh-keys`` metadata for their (non-root) user. That user ('tpu') exists only in the sshd's own
mount namespace (a private copy of /etc/passwd), so this machine's accounts are untouched.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fakes.tpu_api import DEFAULT_POOL, FakeTpuApi

from testbed import ssh
from testbed.errors import TestbedError, UsageError
from testbed.providers.gcp_tpu.cloud import ANONYMOUS_ENV, QUEUED_RESOURCE
from testbed.providers.gcp_tpu.provider import TpuProvider
from testbed.providers.gcp_tpu.settings import TpuSettings
from testbed.providers.gcp_tpu.wait import FAST_POLLING
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


TPU_USERS = ("tpu", "alice")  # the login users a test's nodes may name (the guest agent would make them)


@pytest.fixture(scope="session")
def tpu_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One real sshd on 127.A.B.1-16:22 (the fake's TPU workers, a free net per test process), root login refused as
    on a TPU VM; yields the
    directory of per-user authorized keys (``<dir>/<user>``) the fake's guest agent writes."""
    if os.geteuid() != 0 or not os.access(SSHD, os.X_OK) or shutil.which("ssh-keyscan") is None \
            or shutil.which("unshare") is None:
        pytest.skip("needs root, openssh-server, openssh-client and unshare")
    d = tmp_path_factory.mktemp("tpu-sshd")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")], check=True)
    # sshd reads a user's keys (and enters the home) as that user: outside pytest's root-only temp directory
    shared = Path(tempfile.mkdtemp(prefix="tb-tpu-users-"))
    shared.chmod(0o755)
    keys = shared / "keys"
    keys.mkdir()
    # the users exist for this sshd only: a copy of passwd/group bind-mounted in its private mount namespace
    taken = {u.pw_uid for u in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    ids = [i for i in range(61000, 62000) if i not in taken][:len(TPU_USERS)]
    passwd, group = Path("/etc/passwd").read_text(), Path("/etc/group").read_text()
    for user, uid in zip(TPU_USERS, ids, strict=True):
        home = shared / f"home-{user}"
        home.mkdir()
        os.chown(home, uid, uid)
        passwd += f"{user}:x:{uid}:{uid}:{user}:{home}:/bin/bash\n"
        group += f"{user}:x:{uid}:\n"
    (d / "passwd").write_text(passwd)
    (d / "group").write_text(group)
    conf = d / "sshd_config"
    conf.write_text("\n".join([
        "Port 22", *[f"ListenAddress {a}" for a in DEFAULT_POOL], f"HostKey {d / 'host_key'}",
        f"AuthorizedKeysFile {keys}/%u", "StrictModes no", "UsePAM no", f"PidFile {d / 'sshd.pid'}",
        "PermitRootLogin no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "MaxStartups 100:30:200", "UseDNS no", "PrintMotd no", ""]))
    Path("/run/sshd").mkdir(exist_ok=True)
    subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    f"mount --bind {d / 'passwd'} /etc/passwd && mount --bind {d / 'group'} /etc/group && "
                    f"exec {SSHD} -f {conf} -E {d / 'sshd.log'}"], check=True)
    try:
        if not _tcp_up(DEFAULT_POOL[0], time.monotonic() + 10):
            pytest.skip(f"sshd did not listen on {DEFAULT_POOL[0]}:22: {(d / 'sshd.log').read_text()[-300:]}")
        yield keys
    finally:
        pid_file = d / "sshd.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
        shutil.rmtree(shared, ignore_errors=True)


@dataclass
class Bed:
    """A fake TPU API, a state store and a way to build providers for one test."""

    fake: FakeTpuApi
    store: Store
    lines: list[str] = field(default_factory=list)
    made: list[TpuProvider] = field(default_factory=list)

    def provider(self, name: str = "tb", progress: Callable[[str], None] | None = None, user: str | None = None,
                 **settings: object) -> TpuProvider:
        kw: dict[str, object] = {"project": "proj", "zone": "us-central1-f", "accelerator_type": "v2-8",
                                 "endpoint": self.fake.endpoint, "create_timeout": 20, "ssh_timeout": 10}
        kw.update(settings)
        extra = {"user": user} if user else {}  # none: the provider's default user (tpu)
        spec = TestbedSpec(name=name, provider=TpuSettings(**kw), **extra)  # type: ignore[arg-type]
        p = TpuProvider(spec, self.store, progress or self.lines.append, polling=FAST_POLLING)
        self.made.append(p)
        return p

    def creates(self) -> int:
        return sum(1 for m, p in self.fake.api_requests() if m == "POST")


@pytest.fixture
def bed(tb_home: Path, tpu_sshd: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bed]:
    monkeypatch.setenv(ANONYMOUS_ENV, "1")
    for f in tpu_sshd.iterdir():
        f.unlink()
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
    assert h.address == DEFAULT_POOL[0] and h.user == "tpu" and h.groups == ["master"]
    assert h.facts["tpu"] is True and h.facts["accelerator_type"] == "v2-8" and h.facts["worker"] == 0
    # the node was asked for with the testbed key in metadata and testbed labels
    node = bed.fake.node("tb-0")
    _, pub = ssh.ensure_keypair("tb")
    assert node["metadata"] == {"ssh-keys": f"tpu:{pub}", "enable-oslogin": "FALSE"}
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
    # several nodes in one queued resource are a multislice request: v4 or later (a v2-8 pair is refused)
    p = bed.provider(queued_resource=True, spot=True, count=2, accelerator_type="v4-8", zone="us-central2-b")
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
    assert "interrupted; 1 TPU resource requested" in e.what
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
    code = ("import sys, testbed.providers.gcp_tpu.provider, testbed.providers.gcp_tpu.errors; "
            "bad = [m for m in sys.modules if m.startswith(('google.cloud.tpu_v2', 'google.api_core', 'google.auth', "
            "'grpc'))]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


def test_missing_extra_is_one_message_with_the_install_command(bed: Bed, monkeypatch: pytest.MonkeyPatch) -> None:
    """No google-cloud-tpu in this environment: a usage error naming the install command of this project's
    distribution with the extra (from where it was installed; never PyPI's unrelated "testbed"), no request made
    (and, for chameleon, the same with python-chi)."""
    import sys

    from testbed.errors import UsageError

    monkeypatch.setitem(sys.modules, "google.cloud.tpu_v2", None)  # what a missing module looks like to find_spec
    p = bed.provider()
    with pytest.raises(UsageError) as e:
        p.provision()
    from testbed.distribution import install_command

    assert install_command("tpu") in (e.value.fix or "") and "tpu" in e.value.what  # from the checkout, as run
    assert bed.fake.api_requests() == []
    monkeypatch.setitem(sys.modules, "chi", None)
    from testbed.providers.chameleon.chi import Chi, Credentials

    with pytest.raises(UsageError) as e:
        Chi(Credentials("http://127.0.0.1:1/v3", "v3applicationcredential", None), site="CHI@UC")
    assert install_command("chameleon") in (e.value.fix or "")


# the fake refuses what the real service refuses (checked with raw requests and with the real client) ------------
def _raw(fake: FakeTpuApi, method: str, path: str, body: dict[str, object] | None = None) -> tuple[int, dict]:
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"{fake.endpoint}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:  # loopback only: the fake
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


P = "/v2/projects/proj/locations/us-central2-b"
NODE_BODY = {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base"}


@pytest.mark.parametrize("spec,status,fragment", [
    ([], "INVALID_ARGUMENT", "exactly one"),
    ([{"parent": P[4:], "nodeId": "a-0", "node": NODE_BODY}] * 2, "INVALID_ARGUMENT", "exactly one"),
    ([{"parent": P[4:], "nodeId": "a-0", "multisliceParams": {"nodeCount": 2}, "node": NODE_BODY}],
     "INVALID_ARGUMENT", "exactly one of node_id"),
    ([{"parent": P[4:], "node": NODE_BODY}], "INVALID_ARGUMENT", "exactly one of node_id"),
    ([{"parent": P[4:], "multisliceParams": {"nodeCount": 1}, "node": NODE_BODY}], "INVALID_ARGUMENT", "> 1"),
    ([{"parent": P[4:], "multisliceParams": {"nodeCount": 2},
       "node": {**NODE_BODY, "acceleratorType": "v2-8"}}], "INVALID_ARGUMENT", "unable to complete"),
    ([{"parent": P[4:], "nodeId": "a-0", "node": {**NODE_BODY, "networkConfig": {"network": "nope"}}}],
     "INVALID_ARGUMENT", "does not exist"),
    ([{"parent": P[4:], "nodeId": "a-0", "node": {**NODE_BODY, "networkConfig": {
        "subnetwork": "projects/proj/regions/europe-west4/subnetworks/default"}}}], "INVALID_ARGUMENT", "region"),
], ids=["no-spec", "two-specs", "id-and-multislice", "neither", "count-1", "multislice-v2", "no-network",
        "subnet-elsewhere"])
def test_fake_refuses_queued_resources_the_service_refuses(spec: list, status: str, fragment: str) -> None:
    with FakeTpuApi() as fake:
        code, out = _raw(fake, "POST", f"{P}/queuedResources?queuedResourceId=a", {"tpu": {"nodeSpec": spec}})
        assert (code, out["error"]["status"]) == (400, status), out
        assert fragment in out["error"]["message"]
        assert fake.qr_ids() == [] and fake.node_ids() == []


def test_fake_speaks_like_the_service() -> None:
    """Enums by number when asked (the client always asks); multislice node names; delete needs force while a
    queued resource has nodes; the guest agent never installs root's key, nor any key under OS Login."""
    installed: list[tuple[str, str]] = []
    with FakeTpuApi(qr_waiting=0, qr_provisioning=0, authorized_keys=lambda a, u, k: installed.append((a, u)),
                    project_os_login=True) as fake:
        body = {"tpu": {"nodeSpec": [{"parent": P[4:], "multisliceParams": {"nodeCount": 2},
                                      "node": {**NODE_BODY, "metadata": {"ssh-keys": "root:k1\ntpu:k2"}}}]}}
        assert _raw(fake, "POST", f"{P}/queuedResources?queuedResourceId=ms", body)[0] == 200
        code, qr = _raw(fake, "GET", f"{P}/queuedResources/ms?$alt=json;enum-encoding=int")
        assert code == 200 and qr["state"]["state"] == 6  # ACTIVE
        assert fake.node_ids() == ["ms-0", "ms-1"]  # no prefix given: the queued resource's id
        code, node = _raw(fake, "GET", f"{P}/nodes/ms-0?$alt=json;enum-encoding=int")
        assert (node["state"], node["health"], node["multisliceNode"]) == (2, 1, True)
        assert _raw(fake, "GET", f"{P}/nodes/ms-0")[1]["state"] == "READY"
        assert installed == []  # the project enables OS Login and the node does not turn it off
        code, out = _raw(fake, "DELETE", f"{P}/queuedResources/ms")
        assert (code, out["error"]["status"]) == (400, "FAILED_PRECONDITION")
        assert _raw(fake, "DELETE", f"{P}/queuedResources/ms?force=true")[0] == 200
        body = {**NODE_BODY, "metadata": {"ssh-keys": "root:k1\ntpu:k2", "enable-oslogin": "FALSE"}}
        assert _raw(fake, "POST", f"{P}/nodes?nodeId=one", body)[0] == 200
        for _ in range(3):
            _raw(fake, "GET", f"{P}/nodes/one")
        assert installed == [(DEFAULT_POOL[2], "tpu")]  # tpu's key only: root's never


# the login user, OS Login --------------------------------------------------------------------------------------
def test_root_is_refused_before_any_request(bed: Bed, tmp_path: Path) -> None:
    from testbed.spec import load_testbed

    spec = tmp_path / "tpu-root.yml"
    spec.write_text(f"provider:\n  kind: gcp-tpu\n  project: proj\n  endpoint: {bed.fake.endpoint}\nuser: root\n")
    with pytest.raises(UsageError) as ei:
        load_testbed(str(spec))
    _record("user root (spec)", ei.value)
    assert "TPU VMs refuse SSH logins as root" in ei.value.what and ei.value.where == f"{spec}:5"
    spec.write_text(f"provider:\n  kind: gcp-tpu\n  project: proj\n  endpoint: {bed.fake.endpoint}\n")
    assert load_testbed(str(spec)).user == "tpu"  # the default for gcp-tpu
    p = bed.provider(user="root")  # a spec built in code (or recorded before this rule): the provider refuses
    with pytest.raises(UsageError) as ei:
        p.provision()
    _record("user root (provider)", ei.value)
    assert "cannot log in on a TPU VM" in ei.value.what and "user: tpu" in (ei.value.fix or "")
    assert bed.fake.api_requests() == [] and bed.store.testbed("tb") is None


def test_the_worker_refuses_root_even_with_the_testbed_key(bed: Bed) -> None:
    p = bed.provider(user="alice")
    [h] = p.provision()
    assert h.user == "alice" and bed.fake.node("tb-0")["metadata"]["ssh-keys"].startswith("alice:")
    assert _ssh_true(p, "tb-0-w0").returncode == 0
    cfg = ssh.ssh_config_path(p.name)
    r = subprocess.run(["ssh", "-F", str(cfg), "-l", "root", "tb-0-w0", "true"], capture_output=True, text=True,
                       timeout=20)
    assert r.returncode == 255 and "Permission denied" in r.stderr
    p.destroy()
    _assert_nothing_left(bed, p)


def test_project_os_login_is_turned_off_for_the_node(bed: Bed) -> None:
    """OS Login on in the project's metadata ignores metadata keys; the node's enable-oslogin=FALSE overrides it."""
    bed.fake.project_os_login = True
    p = bed.provider()
    p.provision()
    assert bed.fake.node("tb-0")["metadata"]["enable-oslogin"] == "FALSE"
    assert _ssh_true(p, "tb-0-w0").returncode == 0
    p.destroy()
    _assert_nothing_left(bed, p)


def test_os_login_required_by_organization_policy(bed: Bed) -> None:
    bed.fake.require_os_login = True
    p = bed.provider()
    with pytest.raises(TestbedError) as ei:
        p.provision()
    _record("OS Login required", ei.value)
    assert "enforces OS Login" in ei.value.what and "requireOsLogin" in (ei.value.fix or "")
    assert bed.store.resources("tb") == [] and bed.fake.node_ids() == []
    p.destroy()
    _assert_nothing_left(bed, p)


def test_keys_never_installed_is_one_login_message(bed: Bed) -> None:
    """OS Login enforced after all (metadata keys ignored, the create not refused): the login fails with a fix
    that names OS Login, and destroy releases the node."""
    bed.fake.authorized_keys = None  # the guest agent installs nothing
    p = bed.provider(ssh_timeout=5)
    with pytest.raises(TestbedError) as ei:
        p.provision()
    _record("keys never installed", ei.value)
    assert "cannot log in to TPU worker tb-0-w0" in ei.value.what and "Permission denied" in ei.value.what
    assert "OS Login" in (ei.value.fix or "") and "testbed destroy tb" in (ei.value.fix or "")
    p.destroy()
    _assert_nothing_left(bed, p)


# queued resources as the v2 API takes them ----------------------------------------------------------------------
def _qr_body(fake: FakeTpuApi) -> dict:
    return next(b for m, path, b in fake.bodies if m == "POST" and path.endswith("/queuedResources"))


def test_multislice_request_for_several_nodes(bed: Bed) -> None:
    p = bed.provider(queued_resource=True, count=3, accelerator_type="v5litepod-8", zone="us-west4-a",
                     create_timeout=600)
    hosts = p.provision()
    assert [h.name for h in hosts] == ["tb-0-w0", "tb-1-w0", "tb-2-w0"]
    body = _qr_body(bed.fake)
    [spec] = body["tpu"]["nodeSpec"]
    assert "nodeId" not in spec and spec["multisliceParams"] == {"nodeCount": 3, "nodeIdPrefix": "tb"}
    assert body["queueingPolicy"] == {"validUntilDuration": "600s"}  # never fulfilled after testbed gave up
    assert "guaranteed" not in body and "spot" not in body  # on demand: no tier, as gcloud asks
    assert bed.fake.node("tb-2")["multisliceNode"] is True
    p.destroy()
    _assert_nothing_left(bed, p)


def test_multislice_of_v2_is_refused_before_any_request(bed: Bed) -> None:
    p = bed.provider(queued_resource=True, count=2)
    with pytest.raises(UsageError) as ei:
        p.provision()
    _record("multislice v2", ei.value)
    assert "v4 and later only, not v2-8" in ei.value.what and "provider.queued_resource" in (ei.value.where or "")
    assert bed.fake.api_requests() == []


def test_single_node_queued_resource_uses_node_id(bed: Bed) -> None:
    p = bed.provider(queued_resource=True)
    p.provision()
    [spec] = _qr_body(bed.fake)["tpu"]["nodeSpec"]
    assert spec["nodeId"] == "tb-0" and "multisliceParams" not in spec
    p.destroy()
    _assert_nothing_left(bed, p)


def test_failed_queued_resource_shows_the_service_reason(bed: Bed) -> None:
    def fail_it(line: str) -> None:
        bed.lines.append(line)
        if "WAITING_FOR_RESOURCES" in line:
            bed.fake.fail_qr("tb-qr", 8, "There is no more capacity in the zone us-central1-f for v2-8")

    p = bed.provider(queued_resource=True, progress=fail_it)
    t0 = time.monotonic()
    with pytest.raises(TestbedError) as ei:
        p.provision()
    assert time.monotonic() - t0 < 10  # at once, not at create_timeout
    _record("queued resource FAILED", ei.value)
    assert ei.value.what == ("queued resource tb-qr is FAILED: ResourceExhausted: There is no more capacity in the "
                             "zone us-central1-f for v2-8")
    assert p.status()["queued_resources"] == [{"queued_resource": "tb-qr", "state": "FAILED", "reason": (
        "ResourceExhausted: There is no more capacity in the zone us-central1-f for v2-8")}]
    p.progress = bed.lines.append
    hosts = p.provision()  # asks again: the FAILED one is deleted first
    assert any("FAILED (ResourceExhausted" in ln and "deleting it to ask again" in ln for ln in bed.lines)
    assert [h.state for h in hosts] == ["up"]
    p.destroy()
    _assert_nothing_left(bed, p)


def test_queued_resource_given_up_on_expires_in_the_queue(bed: Bed) -> None:
    """Cost safety: after testbed stops waiting, the request cannot turn into billing nodes hours later."""
    bed.fake.qr_stuck.add("tb-qr")
    p = bed.provider(queued_resource=True, create_timeout=5)
    with pytest.raises(TestbedError) as ei:
        p.provision()
    _record("queued resource timeout", ei.value)
    assert "queued resource tb-qr" in ei.value.what
    assert _qr_body(bed.fake)["queueingPolicy"] == {"validUntilDuration": "5s"}
    time.sleep(0.2)
    assert p.status()["queued_resources"][0]["state"] == "FAILED"  # the service failed it at its valid-until
    bed.fake.qr_stuck.clear()
    assert [h.state for h in p.provision()] == ["up"]
    p.destroy()
    _assert_nothing_left(bed, p)


def test_suspended_queued_resource_is_reported_and_asked_again(bed: Bed) -> None:
    p = bed.provider(queued_resource=True, spot=True)
    p.provision()
    bed.fake.suspend_qr("tb-qr")
    assert p.status()["queued_resources"] == [{"queued_resource": "tb-qr", "state": "SUSPENDED", "reason": (
        "suspended by the Cloud TPU service (e.g. spot capacity reclaimed)")}]
    assert [h.state for h in p.refresh()] == ["gone"]
    assert [h.state for h in p.provision()] == ["up"]
    assert any("SUSPENDED" in ln and "deleting it to ask again" in ln for ln in bed.lines)
    p.destroy()
    _assert_nothing_left(bed, p)


def test_changed_node_count_asks_again(bed: Bed) -> None:
    kw = {"queued_resource": True, "accelerator_type": "v4-8", "zone": "us-central2-b"}
    bed.provider(count=2, **kw).provision()
    p = bed.provider(count=3, **kw)
    assert [h.name for h in p.provision()] == ["tb-0-w0", "tb-1-w0", "tb-2-w0"]
    assert any("asks for 2 x v4-8, the spec for 3" in ln for ln in bed.lines)
    p.destroy()
    _assert_nothing_left(bed, p)


def test_queued_resource_over_nodes_of_the_same_names(bed: Bed) -> None:
    """Nodes made without a queued resource (or by someone else) keep their names: refused before the request,
    and destroy never takes someone else's node for the testbed's own."""
    bed.provider().provision()
    p = bed.provider(queued_resource=True)
    with pytest.raises(TestbedError) as ei:
        p.provision()
    _record("queued resource over existing nodes", ei.value)
    assert "exists outside queued resource tb-qr" in ei.value.what and bed.fake.qr_ids() == []
    p.destroy()
    _assert_nothing_left(bed, p)
    # someone else's node named tb-0
    code, _ = _raw(bed.fake, "POST", "/v2/projects/proj/locations/us-central1-f/nodes?nodeId=tb-0",
                   {"acceleratorType": "v2-8", "runtimeVersion": "tpu-vm-tf-2.6.0"})
    assert code == 200
    p = bed.provider(queued_resource=True)
    with pytest.raises(TestbedError, match="was not created by testbed 'tb'"):
        p.provision()
    assert bed.store.resources("tb") == []
    p.destroy()
    assert bed.fake.node_ids() == ["tb-0"]  # untouched
    _raw(bed.fake, "DELETE", "/v2/projects/proj/locations/us-central1-f/nodes/tb-0")


# node states that never become READY ----------------------------------------------------------------------------
@pytest.mark.parametrize("state", ["PREEMPTED", "TERMINATED", "UNKNOWN", "STOPPED", "STOPPING", "HIDING", "HIDDEN"])
def test_a_wait_fails_fast_on_a_state_that_never_becomes_ready(bed: Bed, state: str) -> None:
    bed.fake.become["tb-0"] = (state, "the host failed its health check")
    p = bed.provider(create_timeout=60)
    t0 = time.monotonic()
    with pytest.raises(TestbedError) as ei:
        p.provision()
    assert time.monotonic() - t0 < 10
    _record(f"node {state}", ei.value)
    assert f"TPU node tb-0 {'is' if state.startswith(('STOP', 'HID')) else 'became'} {state}" in ei.value.what
    assert "(the host failed its health check)" in ei.value.what
    assert [r["id"] for r in bed.store.resources("tb")] == ["tb-0"]
    p.destroy()
    _assert_nothing_left(bed, p)


def test_an_unknown_node_is_recreated_and_a_stopped_one_explained(bed: Bed) -> None:
    p = bed.provider()
    p.provision()
    bed.fake.set_state("tb-0", "UNKNOWN", description="repair failed")
    assert [h.state for h in p.refresh()] == ["unknown"]
    assert [h.state for h in p.provision()] == ["up"]
    assert any("node tb-0: UNKNOWN; deleting it to create it again" in ln for ln in bed.lines)
    bed.fake.set_state("tb-0", "STOPPED")
    with pytest.raises(TestbedError) as ei:
        p.provision()
    _record("node STOPPED at provision", ei.value)
    assert "tpu-vm start tb-0" in (ei.value.fix or "")
    p.destroy()
    _assert_nothing_left(bed, p)


def test_a_repairing_node_is_waited_for(bed: Bed) -> None:
    """REPAIRING may end READY: waited on (within the deadline), not failed."""
    bed.fake.become["tb-0"] = ("REPAIRING", "")

    def repaired(line: str) -> None:
        bed.lines.append(line)
        if "node tb-0: REPAIRING" in line:
            bed.fake.set_state("tb-0", "READY", health="HEALTHY")
            bed.fake._install_keys(bed.fake._node_by_id("tb-0")["json"])

    p = bed.provider(progress=repaired)
    assert [h.state for h in p.provision()] == ["up"]
    p.destroy()
    _assert_nothing_left(bed, p)


# networks ---------------------------------------------------------------------------------------------------------
def test_a_project_without_a_default_network(bed: Bed) -> None:
    bed.fake.networks = {"lab-vpc": {"tpu-a": "us-central1", "tpu-eu": "europe-west4"}}
    p = bed.provider()
    with pytest.raises(TestbedError) as ei:
        p.provision()
    _record("no default network", ei.value)
    assert "network settings" in ei.value.what and "provider.network" in (ei.value.fix or "")
    assert bed.store.resources("tb") == []
    with pytest.raises(TestbedError, match="not in region us-central1"):
        bed.provider(network="lab-vpc", subnetwork="tpu-eu").provision()
    p = bed.provider(network="lab-vpc", subnetwork="tpu-a")
    p.provision()
    assert bed.fake.node("tb-0")["networkConfig"] == {"network": "lab-vpc", "subnetwork": "tpu-a",
                                                      "enableExternalIps": True}
    p.destroy()
    _assert_nothing_left(bed, p)


@pytest.mark.parametrize("field,value", [("network", "Lab VPC"), ("network", "projects/p/networks/x"),
                                         ("subnetwork", "projects/p/regions/us-central1/subnets/x")])
def test_network_settings_are_checked_when_the_spec_is_read(field: str, value: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        TpuSettings(**{field: value})  # type: ignore[arg-type]
    assert TpuSettings(network="projects/host-proj/global/networks/shared",
                       subnetwork="projects/host-proj/regions/us-central1/subnetworks/tpu").network


def test_api_not_enabled(bed: Bed) -> None:
    bed.fake.fail_next("POST", "PERMISSION_DENIED", "Cloud TPU API has not been used in project 123 before or it "
                       "is disabled.", reason="SERVICE_DISABLED")
    p = bed.provider()
    with pytest.raises(TestbedError) as ei:
        p.provision()
    _record("API disabled", ei.value)
    assert "Cloud TPU API is not enabled" in ei.value.what
    assert "gcloud services enable tpu.googleapis.com" in (ei.value.fix or "")
    assert bed.store.resources("tb") == []


def test_rate_limited_reads_are_retried(bed: Bed) -> None:
    bed.fake.fail_next("GET", "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Read requests'", times=2,
                       path="/nodes/tb-0")
    p = bed.provider()
    assert [h.state for h in p.provision()] == ["up"]
    p.destroy()
    _assert_nothing_left(bed, p)


# pacing and interrupts --------------------------------------------------------------------------------------------
def test_pacing_backs_off_with_jitter_and_never_passes_the_deadline() -> None:
    from testbed.providers.gcp_tpu.wait import Polling, pace

    pol = Polling(interval=5, max_interval=30, multiplier=1.5, jitter=0.2)
    pacer = pace(pol, time.monotonic() + 3600)
    pauses = [pacer.next() for _ in range(12)]
    assert 4 <= pauses[0] <= 6 and all(p <= 36 for p in pauses) and max(pauses) >= 24
    assert len({round(p, 6) for p in pauses}) > 6  # jittered
    pacer.reset()
    assert pacer.next() <= 6
    near = pace(pol, time.monotonic() + 1.0)
    assert near.next() <= 1.0
    assert pace(pol, time.monotonic() - 1).next() == 0.0


def test_heartbeat_says_what_is_awaited(bed: Bed) -> None:
    from dataclasses import replace

    bed.fake.stuck.add("tb-0")
    p = bed.provider(create_timeout=5)
    p.polling = replace(p.polling, report_every=0.5)
    with pytest.raises(TestbedError):
        p.provision()
    beats = [ln for ln in bed.lines if ln.startswith("waiting for 1 TPU node to be READY: tb-0 CREATING (")]
    assert beats and "gives up in" in beats[-1] and "next check in" in beats[-1]
    p.destroy()
    _assert_nothing_left(bed, p)


@pytest.mark.parametrize("kind", ["nodes", "multislice"])
def test_ctrl_c_at_any_progress_line_leaves_nothing_after_destroy(bed: Bed, kind: str) -> None:
    """Interrupt provision at its 1st, 2nd, ... progress line: whatever was made is recorded, destroy releases it."""
    kw: dict[str, object] = {"count": 2, "accelerator_type": "v4-8", "zone": "us-central2-b"}
    if kind == "multislice":
        kw["queued_resource"] = True
    bed.fake.ready_after = 4  # some CREATING polls too
    k = 0
    while True:
        k += 1
        seen: list[str] = []

        def interrupt(line: str, k: int = k) -> None:
            seen.append(line)
            if len(seen) == k:
                raise KeyboardInterrupt

        p = bed.provider(progress=interrupt, **kw)
        try:
            p.provision()
        except TestbedError as e:
            assert e.code == 130, e.render()
            assert bed.store.testbed("tb")["status"] == "interrupted"
            made = set(bed.fake.node_ids()) | set(bed.fake.qr_ids())
            recorded = {r["id"] for r in bed.store.resources("tb")}
            assert made <= recorded, (k, seen[-1], made, recorded)
            p.progress = lambda _: None
            p.destroy()
            _assert_nothing_left(bed, p)
            continue
        assert k == len(seen) + 1 and k > 4, seen  # it got all the way: every line was an interruption point
        print(f"\n[Ctrl-C sweep {kind}] interrupted at each of {k - 1} progress lines; destroy left nothing")
        p.progress = lambda _: None
        p.destroy()
        _assert_nothing_left(bed, p)
        break


@pytest.mark.parametrize("call", ["create_node", "create_queued_resource"])
def test_ctrl_c_while_the_create_request_is_in_flight(bed: Bed, call: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The service made it but the answer never arrived: the id was recorded before the call, so destroy finds it."""
    p = bed.provider(queued_resource=call == "create_queued_resource")
    client = p.cloud.client()
    real = getattr(client, call)

    def lost_answer(*a: object, **kw: object) -> object:
        real(*a, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(client, call, lost_answer)
    with pytest.raises(TestbedError, match="interrupted"):
        p.provision()
    assert bed.fake.node_ids() or bed.fake.qr_ids()
    p.destroy()
    _assert_nothing_left(bed, p)


def test_ctrl_c_during_destroy_then_destroy_again(bed: Bed) -> None:
    p = bed.provider(queued_resource=True, count=2, accelerator_type="v4-8", zone="us-central2-b")
    p.provision()

    def interrupt(line: str) -> None:
        if "delete requested" in line:
            raise KeyboardInterrupt

    p.progress = interrupt
    with pytest.raises(TestbedError) as ei:
        p.destroy()
    _record("Ctrl-C in destroy", ei.value)
    assert ei.value.code == 130 and "may still exist" in ei.value.what
    assert bed.store.resources("tb")  # still recorded: the next destroy finds them
    p.progress = lambda _: None
    p.destroy()
    _assert_nothing_left(bed, p)


def test_ctrl_c_while_a_preempted_node_is_recreated(bed: Bed) -> None:
    p = bed.provider(spot=True)
    p.provision()
    bed.fake.preempt("tb-0")

    def interrupt(line: str) -> None:
        if "create requested" in line:
            raise KeyboardInterrupt

    p.progress = interrupt
    with pytest.raises(TestbedError, match="interrupted; 1 TPU resource"):
        p.provision()
    assert bed.fake.node_ids() == ["tb-0"]
    p.progress = lambda _: None
    p.destroy()
    _assert_nothing_left(bed, p)


# repair ------------------------------------------------------------------------------------------------
def test_repair_recreates_the_failed_workers_node_and_no_other(bed: Bed) -> None:
    p = bed.provider(count=2)
    p.provision()
    ids = {n: bed.fake.node(n)["id"] for n in ("tb-0", "tb-1")}
    before = len(bed.fake.api_requests())
    done = p.repair("tb-1-w0")
    assert done.hosts == ["tb-1-w0"] and done.replaced == ["tb-1-w0"]
    changed = [(m, u) for m, u in bed.fake.api_requests()[before:] if m in ("POST", "DELETE")]
    assert [m for m, _ in changed] == ["DELETE", "POST"] and all("tb-0" not in u for _, u in changed), changed
    assert bed.fake.node("tb-0")["id"] == ids["tb-0"] and bed.fake.node("tb-1")["id"] != ids["tb-1"]
    assert bed.fake.node("tb-1")["state"] == "READY"
    assert _ssh_true(p, "tb-1-w0").returncode == 0
    p.destroy()
    _assert_nothing_left(bed, p)


def test_repair_of_one_worker_recreates_its_whole_slice(bed: Bed) -> None:
    p = bed.provider(accelerator_type="v4-16", zone="us-central2-b")
    assert [h.name for h in p.provision()] == ["tb-0-w0", "tb-0-w1"]
    old = bed.fake.node("tb-0")["id"]
    done = p.repair("tb-0-w1")
    assert done.hosts == ["tb-0-w0", "tb-0-w1"] and done.replaced == ["tb-0-w0", "tb-0-w1"]
    assert bed.fake.node("tb-0")["id"] != old
    assert all(_ssh_true(p, h).returncode == 0 for h in done.hosts)
    p.destroy()
    _assert_nothing_left(bed, p)


def test_repair_with_a_queued_resource_asks_for_it_again(bed: Bed) -> None:
    p = bed.provider(queued_resource=True)
    p.provision()
    old = bed.fake.node("tb-0")["id"]
    done = p.repair("tb-0-w0")
    assert done.replaced == ["tb-0-w0"] and bed.fake.qr_ids() == ["tb-qr"] and bed.fake.node("tb-0")["id"] != old
    assert any(ln.startswith("tb-0-w0: deleting queued resource tb-qr") for ln in bed.lines)
    p.destroy()
    _assert_nothing_left(bed, p)
