"""Images of a set-up (testbed.setup.images): keyed by what the set-up installs, baked from a host whose set-up
passed, booted by a new testbed and by a host repaired with a new disk; the set-up then runs only the roles that
depend on the other hosts. The local tests use real hosts, real Ansible and real overlay layers."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from testbed import expiry
from testbed.errors import TestbedError, UsageError
from testbed.handle import Testbed
from testbed.setup import address, images
from testbed.setup.profiles import roles_dir
from testbed.state import Store
from tests.localbed import CHAMELEON_SPEC, free_subnet


# --- the key ---------------------------------------------------------------------------------------------
def _common(**over: str) -> dict[str, str]:
    parts = {"plan": "p", "variables": "v", "inventory": "i", "host keys": "k", "environment": "e", "tools": "t",
             "role ssh_mesh": "r"}
    return {**parts, **over}


def test_the_image_key_leaves_out_the_hosts_and_keeps_what_is_installed() -> None:
    """Another testbed's hosts (inventory, pinned keys, its subnet and folders) give the same key; a variable, a
    role's files, a testbed-wide variable or the base image give another."""
    play = {"testbed_provider": "local", "testbed_subnet": "10.0.0.0/24", "testbed_cache_dir": "/a"}
    key = address.image_key(address.image_parts(_common(), play, "base"))
    other_hosts = address.image_parts(_common(inventory="j", **{"host keys": "l"}),
                                      {**play, "testbed_subnet": "10.9.0.0/24", "testbed_cache_dir": "/b"}, "base")
    assert address.image_key(other_hosts) == key
    for changed in (address.image_parts(_common(variables="v2"), play, "base"),
                    address.image_parts(_common(**{"role ssh_mesh": "r2"}), play, "base"),
                    address.image_parts(_common(), {**play, "testbed_provider": "chameleon"}, "base"),
                    address.image_parts(_common(), play, "another base")):
        assert address.image_key(changed) != key


def test_a_record_that_differs_only_in_the_hosts_needs_the_per_testbed_roles_only() -> None:
    now = {"plan": "p", "variables": "v", "inventory": "i2", "host keys": "k2", "host": "h"}
    rec = json.dumps({"format": address.FORMAT, "parts": {**now, "inventory": "i", "host keys": "k"}})
    assert address.only_testbed_parts_differ(rec, now)
    assert not address.only_testbed_parts_differ(json.dumps({"format": address.FORMAT,
                                                             "parts": {**now, "variables": "v0"}}), now)
    assert not address.only_testbed_parts_differ(json.dumps({"format": address.FORMAT,
                                                             "parts": {**now, "host": "h0"}}), now)
    assert not address.only_testbed_parts_differ("", now) and not address.only_testbed_parts_differ("{", now)


def test_the_roles_that_depend_on_the_other_hosts_say_so() -> None:
    assert address.per_testbed_roles(["ssh_mesh", "shell", "packages", "mpi", "python_env"], roles_dir()) == \
        ["ssh_mesh", "mpi"]


def test_an_image_record_is_read_back_only_when_well_formed() -> None:
    key = "a" * 64
    assert address.read_image_key(address.image_record(key, "base", {}, "tb/node0")) == key
    assert address.read_image_key("") is None and address.read_image_key('{"format": 1, "key": "x"}') is None


# --- state, list and prune ---------------------------------------------------------------------------------
def test_prune_deletes_unused_images_and_refuses_one_a_testbed_boots_from(tmp_path: Path) -> None:
    st = Store(tmp_path / "state.db")
    for n, key in enumerate(("1" * 64, "2" * 64)):
        st.add_image("lab", f"img{n}", key=key, plan="base", testbed="gone", host="h", location=f"/x/{n}", size=10)
    st.upsert_testbed("uses", "lab", None, "up", {"image": {"key": "1" * 64, "id": "img0", "location": "/x/0"}})
    listed = expiry.image_listing(st, {"images": {"lab": {"per_gb_month": 2.0, "unit": "USD"}}})
    assert [(r["id"], r["used_by"]) for r in listed] == [("img0", ["uses"]), ("img1", [])]
    assert listed[0]["cost"]["per_month"] == 0.0 and listed[0]["cost"]["unit"] == "USD"
    with pytest.raises(UsageError, match="image img0 is used by uses"):
        images.prune(st, ["img0"])
    with pytest.raises(UsageError, match="no image 'nope'"):
        images.prune(st, ["nope"])
    with pytest.raises(TestbedError, match="whose spec is gone"):  # img1 is unused: prune asks its provider
        images.prune(st)
    assert len(st.images()) == 2  # nothing forgotten that was not deleted


