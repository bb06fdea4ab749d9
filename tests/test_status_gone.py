"""``testbed status`` never says "up" of a local host whose namespace is gone: it reads /proc (no network), calls
the host gone, and names the command that brings it back (issue 55 item 5)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_local_host_whose_namespace_is_gone_is_gone_in_status(local_testbed) -> None:  # type: ignore[no-untyped-def]
    bed = local_testbed(hosts=2, name="tb")
    pid = int(bed.provider.slot("node1").pidfile.read_text())
    os.kill(pid, signal.SIGKILL)  # its init, and with it the host's PID namespace
    for _ in range(50):
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.1)
    r = subprocess.run([sys.executable, "-m", "testbed", "status", "tb"], cwd=bed.cwd, capture_output=True, text=True,
                       timeout=120, check=False,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300", "TESTBED_HOME": str(bed.home)})
    cells = [[c.strip() for c in ln.split("│") if c.strip()] for ln in r.stdout.splitlines() if "│" in ln]
    rows = {c[0]: c[-1] for c in cells if c and c[0].startswith("node")}
    assert rows.get("node0") == "up" and rows.get("node1") == "gone", r.stdout
    said = " ".join(r.stdout.split())
    assert "1 host gone (node1)" in said and "testbed provision tb" in said, said
