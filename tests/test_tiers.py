"""The test tiers hold: markers follow the fixtures a test uses (tests/tiers.py), in this suite and in test files
that were never edited for them, so `make test-unit` never needs root, local hosts or sshd."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent


def _collect(root: Path, *args: str, cwd: Path) -> list[dict[str, Any]]:
    out = root / "tiers.json"
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "--tiers-json", str(out), *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_suite_s_tiers_hold(tmp_path: Path) -> None:
    """Every test using a tier fixture carries its markers, explicit markers still count, and the unit tier holds
    no test that needs root (one collection of the whole suite, in a fresh process)."""
    import tiers

    suite = {i["id"]: {"markers": set(i["markers"]), "fixtures": set(i["fixtures"])}
             for i in _collect(tmp_path, str(TESTS), cwd=TESTS.parent)}
    assert len(suite) > 500
    wrong = [f"{nid}: {fx} needs {sorted(set(marks) - t['markers'])}" for nid, t in suite.items()
             for fx, marks in tiers.BY_FIXTURE.items() if fx in t["fixtures"] and not set(marks) <= t["markers"]]
    assert not wrong, "\n".join(wrong[:20])
    # every test that provisions its own testbed is local; the shared testbed's users are local, not own_testbed
    assert all("local" in t["markers"] for t in suite.values() if "own_testbed" in t["markers"])
    shared = [t for t in suite.values() if "shared_local_testbed" in t["fixtures"]]
    assert shared and all("local" in t["markers"] and "own_testbed" not in t["markers"] for t in shared)
    # the loopback sshd suites are out of the unit tier, down to the tests that reach sshd through other fixtures
    for name in ("test_chameleon.py::test_provision_ssh_destroy",
                 "test_tpu_provider.py::test_reprovision_is_idempotent"):
        assert "sshd" in suite[f"tests/{name}"]["markers"], name
    # explicit markers: a module's pytestmark
    wheel = [t for nid, t in suite.items() if nid.startswith("tests/test_wheel.py::")]
    assert wheel and all("slow" in t["markers"] for t in wheel)
    e2e = [t for nid, t in suite.items() if nid.startswith("tests/test_cloud_e2e.py::")]
    assert e2e and all("local" in t["markers"] for t in e2e)
    # the tiers: the unit one needs no root fixture; the fast one holds it and the shared testbed's tests
    root_fixtures = {fx for fx, marks in tiers.BY_FIXTURE.items() if {"local", "sshd"} & set(marks)}
    unit = {nid for nid, t in suite.items() if not {"local", "sshd", "slow"} & t["markers"]}
    assert len(unit) > 500
    assert not [nid for nid in unit if root_fixtures & suite[nid]["fixtures"]]
    fast = {nid for nid, t in suite.items() if not {"slow", "own_testbed"} & t["markers"]}
    assert unit < fast and any("shared_local_testbed" in suite[nid]["fixtures"] for nid in fast)


NEW_FILE = '''
import contextlib, pytest
from fakes.chameleon_api import LoopbackSshd
from localbed import local_bed


@pytest.fixture(scope="module")
def daemons():  # a new provider's servers: nothing in tiers.py names this fixture
    d = LoopbackSshd(2)
    yield d


@pytest.fixture
def cluster(tmp_path):
    with local_bed(tmp_path) as bed:
        yield bed


@pytest.fixture
def indirect(cluster):
    return cluster


def test_pure():
    assert True


def test_servers(daemons):
    pass


def test_own(indirect):
    pass


def test_shared(shared_local_testbed):
    pass


def test_own_by_name(local_testbed):
    pass


@pytest.mark.slow
def test_explicit():
    pass
'''


def test_a_new_test_file_is_classified_without_edits(tmp_path: Path) -> None:
    """A file written the way other test files are, with fixtures of its own, gets its markers by what they do."""
    d = tmp_path / "tests"
    d.mkdir()
    (d / "conftest.py").write_text(textwrap.dedent(f'''
        import importlib.util
        spec = importlib.util.spec_from_file_location("suite_conftest", {str(TESTS / "conftest.py")!r})
        suite = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(suite)
        globals().update({{k: v for k, v in vars(suite).items() if not k.startswith("__")}})
        '''))
    (d / "test_new_provider.py").write_text(NEW_FILE)
    items = {i["id"].split("::")[1]: set(i["markers"]) for i in _collect(tmp_path, str(d), cwd=tmp_path)}
    tier = {"local", "own_testbed", "sshd", "slow"}
    assert {k: v & tier for k, v in items.items()} == {
        "test_pure": set(), "test_servers": {"sshd"}, "test_own": {"local", "own_testbed"},
        "test_shared": {"local"}, "test_own_by_name": {"local", "own_testbed"}, "test_explicit": {"slow"}}
