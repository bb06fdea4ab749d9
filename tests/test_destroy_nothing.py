"""``destroy`` of a testbed with nothing recorded says so: never "destroyed" of what did not exist, and no question
to confirm (issue 55 item 6)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_destroy_of_a_testbed_with_nothing_recorded_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300", "TESTBED_HOME": str(tmp_path / ".testbed")}
    r = subprocess.run([sys.executable, "-m", "testbed", "destroy", "local"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, check=False, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "nothing to destroy" in r.stdout and "destroyed" not in r.stdout, r.stdout
