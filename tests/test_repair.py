"""Repairing one failed host: the host comes back, the others are untouched, set-up is applied to it alone."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from testbed.cli import app
from testbed.errors import TestbedError, UsageError
from testbed.handle import Testbed

pytestmark = pytest.mark.local


def _boot_ids(bed) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {h.name: bed.ssh(h.name, "cat /proc/sys/kernel/random/boot_id").stdout.strip() for h in bed.hosts}


def test_a_killed_local_host_is_repaired_and_set_up_again_alone(local_testbed) -> None:
    bed = local_testbed(hosts=3)
    tb = Testbed.open(bed.name, bed.store)
    res = tb.setup(roles=["shell"])
    assert res.ok, res.error
    assert bed.store.testbed(bed.name)["info"]["setup"] == {"roles": ["shell"]}
    bed.ssh("node1", "echo kept > /root/disk.txt")
    before = _boot_ids(bed)
    bed.provider.kill_host("node1")
    assert bed.ssh("node1", "true", timeout=20).returncode != 0
    r = CliRunner().invoke(app, ["provision", bed.name, "--repair", "node1", "--json"])
    assert r.exit_code == 0, (r.output, r.exception)
    done = json.loads(r.stdout)
    assert done["host"] == "node1" and done["hosts"] == ["node1"] and done["replaced"] == ["node1"]
    assert done["setup"] == "roles: shell" and done["repair_seconds"] > 0 and done["setup_seconds"] > 0
    after = _boot_ids(bed)
    assert after["node1"] != before["node1"]  # it restarted ...
    assert {k: v for k, v in after.items() if k != "node1"} == {k: v for k, v in before.items() if k != "node1"}
    assert bed.ssh("node1", "cat /root/disk.txt").stdout.strip() == "kept"  # ... on its own disk
    assert [h.state for h in bed.store.hosts(bed.name)] == ["up", "up", "up"]
    assert bed.store.testbed(bed.name)["status"] == "up"
    assert done["setup_hosts"] == ["node1"]  # the set-up ran on node1 alone


def test_repair_refuses_an_unknown_host_before_touching_anything(local_testbed) -> None:
    bed = local_testbed(hosts=2)
    tb = Testbed.open(bed.name, bed.store)
    with pytest.raises(UsageError) as ei:
        tb.repair("node9")
    assert "no host 'node9'" in ei.value.what and "node0" in (ei.value.fix or "")
    r = CliRunner().invoke(app, ["provision", bed.name, "--no-setup"])
    assert r.exit_code != 0 and "--no-setup goes with --repair" in str(r.exception)


def test_repair_of_a_host_that_does_not_come_back_is_one_clear_error(local_testbed, monkeypatch) -> None:
    bed = local_testbed(hosts=2)
    from testbed.providers.local import LocalProvider

    monkeypatch.setattr(LocalProvider, "ssh_timeout", property(lambda self: 2.0))
    monkeypatch.setattr(LocalProvider, "_start_host", lambda self, sl: None)  # the host never boots again
    monkeypatch.setattr(LocalProvider, "still_starting", lambda self, h: None)
    tb = Testbed.open(bed.name, bed.store)
    with pytest.raises(TestbedError) as ei:
        tb.repair("node1", setup=False)
    assert ei.value.what.startswith("could not repair node1:") and "did not answer SSH" in ei.value.what
    assert bed.store.testbed(bed.name)["status"] == "degraded"
