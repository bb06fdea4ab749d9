"""Repairing one failed host: the host comes back, the others are untouched, set-up is applied to it alone."""

from __future__ import annotations

import json
import os

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
    assert done["how"] == "restarted on its own disk"
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
    from testbed.providers.local.provider import LocalProvider

    monkeypatch.setattr(LocalProvider, "ssh_timeout", property(lambda self: 2.0))
    monkeypatch.setattr(LocalProvider, "_start_hosts", lambda self, todo: None)  # the host never boots again
    monkeypatch.setattr(LocalProvider, "still_starting", lambda self, h: None)
    tb = Testbed.open(bed.name, bed.store)
    with pytest.raises(TestbedError) as ei:
        tb.repair("node1", setup=False)
    assert ei.value.what.startswith("could not repair node1:") and "did not answer SSH" in ei.value.what
    assert bed.store.testbed(bed.name)["status"] == "degraded"


def _run_with_host_kill(bed, seed: int, python: str, ranks: int = 3) -> list:  # type: ignore[no-untyped-def]
    from testbed.run import bookkeeping as rs
    from testbed.run import runner

    plan = runner.plan_run("fault-drill", bed.name, {"ranks": ranks, "python": python, "seed": seed,
                                                     "port": 29600 + 2 * seed, "timeout": 4, "step_seconds": 0.3},
                           faults=["kill-host"], store=bed.store)
    plan.timeouts.unreachable = 3
    run_id = runner.start_run(plan, store=bed.store)
    row = runner.wait(run_id, timeout=400, store=bed.store)
    assert row.status == "succeeded", (seed, row.reason)
    return rs.events(bed.store, run_id)


def test_fault_drill_host_killed_repaired_and_resumed(local_testbed) -> None:
    """The last rank's host is killed at a step picked by the seed: the run detects it, repairs the host, sets
    it up again (the testbed's last set-up), uploads the run to it and resumes every rank from the checkpoint."""
    import sys

    bed = local_testbed(hosts=3)
    tb = Testbed.open(bed.name, bed.store)
    assert tb.setup(roles=["shell"]).ok
    evs = _run_with_host_kill(bed, 1, sys.executable)  # killed at step 9: after the checkpoint of step 8
    kinds = [e.kind for e in evs]
    assert kinds.index("fault") < kinds.index("recovery") < kinds.index("repaired") < kinds.index("resumed")
    fault = next(e for e in evs if e.kind == "fault")
    assert fault.detail["action"] == "kill-host" and fault.host == "node2"
    repaired = next(e for e in evs if e.kind == "repaired")
    assert repaired.host == "node2" and repaired.detail["setup_hosts"] == ["node2"], repaired.detail  # its reasons
    assert repaired.detail["setup_reasons"]["node2"], repaired.detail
    resumed = next(e for e in evs if e.kind == "resumed").detail
    print("resumed:", resumed)
    assert resumed["hosts_repaired"] == ["node2"] and resumed["checkpoint"]["host"] == "node0"
    assert resumed["detect_seconds"] is not None and resumed["repair_seconds"] > 0 and resumed["setup_seconds"] > 0
    assert resumed["resumed_step"] > 0 and resumed["steps_lost"] == resumed["last_step"] - resumed["resumed_step"]
    good = next(e for e in evs if e.kind == "goodput").detail
    print("goodput:", good)
    assert good["steps"] == 24 and 0 < good["ratio"] < 1 and good["fault_free_seconds"] < good["seconds"]


