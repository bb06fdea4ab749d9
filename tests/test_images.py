"""Images of a set-up (testbed.setup.images): keyed by what the set-up installs, baked from a host whose set-up
passed, booted by a new testbed and by a host repaired with a new disk; the set-up then runs only the roles that
depend on the other hosts. The local tests use real hosts, real Ansible and real overlay layers."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from testbed.errors import TestbedError, UsageError
from testbed.handle import Testbed
from testbed.setup import address, images
from testbed.setup.profiles import roles_dir
from testbed.state import Store
from tests.localbed import free_subnet


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
    listed = images.listing(st, {"images": {"lab": {"per_gb_month": 2.0, "unit": "USD"}}})
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
    assert tb.setup().ok
    img = images.bake(tb)
    assert img["new"] and img["plan"] == "base" and img["testbed"] == "a" and img["host"] == "node0"
    assert images.bake(tb)["new"] is False  # the same key: the image already made
    layer = Path(img["location"])
    assert (layer / "root/.cache/testbed/image.json").is_file()
    assert address.read_image_key((layer / "root/.cache/testbed/image.json").read_text()) == img["key"]
    for identity in ("etc/ssh/ssh_host_ed25519_key_testbed", "root/.ssh", "root/.cache/testbed/setup.json",
                     "etc/hostname", "etc/hosts"):
        assert not (layer / identity).exists(), identity

    b = _second_testbed(a.cwd, "b", 2)
    b.provision()
    try:
        assert {h.name: h.facts.get("image") for h in b.hosts} == {"node0": img["key"], "node1": img["key"]}
        assert b.info["image"]["key"] == img["key"]
        res = b.setup()
        assert res.ok and res.partial_roles == ["ssh_mesh"], res
        assert sorted(res.partial) == ["node0", "node1"] and res.reasons["node0"].startswith("booted from image")
        assert _mesh_everywhere(_Bed(b)) == {"node0": "", "node1": ""}
        assert not b.setup().ran  # recorded as set up: the next run is skipped

        p = b.provider()
        sl = p.slot("node1")  # type: ignore[attr-defined]
        p.kill_host("node1")
        shutil.rmtree(sl.upper)  # a new disk: no host key, no user key, no set-up record
        (sl.root / "host_key.pub").unlink()
        done = b.repair("node1")
        assert done.replaced == ["node1"] and done.setup_hosts == ["node0", "node1"], done
        assert _mesh_everywhere(_Bed(b)) == {"node0": "", "node1": ""}

        changed = b.setup(extra_vars={"shell_verify": False})  # another set-up: the image does not hold it
        assert changed.ok and not changed.partial and not changed.partial_roles
        assert all(r.startswith("changed:") and "variables" in r for r in changed.reasons.values()), changed.reasons
        c = _second_testbed(a.cwd, "c", 1, {"shell_verify": False})
        assert images.for_provision(c.provider()) is None  # its set-up has no image: a whole set-up
        d = _second_testbed(a.cwd, "d", 1)
        assert (images.for_provision(d.provider()) or {}).get("key") == img["key"]
    finally:
        b.destroy()
    assert os.path.ismount(layer) and [r["id"] for r in a.store.images()] == [img["id"]]  # destroy keeps it
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
