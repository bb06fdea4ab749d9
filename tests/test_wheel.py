"""Install as users do: a wheel built from the repository, installed into a fresh virtualenv, works from a folder
that holds nothing of the checkout (its playbooks, inventories, templates, experiments and scripts come from the
wheel, not from the source tree)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("hatchling", reason="the dev extra brings hatchling, the build backend")
    out = tmp_path_factory.mktemp("dist")
    r = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
              str(ROOT)], cwd=out)
    assert r.returncode == 0, r.stderr
    (whl,) = out.glob("testbed-*.whl")
    return whl


def test_the_wheel_holds_every_file_the_package_reads(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    # every non-Python file of the package (init script, shell scripts, templates it opens) ...
    pkg = [p.relative_to(ROOT).as_posix() for p in (ROOT / "testbed").rglob("*")
           if p.is_file() and "__pycache__" not in p.parts]
    missing = [p for p in pkg if p not in names]
    # ... and every shipped resource folder, under testbed/_data/
    for kind in ("playbooks", "inventories", "templates", "experiments"):
        files = [p for p in (ROOT / kind).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        assert files, kind
        missing += [f"testbed/_data/{p.relative_to(ROOT).as_posix()}" for p in files
                    if f"testbed/_data/{p.relative_to(ROOT).as_posix()}" not in names]
    assert not missing, missing
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "testbed = testbed.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_installed_wheel_runs_from_an_empty_folder(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    r = _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    py = venv / "bin" / "python"
    r = _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # the dependencies come from this environment's site-packages, added after the venv's own (where the wheel
    # is): its .pth files are not run, so the checkout's editable install stays out of sight
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp_path).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TESTBED_HOME")}
    env["TESTBED_HOME"] = str(work / ".testbed")
    where = _run([str(py), "-c", "import testbed, testbed.paths as p; print(testbed.__file__); "
                                 "print(p.resource_dirs('experiments'))"], cwd=work, env=env)
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(str(venv)) and str(ROOT) not in where.stdout, where.stdout
    exe = str(venv / "bin" / "testbed")
    r = _run([exe, "--help"], cwd=work, env=env)
    assert r.returncode == 0 and "provision" in r.stdout, r.stdout + r.stderr
    r = _run([exe, "list", "profiles", "--json"], cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    assert {"base", "local-suites"} <= {p["name"] for p in json.loads(r.stdout)["profiles"]}
    r = _run([exe, "run", "fault-drill", "--on", "local", "--dry-run", "--json"], cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["run_id"].startswith("fault-drill-") and plan["commands"], plan.keys()
    r = _run([exe, "status", "local"], cwd=work, env=env)  # the shipped inventory, found in the wheel
    assert r.returncode == 1 and "not provisioned" in r.stderr + r.stdout, r.stdout + r.stderr