@pytest.mark.timeout(1800)  # ten runs, each with two start-ups of torch: minutes on a loaded 2-core machine
def test_ten_seeds_each_host_kill_detected_repaired_resumed(local_testbed) -> None:
    """Ten seeds, ten moments: each run loses node1 at its own step and completes from the checkpoint."""
    import statistics
    import sys

    bed = local_testbed(hosts=2)
    rows = []
    for seed in [int(s) for s in os.environ.get("TB_SEEDS", "0 1 2 3 4 5 6 7 8 9").split()]:
        evs = _run_with_host_kill(bed, seed, sys.executable, ranks=2)
        fault = next(e for e in evs if e.kind == "fault")
        assert fault.detail["action"] == "kill-host" and fault.host == "node1", seed
        res = next(e for e in evs if e.kind == "resumed").detail
        assert res["hosts_repaired"] == ["node1"] and res["steps_lost"] >= 0, (seed, res)
        good = next(e for e in evs if e.kind == "goodput").detail
        assert good["steps"] == 24, (seed, good)
        rows.append((res["detect_seconds"], res["repair_seconds"], res["relaunch_seconds"], res["steps_lost"],
                     res["downtime_seconds"], good.get("ratio")))
    cols = ("detect", "repair", "relaunch", "steps lost", "downtime", "goodput ratio")
    for i, c in enumerate(cols):
        vals = [r[i] for r in rows if r[i] is not None]
        print(f"{c}: median {statistics.median(vals):.2f}, min {min(vals):.2f}, max {max(vals):.2f}")


def test_a_host_that_cannot_be_repaired_fails_the_run_naming_it(local_testbed, monkeypatch) -> None:
    """A host lost mid-run with no fault fired that never comes back: the run fails, naming the host, what went
    wrong with its repair and what to do."""
    from localbed import lose_a_host_mid_run

    from testbed.providers.local.provider import LocalProvider

    bed = local_testbed(hosts=2)
    monkeypatch.setattr(LocalProvider, "ssh_timeout", property(lambda self: 2.0))
    monkeypatch.setattr(LocalProvider, "_start_hosts", lambda self, todo: None)  # it never boots again
    monkeypatch.setattr(LocalProvider, "still_starting", lambda self, h: None)
    status, evs = lose_a_host_mid_run(bed, bed.name)
    assert status == "failed"
    ended = next(e for e in evs if e.kind == "ended")
    why = ended.detail["reason"]
    assert ended.host == "node1" and why.startswith("node1 was lost and could not be repaired: could not repair node1")
    assert "did not answer SSH" in why and "testbed destroy" in why


def _mesh_everywhere(bed) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """From every host, ``ssh NAME hostname`` to every other by name, strictly against the pinned keys: host ->
    what failed ("" when every login worked)."""
    out = {}
    for h in bed.hosts:
        names = " ".join(p.name for p in bed.hosts if p.name != h.name)
        r = bed.ssh(h.name, f"for t in {names}; do ssh -o BatchMode=yes -o StrictHostKeyChecking=yes "
                            f"-o ConnectTimeout=10 $t hostname </dev/null || exit 1; done", timeout=120)
        out[h.name] = "" if r.returncode == 0 and r.stdout.split() == names.split() else r.stderr.strip() or r.stdout
    return out


def test_a_host_rebuilt_with_a_new_disk_is_meshed_with_every_peer_again(local_testbed) -> None:
    """node1 comes back with a new, empty disk (a new host key; the ssh_mesh role makes it a new user key): its new
    pin moves every host's set-up address, so the repair's set-up runs on every host and each learns the new keys.
    A repair on the host's own disk (the same keys) sets up that host alone: the others are skipped."""
    import shutil

    bed = local_testbed(hosts=3)
    tb = Testbed.open(bed.name, bed.store)
    assert tb.setup(roles=["ssh_mesh"]).ok
    assert _mesh_everywhere(bed) == dict.fromkeys(["node0", "node1", "node2"], "")
    records = {h.name: json.loads(bed.ssh(h.name, "cat ~/.cache/testbed/setup.json").stdout) for h in bed.hosts}
    old_key = bed.ssh("node1", "cat ~/.ssh/id_ed25519.pub").stdout.strip()
    sl = bed.provider.slot("node1")
    old_host_key = (sl.root / "host_key.pub").read_text()
    bed.provider.kill_host("node1")
    shutil.rmtree(sl.upper)  # a new disk: no host key, no user key, no set-up record
    (sl.root / "host_key.pub").unlink()
    done = tb.repair("node1")
    assert done.replaced == ["node1"] and (sl.root / "host_key.pub").read_text() != old_host_key
    assert bed.ssh("node1", "cat ~/.ssh/id_ed25519.pub").stdout.strip() not in ("", old_key)
    assert done.setup_hosts == ["node0", "node1", "node2"], done  # the peers ran: their address changed
    for name in ("node0", "node2"):
        rec = json.loads(bed.ssh(name, "cat ~/.cache/testbed/setup.json").stdout)
        differ = sorted(k for k in rec["parts"] if rec["parts"][k] != records[name]["parts"].get(k))
        assert differ == ["host keys"], (name, differ)
    assert _mesh_everywhere(bed) == dict.fromkeys(["node0", "node1", "node2"], "")

    bed.provider.kill_host("node2")  # back on its own disk: the same keys, the peers unchanged
    done = tb.repair("node2")
    assert done.replaced == ["node2"] and done.setup_hosts == ["node2"], done
    assert _mesh_everywhere(bed) == dict.fromkeys(["node0", "node1", "node2"], "")


