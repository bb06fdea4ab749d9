"""What the CLI does when it cannot print as asked, and when its state home is no folder: never a silent exit 0.

- stdout closed (``>&-``): refused before any work, one line on stderr, exit 1.
- stdout's reader gone (``| head -0``): exit 1 and nothing on stderr, whichever writer met the broken pipe
  (Rich's own handling does the same; Python's documentation advises it): a pipeline's early reader is no error
  to report, but not all was printed, so no success either (``set -o pipefail`` sees it).
- ``COLUMNS=0`` (or a width no table fits): ignored, the output is printed at the terminal's width, else 80.
- a state home that is a file or a device: one error (what, where, fix), exit 1, not "no testbeds".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TESTBED_DEBUG")}
    return {**base, "PYTHONPATH": str(ROOT), "TESTBED_HOME": str(tmp_path / ".testbed"), **extra}


def test_closed_stdout_is_refused_with_one_line(tmp_path: Path) -> None:
    r = subprocess.run(["sh", "-c", f'exec "{sys.executable}" -m testbed list testbeds >&-'], cwd=ROOT,
                       env=env(tmp_path), capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1, r
    assert r.stderr.strip().splitlines() == ["error: standard output is closed: testbed cannot print what it "
                                             "does (run it with stdout open, or redirect it: > /dev/null)"]
    assert not (tmp_path / ".testbed").exists()  # before any work


@pytest.mark.parametrize("argv", [["list", "testbeds"], ["status"]])
def test_a_reader_gone_is_exit_1_and_quiet(tmp_path: Path, argv: list[str]) -> None:
    p = subprocess.Popen([sys.executable, "-m", "testbed", *argv], cwd=ROOT, env=env(tmp_path),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # the reader is gone before the command writes anything (| head -0)
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 1 and err == "", err


@pytest.mark.parametrize("cols", ["0", "1", "-3", "wide"])
def test_a_useless_columns_still_prints(tmp_path: Path, cols: str) -> None:
    r = subprocess.run([sys.executable, "-m", "testbed", "list", "testbeds"], cwd=ROOT,
                       env=env(tmp_path, COLUMNS=cols), capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert "local" in r.stdout and "not provisioned" in r.stdout, r.stdout
    assert max(len(ln) for ln in r.stdout.splitlines()) >= 40  # a table, not one character per line


@pytest.mark.parametrize("argv", [["status"], ["list", "runs"], ["list", "testbeds"], ["provision", "local"]])
@pytest.mark.parametrize("kind", ["file", "device"])
def test_a_state_home_that_is_no_folder_is_one_error(tmp_path: Path, argv: list[str], kind: str) -> None:
    home = tmp_path / "home-file"
    home.write_text("not a folder\n")
    target = str(home) if kind == "file" else os.devnull
    r = subprocess.run([sys.executable, "-m", "testbed", *argv], cwd=ROOT, capture_output=True, text=True,
                       env={**env(tmp_path), "TESTBED_HOME": target, "COLUMNS": "300"}, timeout=60, check=False)
    assert r.returncode == 1, (r.stdout, r.stderr)
    what = "a file" if kind == "file" else "not a folder"
    assert f"error: the state home {target} is {what}, not a folder" in r.stderr, r.stderr
    assert f"where: {target} (TESTBED_HOME)" in r.stderr and "fix:   move that file away" in r.stderr
    assert "no testbed" not in r.stdout + r.stderr and "Traceback" not in r.stderr
    assert home.read_text() == "not a folder\n"


def test_the_api_refuses_a_state_home_that_is_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.errors import TestbedError
    from testbed.state import Store

    (tmp_path / "f").write_text("")
    monkeypatch.setenv("TESTBED_HOME", str(tmp_path / "f"))
    for open_it in (Store.open_existing, Store.open_default):
        with pytest.raises(TestbedError, match="is a file, not a folder"):
            open_it()