def test_image_list_json_on_an_empty_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from testbed.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TESTBED_HOME", str(tmp_path / ".testbed"))
    r = CliRunner().invoke(app, ["image", "list", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == {"images": []}


# --- local hosts -------------------------------------------------------------------------------------------
def _second_testbed(cwd: Path, name: str, hosts: int, variables: dict[str, object] | None = None) -> Testbed:
    """A testbed spec beside the first (the same state home, so the same images), not yet provisioned."""
    spec = {"provider": {"kind": "local", "hosts": hosts, "subnet": free_subnet()}, "user": "root",
            "vars": variables or {}}
    (cwd / "inventories" / f"{name}.yml").write_text(json.dumps(spec))
    return Testbed.open(name, Store(cwd / ".testbed" / "state.db"))


def test_a_second_testbed_and_a_new_disk_boot_from_the_image(local_testbed) -> None:  # type: ignore[no-untyped-def]
    """Baked from a host whose set-up passed: the layer holds the set-up's changes, not the host's identity; a
    second testbed of the same set-up boots from it and runs only ssh_mesh (its own hosts' mesh); a host of it
    repaired with a new disk boots from it too; a changed variable is another set-up (a whole run, and no image
    at provision); destroy keeps the image, prune deletes it."""
    a = local_testbed(hosts=2, name="a")
    os.chdir(a.cwd)
    try:
        _second_testbed_from_the_image(a)
    finally:  # the image's disk is mounted: never leave it behind
        for r in a.store.images():
            a.provider.delete_image(r)


def _second_testbed_from_the_image(a) -> None:  # type: ignore[no-untyped-def]
    from tests.test_repair import _mesh_everywhere

    tb = Testbed.open("a", a.store)
    with pytest.raises(TestbedError, match="does not hold the set-up 'base'"):
        images.bake(tb)  # never set up: nothing to bake
    from tests.localbed import invoke

    code, out, exc = invoke("setup", "a", "--bake", "--json")  # set up, then baked from the first host
    assert code == 0, (out, exc)
    done = json.loads(out)
    img = done["image"]
    assert done["ok"] and done["ran"], done
    assert img["new"] and img["plan"] == "base" and img["testbed"] == "a" and img["host"] == "node0"
    assert images.bake(tb)["new"] is False  # the same key: the image already made
    layer = Path(img["location"])
    assert not os.path.ismount(layer)  # mounted only while a testbed boots from it
    from testbed.providers.local.provider import LocalProvider

    LocalProvider._mount_layer(layer.parent)  # to read what it holds
    assert (layer / "root/.cache/testbed/image.json").is_file()
    assert address.read_image_key((layer / "root/.cache/testbed/image.json").read_text()) == img["key"]
    for identity in ("etc/ssh/ssh_host_ed25519_key_testbed", "root/.ssh", "root/.cache/testbed/setup.json",
                     "etc/hostname", "etc/hosts"):
        assert not (layer / identity).exists(), identity
    subprocess.run(["umount", str(layer)], check=True)

    b = _second_testbed(a.cwd, "b", 2)
    b.provision()
    try:
        assert {h.name: h.facts.get("image") for h in b.hosts} == {"node0": img["key"], "node1": img["key"]}
        assert b.info["image"]["key"] == img["key"]
        res = b.setup()
        assert res.ok and res.partial_roles == ["ssh_mesh"] and res.direct, res  # written by testbed, not Ansible
        assert sorted(res.partial) == ["node0", "node1"] and res.reasons["node0"].startswith("booted from image")
        assert _mesh_everywhere(_Bed(b)) == {"node0": "", "node1": ""}
        assert not b.setup().ran  # recorded as set up: the next run is skipped
        ansible = b.setup(verify=True)  # Ansible's roles over what testbed wrote: nothing left to change
        assert ansible.ok and not ansible.direct and ansible.changed == 0 and not ansible.drift, ansible.hosts
        mesh_files = "cat ~/.ssh/authorized_keys ~/.ssh/known_hosts ~/.ssh/config /etc/hosts"
        before = _Bed(b).ssh("node0", mesh_files).stdout.splitlines()

        p = b.provider()
        sl = p.slot("node1")  # type: ignore[attr-defined]
        p.kill_host("node1")
        shutil.rmtree(sl.upper)  # a new disk: no host key, no user key, no set-up record
        (sl.root / "host_key.pub").unlink()
        done = b.repair("node1")
        assert done.replaced == ["node1"] and done.setup_hosts == ["node0", "node1"], done
        assert _mesh_everywhere(_Bed(b)) == {"node0": "", "node1": ""}
        after = _Bed(b).ssh("node0", mesh_files).stdout.splitlines()
        moved = [x for x in before if x not in after] + [x for x in after if x not in before]
        assert moved and all("node1" in x for x in moved), moved  # node0 changed only its entries for node1

        changed = b.setup(extra_vars={"shell_verify": False})  # another set-up: the image does not hold it
        assert changed.ok and not changed.partial and not changed.partial_roles
        assert all(r.startswith("changed:") and "variables" in r for r in changed.reasons.values()), changed.reasons
        with pytest.raises(TestbedError, match="boots from image"):  # its disk holds only the changes over the image
            images.bake(b, extra_vars={"shell_verify": False})
        c = _second_testbed(a.cwd, "c", 1, {"shell_verify": False})
        assert images.for_provision(c.provider()) is None  # its set-up has no image: a whole set-up
        d = _second_testbed(a.cwd, "d", 1)
        assert (images.for_provision(d.provider()) or {}).get("key") == img["key"]
    finally:
        b.destroy()
    # destroy keeps the image, and releases its mount with the last testbed booting from it (b; a only baked it)
    assert not os.path.ismount(layer) and [r["id"] for r in a.store.images()] == [img["id"]]
    gone = images.prune(a.store)
    assert [r["id"] for r in gone] == [img["id"]] and not layer.parent.exists() and a.store.images() == []


class _Bed:
    """What tests.test_repair._mesh_everywhere needs of a testbed: its hosts and ssh."""

    def __init__(self, tb: Testbed):
        self.tb, self.hosts = tb, tb.hosts

    def ssh(self, host: str, command: str, timeout: float = 60):  # type: ignore[no-untyped-def]
        import subprocess

        return subprocess.run(["ssh", "-F", str(self.tb.dir / "ssh_config"), "-o", "ControlMaster=no", host, "--",
                               command], capture_output=True, text=True, timeout=timeout, check=False)


# --- chameleon: nova's createImage and glance's image states, through python-chi ---------------------------
# A KVM cloud with Blazar host reservations, whose servers nova snapshots; the fake's default site (CHI@UC) is bare
# metal, as Chameleon's CHI@ sites are (tests.fakes.chameleon_api.kvm_site).
KVM_SITE = "KVM@LAB"
KVM_SPEC = CHAMELEON_SPEC.replace("site: CHI@UC", f"site: {KVM_SITE}\n  flavor: m1.large")


@contextlib.contextmanager
def _cloud(monkeypatch: pytest.MonkeyPatch, region: str):  # type: ignore[no-untyped-def]
    """The fake site ``region`` with one ACTIVE server (no host behind it) and python-chi logged in to it."""
    pytest.importorskip("chi")
    from fakes.chameleon_api import FakeChameleon

    from testbed.providers.chameleon import chi as chameleon_chi

    fake = FakeChameleon(region=region).start()
    for k in [k for k in os.environ if k.startswith("OS_")]:
        monkeypatch.delenv(k)
    env = fake.env()
    base = fake.images[0]["id"]
    fake.servers["s1"] = {"id": "s1", "name": "tb-s1", "_deleting": None, "image": {"id": base},
                          "OS-EXT-STS:vm_state": "active", "OS-EXT-STS:task_state": None}
    api = chameleon_chi.Chi(chameleon_chi.credentials_from_env(env, site=region), site=region)
    try:
        yield fake, api
    finally:
        fake.stop()


@pytest.fixture
def kvm_cloud(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A KVM site: nova snapshots its servers."""
    with _cloud(monkeypatch, KVM_SITE) as c:
        yield c


@pytest.fixture
def bare_metal_cloud(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A bare-metal site (CHI@UC, the fake's default): Ironic nodes, which nova cannot snapshot."""
    with _cloud(monkeypatch, "CHI@UC") as c:
        yield c


def test_create_image_is_private_and_goes_queued_saving_active(kvm_cloud) -> None:  # type: ignore[no-untyped-def]
    """On a KVM site: python-chi's nova (microversion 2.61) reads the id from the body; glance shows the states in
    turn; the server is busy meanwhile (a second createImage is a 409); the image is the project's, private."""
    fake, api = kvm_cloud
    iid = api.server_create_image("s1", "testbed-abc", {"testbed_key": "k"})
    assert ("POST", "/compute/v2.1/servers/s1/action") in fake.requests
    from testbed.providers.chameleon.chi import ApiError

    with pytest.raises(ApiError) as busy:
        api.server_create_image("s1", "again", {})
    assert busy.value.status == 409 and "task_state image_snapshot_pending" in busy.value.message
    seen = [api.image_get(iid)["status"] for _ in range(4)]
    assert seen == ["saving", "saving", "active", "active"]
    img = api.image_get(iid)
    assert img["visibility"] == "private" and img["owner"] == fake.project_id and img["image_type"] == "snapshot"
    assert img["testbed_key"] == "k" and img["instance_uuid"] == "s1"
    assert api.image_delete(iid) and api.image_get(iid) is None and not api.image_delete(iid)


def test_create_image_before_2_45_answers_a_location_header(bare_metal_cloud) -> None:  # type: ignore[no-untyped-def]
    """novaclient below microversion 2.45 finds the id in the Location header, as nova answers there (the API
    answers so on a bare-metal site too: the image is made queued before the compute driver is asked)."""
    fake, api = bare_metal_cloud
    from novaclient.client import Client

    with api.call("nova"):
        old = Client("2.44", session=api.chi.session())
        iid = str(old.servers.create_image("s1", "testbed-old"))
    assert any(i["id"] == iid and i["status"] == "queued" for i in fake.images)


def test_a_bare_metal_site_deletes_the_snapshot_and_quota_and_states_refuse(bare_metal_cloud) -> None:  # type: ignore[no-untyped-def]
    """The fake's default site is bare metal, as Chameleon's CHI@ sites are: nova's Ironic driver cannot snapshot,
    so createImage's 202 leaves a queued image that the compute manager deletes (404 next) and the server's
    task_state is cleared (it stays ACTIVE and takes another createImage); glance's image_count_total reaches
    nova's API as a 500; a building server is a 409; an unknown one a 404."""
    fake, api = bare_metal_cloud
    from testbed.providers.chameleon.chi import ApiError

    assert [f["name"] for f in fake.flavors] == ["baremetal"]
    iid = api.server_create_image("s1", "testbed-x", {})
    assert api.image_get(iid) is None and iid not in [i["id"] for i in fake.images]
    assert fake.servers["s1"]["OS-EXT-STS:task_state"] is None
    assert api.image_get(api.server_create_image("s1", "testbed-x2", {})) is None
    fake.quota_images = len([i for i in fake.images if i["owner"] == fake.project_id])
    with pytest.raises(ApiError) as over:
        api.server_create_image("s1", "testbed-y", {})
    assert over.value.status == 500 and "HTTPOverLimit" in over.value.message
    fake.quota_images = None
    fake.servers["s1"]["OS-EXT-STS:vm_state"] = "building"
    with pytest.raises(ApiError) as building:
        api.server_create_image("s1", "testbed-z", {})
    assert building.value.status == 409 and "vm_state building" in building.value.message
    with pytest.raises(ApiError) as missing:
        api.server_create_image("nope", "testbed-z", {})
    assert missing.value.status == 404


def test_bake_on_a_bare_metal_testbed_is_refused_before_any_request(
        tb_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`image bake` and `setup --bake` of a testbed at a CHI@ site: one message (what, where, cc-snapshot with the
    command and the image's name, or the content-address skip), exit 1, and the site is never asked (no request)
    nor any host (the set-up does not run)."""
    pytest.importorskip("chi")
    from fakes.chameleon_api import FakeChameleon
    from typer.testing import CliRunner

    from testbed.cli import app
    from testbed.hosts import Host

    fake = FakeChameleon().start()
    try:
        for k in [k for k in os.environ if k.startswith("OS_")]:
            monkeypatch.delenv(k)
        for k, v in fake.env().items():
            monkeypatch.setenv(k, v)
        (tb_home / "inventories").mkdir()
        (tb_home / "inventories" / "cham.yml").write_text(
            "provider: {kind: chameleon, site: CHI@UC, count: 1}\nuser: cc\nprofile: base\n")
        st = Store(tb_home / ".testbed" / "state.db")
        st.upsert_testbed("cham", "chameleon", None, "up")
        st.set_hosts("cham", [Host(name="node0", address="127.0.0.1", port=1, user="cc")])
        st.add_resource("cham", "server", "s1", host="node0", name="tb-cham-node0")
        for args in (["image", "bake", "cham"], ["setup", "cham", "--bake"]):
            r = CliRunner().invoke(app, args)
            assert r.exit_code == 1 and isinstance(r.exception, TestbedError), (args, r.output, r.exception)
            e = r.exception
            assert "CHI@UC is a bare-metal site" in e.what and "no Nova snapshot" in e.what, e.what
            assert e.where == "Chameleon CHI@UC, nova: testbed cham"
            assert "'testbed ssh cham node0', then 'sudo cc-snapshot testbed-cham-base'" in (e.fix or "")
            assert "provider.image: testbed-cham-base" in (e.fix or "") and "content address" in (e.fix or "")
        assert fake.requests == [] and st.images() == []
        from testbed.setup import ansible_dir

        assert not (ansible_dir() / "runs" / "cham").exists() and st.testbed("cham")["info"].get("setup") is None
    finally:
        fake.stop()


def test_a_chameleon_key_names_the_site_image_and_node_type() -> None:
    from testbed.providers.chameleon.provider import ChameleonProvider
    from testbed.spec import TestbedSpec

    def spec(**p: str) -> TestbedSpec:
        return TestbedSpec.model_validate({"name": "c", "provider": {"kind": "chameleon", **p}})

    one = ChameleonProvider.base_image(spec(site="CHI@UC", node_type="compute_skylake"))
    assert one != ChameleonProvider.base_image(spec(site="CHI@UC", node_type="compute_zen3"))
    assert one != ChameleonProvider.base_image(spec(site="CHI@TACC", node_type="compute_skylake"))


def _disk_of(bed, address: str, iid: str) -> Path:  # type: ignore[no-untyped-def]
    """What nova's snapshot of the server behind ``address`` holds: the machine's disk as it is, less its SSH host
    keys (cloud-init makes new ones on a new instance), as a read-only layer a machine can boot from."""
    import subprocess

    from testbed.providers.local.provider import _make_ext4

    sl = bed.provider.slot(next(h.name for h in bed.hosts if h.address == address))
    dest = bed.cwd / "snapshots" / iid
    tree = dest / "tree"
    dest.mkdir(parents=True)
    subprocess.run(["cp", "-a", "--", f"{sl.upper}/.", str(tree)], check=True)
    for key in (tree / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    _make_ext4(tree, dest / "layer.ext4")
    shutil.rmtree(tree)
    (dest / "layer").mkdir()
    subprocess.run(["mount", "-t", "ext4", "-o", "loop,ro", str(dest / "layer.ext4"), str(dest / "layer")], check=True)
    return dest / "layer"


def _boot_from(bed, address: str, layer: Path) -> None:  # type: ignore[no-untyped-def]
    """A new server from the snapshot lands on the machine behind ``address``: a new disk over the image."""
    name = next(h.name for h in bed.hosts if h.address == address)
    sl = bed.provider.slot(name)
    bed.provider.kill_host(name)
    shutil.rmtree(sl.upper, ignore_errors=True)
    (sl.root / "host_key.pub").unlink(missing_ok=True)
    bed.provider.image = {"key": "snapshot", "id": "snapshot", "location": str(layer)}
    try:
        bed.provider.repair(name)
    finally:
        bed.provider.image = None


def test_a_second_chameleon_testbed_boots_the_image_and_skips_the_set_up(local_testbed, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Against the fake Chameleon with real hosts behind its servers: a set-up baked through nova's createImage
    (a private glance image, recorded as it is made) boots a second testbed's servers on other machines, whose
    set-up skips every role (0 changed, no Ansible run: the image's record says the work is there, and no role of
    the profile depends on the other hosts); prune deletes the image in glance."""
    from tests.localbed import chameleon_cloud, invoke

    bed = local_testbed(hosts=4, name="machines")
    os.chdir(bed.cwd)
    (bed.cwd / "playbooks" / "profiles").mkdir(parents=True)
    (bed.cwd / "playbooks" / "profiles" / "tools.yml").write_text(
        "description: the login shell and the tools\nvars: {shell_name: bash}\n"
        "roles: [{role: shell}, {role: packages}]\n")
    spec = KVM_SPEC + "profile: tools\n"  # a KVM site: nova snapshots its servers (a CHI@ site refuses the bake)
    layers: dict[str, Path] = {}
    try:
        with chameleon_cloud(bed, monkeypatch, spec, boots=True, region=KVM_SITE) as fake:
            fake.snapshot_hook = lambda addr, iid: layers.__setitem__(iid, _disk_of(bed, addr, iid))
            fake.boot_hook = lambda addr, iid: _boot_from(bed, addr, layers[iid])
            code, out, exc = invoke("provision", "chameleon")
            assert code == 0, (out, exc)
            code, out, exc = invoke("setup", "chameleon")  # images bill there: no bake by itself, one line says how
            said = " ".join(out.split())  # one line, however the terminal wraps it
            assert code == 0, (out, exc)
            assert "note: no image of this set-up yet: 'testbed setup chameleon --profile tools --bake'" in said, out
            assert "a lost host is then repaired from it in seconds" in said, out
            a = Testbed.open("chameleon")
            assert not a.store.images()
            code, out, exc = invoke("image", "bake", "chameleon", "--json")
            assert code == 0, (out, exc)
            img = json.loads(out)
            assert img["new"] and img["info"]["visibility"] == "private" and img["info"]["status"] == "active"
            assert [i["id"] for i in fake.images if i["id"] == img["id"]] == [img["id"]] and img["id"] in layers
            (bed.cwd / "inventories" / "chameleon2.yml").write_text(spec)
            code, out, exc = invoke("provision", "chameleon2")
            assert code == 0 and "booted from image" in out, (out, exc)
            b = Testbed.open("chameleon2")
            assert {h.address for h in a.hosts}.isdisjoint({h.address for h in b.hosts})  # other machines
            res = b.setup()
            assert res.ok and not res.ran and res.changed == 0 and res.partial_roles == [], res.to_json()
            assert sorted(res.reasons) == sorted(h.name for h in b.hosts)
            assert all(w.startswith("booted from image") for w in res.reasons.values()), res.reasons
            again = b.setup()
            assert not again.ran and sorted(again.unchanged) == sorted(h.name for h in b.hosts)  # recorded
            code, out, exc = invoke("destroy", "chameleon2", "--yes")
            assert code == 0, (out, exc)
            code, out, exc = invoke("image", "list", "--json")
            listed = json.loads(out)["images"]
            assert code == 0 and [(i["id"], i["used_by"]) for i in listed] == [(img["id"], [])]
            code, out, exc = invoke("image", "prune", "--yes", "--json")
            assert code == 0 and [r["id"] for r in json.loads(out)["deleted"]] == [img["id"]], (out, exc)
            assert not [i for i in fake.images if i["id"] == img["id"]]
    finally:
        import subprocess

        for layer in layers.values():  # the machines that booted it are gone with the local testbed
            subprocess.run(["umount", "-l", str(layer)], check=False)


# --- what is refused before any host ------------------------------------------------------------------------
def test_lab_and_tpu_keep_no_images_and_say_why(tb_home: Path) -> None:
    """A lab's machines keep their disks; TPU VMs boot a runtime version: one message each, no host asked, and
    a new testbed of either never looks for an image."""
    from typer.testing import CliRunner

    from testbed.cli import app

    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "lab1.yml").write_text("provider: {kind: lab, hosts: [{name: a1, address: 10.1.2.3}]}\n")
    st = Store(tb_home / ".testbed" / "state.db")
    from testbed.hosts import Host

    st.upsert_testbed("lab1", "lab", None, "up")
    st.set_hosts("lab1", [Host(name="a1", address="10.1.2.3", port=22, user="root")])
    r = CliRunner().invoke(app, ["image", "bake", "lab1"])
    assert r.exit_code == 1 and isinstance(r.exception, TestbedError)
    assert "keep their disks" in r.exception.what and r.exception.fix == "testbed setup lab1"
    from testbed.providers.gcp_tpu.provider import TpuProvider

    why = TpuProvider.lacks("images") or ""
    assert "runtime version" in why and "no field for a custom image" in why
    tpu = Testbed.open("lab1", st).provider()
    assert images.for_provision(tpu) is None


def test_bake_goes_with_a_profile_and_is_refused_with_roles(tb_home: Path) -> None:
    from typer.testing import CliRunner

    from testbed.cli import app

    r = CliRunner().invoke(app, ["setup", "local", "--role", "shell", "--bake"])
    assert isinstance(r.exception, UsageError) and "--bake goes with a profile" in r.exception.what
    assert r.exception.code == 2  # bad input: exit 2, no host touched (no testbed 'local' is even provisioned)


# --- the dead-man's switch deletes an image only when told (expire_images) -------------------------------------
def test_the_chameleon_switch_may_delete_the_testbeds_images_only_when_told(
        tb_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch's credential: without ``expire_images`` its access rules name no image; with it, exactly a DELETE
    of each image this testbed baked that no other testbed boots from, and the fake (keystonemiddleware's rules)
    lets that credential delete that image and nothing else of Glance."""
    pytest.importorskip("chi")
    import time
    import urllib.request

    from fakes.chameleon_api import FakeChameleon

    from testbed.expiry import Expiry

    fake = FakeChameleon().start()
    try:
        for k in [k for k in os.environ if k.startswith("OS_")]:
            monkeypatch.delenv(k)
        for k, v in fake.env().items():
            monkeypatch.setenv(k, v)
        fake.app_cred_unrestricted = True
        (tb_home / "inventories").mkdir()
        st = Store.open_default()
        base = fake.images[0]["id"]
        ids = {"mine": "0" * 31 + "1", "theirs": "0" * 31 + "2", "shared": base}
        for n in ("mine", "theirs"):  # two snapshots in glance, as createImage leaves them
            fake.images.append({**fake.images[0], "id": ids[n], "name": f"tb-{n}", "visibility": "private",
                                "owner": fake.project_id})
        for n, baked_by in (("mine", "cham"), ("shared", "cham"), ("theirs", "other")):
            st.add_image("chameleon", ids[n], key=n * 8, plan="base", testbed=baked_by, host="node0",
                         location="CHI@UC", size=1)
        st.upsert_testbed("user", "chameleon", None, "up", {"image": {"key": "shared" * 8}})  # boots from it
        rules = {}
        for told in (False, True):
            (tb_home / "inventories" / "cham.yml").write_text(
                "provider: {kind: chameleon, site: CHI@UC, count: 1}\nuser: cc\n"
                + ("expire_images: true\n" if told else ""))
            p = Testbed.open("cham", st).provider()
            plan = p.switch_release(Expiry(expire_at=time.time() + 3600))
            rules[told] = fake.app_creds[plan["auth"]["id"]]["access_rules"]
        assert not [r for r in rules[False] if r["service"] == "image"]
        assert [(r["method"], r["path"].rsplit("/", 1)[-1]) for r in rules[True] if r["service"] == "image"] \
            == [("DELETE", ids["mine"])]
        assert [m for m, url in plan["requests"] if url.endswith("/v2/images/" + ids["mine"])] == ["DELETE"]
        req = urllib.request.Request(f"{plan['auth']['auth_url']}/auth/tokens", method="POST",
                                     data=json.dumps({"auth": {"identity": {
                                         "methods": ["application_credential"], "application_credential": {
                                             "id": plan["auth"]["id"], "secret": plan["auth"]["secret"]}}}}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            token = resp.headers["X-Subject-Token"]
        glance = next(url for _, url in plan["requests"] if "/v2/images/" in url).rsplit("/v2/images/", 1)[0]

        def call(method: str, path: str) -> int:
            try:
                with urllib.request.urlopen(urllib.request.Request(
                        glance + path, method=method, headers={"X-Auth-Token": token}), timeout=10) as r:
                    return int(r.status)
            except urllib.error.HTTPError as e:
                return int(e.code)

        assert call("DELETE", f"/v2/images/{ids['theirs']}") == 401  # another testbed's image: not this credential's
        assert call("GET", "/v2/images") == 401
        assert call("DELETE", f"/v2/images/{ids['mine']}") == 204
        assert ids["mine"] not in [i["id"] for i in fake.images] and ids["theirs"] in [i["id"] for i in fake.images]
    finally:
        fake.stop()


@pytest.mark.local
def test_the_local_watchdog_deletes_the_images_only_when_told(local_testbed, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Two testbeds expire; each baked an image (a layer folder where the local provider keeps them): the one
    whose spec says ``expire_images: true`` loses its image, the other keeps it."""
    from tests.localbed import invoke

    monkeypatch.setenv("TESTBED_DEADMAN_INTERVAL", "0.5")
    bed = local_testbed(hosts=1, name="told")
    os.chdir(bed.cwd)
    import yaml

    spec = Path(bed.cwd) / "inventories" / "told.yml"
    doc = yaml.safe_load(spec.read_text())
    spec.write_text(json.dumps({**doc, "expire_images": True}))
    doc["provider"]["subnet"] = free_subnet()
    (Path(bed.cwd) / "inventories" / "kept.yml").write_text(json.dumps(doc))  # no expire_images: the default
    layers = {}
    for name in ("told", "kept"):
        layer = Path(os.environ["TESTBED_HOME"]) / "images" / "local" / (name * 16)[:64] / "layer"
        layer.mkdir(parents=True)
        (layer / "marker").write_text(name)
        bed.store.add_image("local", f"local-{name}", key=(name * 16)[:64], plan="base", testbed=name, host="node0",
                            location=str(layer), size=1)
        layers[name] = layer
    import time

    try:
        for name in ("told", "kept"):
            code, out, exc = invoke("provision", name, "--expire", "4s", "--json")
            assert code == 0, (out, exc)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and (bed.store.testbed("told") or bed.store.testbed("kept")
                                               or layers["told"].exists()):
            time.sleep(0.5)
    finally:
        invoke("destroy", "kept", "--yes")  # the fixture knows 'told' only
    assert bed.store.testbed("told") is None and bed.store.testbed("kept") is None
    assert not layers["told"].parent.exists() and [r["id"] for r in bed.store.images()] == ["local-kept"]
    assert (layers["kept"] / "marker").read_text() == "kept"  # never deleted unless told