def test_two_hosts_lost_are_repaired_one_after_the_other(local_testbed) -> None:
    """While node1 is repaired, node2 (lost too: its network cut) does not answer: it is left out of the set-up and
    of the mesh rather than failing the repair; node2's own repair then sets up every host again (the left-out
    hosts are a variable of the first: every address moved) and the mesh is whole."""
    bed = local_testbed(hosts=3)
    tb = Testbed.open(bed.name, bed.store)
    assert tb.setup(roles=["ssh_mesh"]).ok
    bed.provider.kill_host("node1")
    bed.provider.cut_network("node2")
    done = tb.repair("node1")
    assert done.hosts == ["node1"] and done.setup_left_out == ["node2"], done
    assert done.setup_hosts == ["node0", "node1"], done
    bed.provider.restore_network("node2")
    done = tb.repair("node2")
    assert done.setup_hosts == ["node0", "node1", "node2"] and done.setup_left_out == [], done
    assert _mesh_everywhere(bed) == dict.fromkeys(["node0", "node1", "node2"], "")


def test_a_lost_host_is_repaired_from_the_image_the_first_set_up_baked(local_testbed) -> None:
    """On the local testbed the first set-up bakes an image by itself (no --bake); a killed host then comes back on
    a new disk from it (what set-up wrote there is gone, its SSH key and its runs' files stay) and the repair's
    set-up runs only the roles that depend on the other hosts, on that host alone; destroy releases the layer."""
    from tests.localbed import invoke

    bed = local_testbed(hosts=2)
    os.chdir(bed.cwd)
    code, out, exc = invoke("setup", bed.name, "--json")
    assert code == 0, (out, exc)
    done = json.loads(out)
    img = done["image"]
    assert done["ok"] and img["new"] and img["plan"] == "base" and img["testbed"] == bed.name, done
    assert "note" not in done
    code, out, exc = invoke("setup", bed.name, "--json")  # unchanged: skipped, and the image is there already
    assert code == 0 and "image" not in json.loads(out), (out, exc)
    bed.ssh("node1", "mkdir -p ~/.testbed-runs/r1 && echo kept > ~/.testbed-runs/r1/out.txt && echo set-up > /root/x")
    host_key = (bed.provider.slot("node1").root / "host_key.pub").read_text()
    bed.provider.kill_host("node1")
    tb = Testbed.open(bed.name, bed.store)
    rep = tb.repair("node1")
    assert rep.image == img["id"] and "from image" in rep.how, rep
    assert rep.setup_roles in ([], ["ssh_mesh"]) and rep.setup_hosts == ["node1"], rep  # per-testbed roles only
    assert (bed.provider.slot("node1").root / "host_key.pub").read_text() == host_key
    assert bed.ssh("node1", "cat ~/.testbed-runs/r1/out.txt").stdout.strip() == "kept"
    assert bed.ssh("node1", "test -e /root/x").returncode != 0  # a new disk
    assert bed.ssh("node1", "cat ~/.cache/testbed/image.json").returncode == 0  # over the image's layer
    assert {h.name: h.facts.get("image") for h in bed.store.hosts(bed.name)}["node1"] == img["key"]
    assert _mesh_everywhere(bed) == {"node0": "", "node1": ""}
    assert not tb.setup().ran  # recorded as set up
    assert bed.store.image_users() == {img["key"]: [bed.name]}
    layer = img["location"]
    assert os.path.ismount(layer)
    tb.destroy()
    assert not os.path.ismount(layer)
