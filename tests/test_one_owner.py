"""One owner per name: a new spec that names another local testbed's bridge or subnet (of this state home or any
other the user's index lists) is refused before any host is made, and the other testbed is left as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("take", ["bridge", "subnet", "both"])
def test_a_spec_cannot_take_another_testbeds_bridge_or_subnet(local_testbed, tmp_path: Path, take: str) -> None:  # type: ignore[no-untyped-def]
    a = local_testbed(hosts=1, name="a")
    info = a.store.testbed("a")["info"]
    work = tmp_path / "other"
    (work / "inventories").mkdir(parents=True)
    prov: dict[str, object] = {"kind": "local", "hosts": 1, "subnet": "10.219.77.0/24"}
    if take in ("bridge", "both"):
        prov["bridge"] = info["bridge"]
    if take in ("subnet", "both"):
        prov["subnet"] = info["subnet"]
    (work / "inventories" / "b.yml").write_text(json.dumps({"provider": prov}))
    r = subprocess.run([sys.executable, "-m", "testbed", "provision", "b"], cwd=work, capture_output=True, text=True,
                       timeout=300, check=False,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300",
                            "TESTBED_HOME": str(work / ".testbed")})
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and "is local testbed 'a''s" in err and str(a.home) in err, (r.stdout, err)
    assert "provider." in err and "destroy a" in err
    assert a.ssh("node0", "true").returncode == 0  # the other testbed still answers
    db = work / ".testbed" / "state.db"
    if db.exists():  # nothing recorded: no host was made
        from testbed.state import Store

        assert Store(db, readonly=True).testbed("b") is None
