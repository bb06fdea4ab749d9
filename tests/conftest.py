"""Shared fixtures: isolated state homes and real local testbeds."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import tiers
from leftovers import SLURM_USED, remove_control_dirs_under, slurm_daemons
from localbed import LocalBed, local_available, local_bed, reset


def pytest_configure(config: pytest.Config) -> None:
    for line in ("sshd: needs root for real sshd daemons on loopback addresses (the cloud fakes' servers)",
                 "own_testbed: provisions local testbeds of its own (not the worker's shared one)"):
        config.addinivalue_line("markers", line)


@pytest.fixture(scope="session", autouse=True)
def _user_index_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The per-user index of state homes (testbed.homes) of module- and session-wide fixtures: never the
    real user's (~/.local/state/testbed), which tests would fill with their temporary folders."""
    # and: the per-user download cache (paths.user_cache) is the session's; git reaches no repository off this
    # machine (a rehearsal fetching a suite's source on the controller gets git's own refusal, no traffic)
    env = {"XDG_STATE_HOME": str(tmp_path_factory.mktemp("xdg-state-session")),
           "TESTBED_CACHE": str(tmp_path_factory.mktemp("user-cache")), "GIT_ALLOW_PROTOCOL": "file"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def _user_index(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own per-user index of state homes (other tests' folders are not its testbeds)."""
    d = tmp_path_factory.mktemp("xdg-state")
    monkeypatch.setenv("XDG_STATE_HOME", str(d))
    return d


@pytest.fixture(autouse=True)
def _cwd_restored() -> Iterator[None]:
    """Each test ends in the folder it started in: one that changed folder (os.chdir into its tmp_path) never
    decides where the next test of its worker finds experiments/ and .testbed/ (test_reproduce's tests left the
    worker in folders holding a suite of their own, which list_suites then listed for the next test)."""
    old = os.getcwd()
    yield
    if os.getcwd() != old and os.path.isdir(old):
        os.chdir(old)


@pytest.fixture(autouse=True)
def _control_dirs_removed(request: pytest.FixtureRequest) -> Iterator[None]:
    """At the end of a test, the SSH control folders of the testbeds in its tmp_path are gone, whether or not the
    test destroyed them (a failed provision, a fake testbed): nothing of a test stays in /tmp."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    root = request.getfixturevalue("tmp_path")
    yield
    remove_control_dirs_under(root)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session loudly when its testbeds left SSH control folders in /tmp (then remove them)."""
    factory = getattr(session.config, "_tmp_path_factory", None)
    base = getattr(factory, "_basetemp", None)
    if base is None:
        return
    left = remove_control_dirs_under(Path(base))
    daemons = slurm_daemons() if SLURM_USED else []
    if left or daemons:
        rep = session.config.pluginmanager.get_plugin("terminalreporter")
        msg = (f"this test session left {len(left)} SSH control folder(s) in /tmp (removed now): "
               + ", ".join(str(d) for d in left[:5]) + ("" if len(left) <= 5 else " ...")) if left else ""
        if daemons:
            msg += f"{'; ' if msg else ''}its Slurm cluster left daemons running: {', '.join(daemons)}"
        if rep is not None:
            rep.ensure_newline()
            rep.write_line(f"ERROR: {msg}", red=True, bold=True)
        else:
            sys.stderr.write(f"ERROR: {msg}\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def tb_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory with its own TESTBED_HOME; cwd is set to it."""
    monkeypatch.setenv("TESTBED_HOME", str(tmp_path / ".testbed"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


UserCli = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def user_cli(tb_home: Path) -> Callable[[dict[str, str]], UserCli]:
    """A user's working folder: ``user_cli({"inventories/lab.yml": TEXT, ...})`` writes those files into
    ``tb_home`` (its own state home) and gives ``run(*ARGS)``, the real ``testbed ARGS`` run there."""
    root = Path(__file__).resolve().parents[1]

    def make(files: dict[str, str]) -> UserCli:
        for rel, text in files.items():
            (tb_home / rel).parent.mkdir(parents=True, exist_ok=True)
            (tb_home / rel).write_text(text)
        env = {**os.environ, "PYTHONPATH": str(root), "TESTBED_HOME": str(tb_home / ".testbed"), "COLUMNS": "400"}

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=tb_home, capture_output=True,
                                  text=True, env=env, timeout=120, check=False)

        return run

    return make


def line_of(text: str, needle: str) -> int:
    """The 1-based number of the first line of ``text`` holding ``needle``."""
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


@pytest.fixture
def need_local() -> None:
    reason = local_available()
    if reason:
        pytest.skip(f"local testbed unavailable: {reason}")


@pytest.fixture
def local_testbed(tmp_path: Path, need_local: None) -> Iterator[object]:
    """Factory: ``bed = local_testbed(hosts=4, user='root', name='tb')``; destroyed after the test."""
    beds: list[LocalBed] = []
    stack: list[object] = []

    def make(hosts: int = 4, user: str = "root", name: str = "tb", groups: dict[str, list[str]] | None = None,
             vars: dict[str, object] | None = None, bridge: str | None = None,
             hardware: dict[str, object] | None = None):
        cm = local_bed(tmp_path / f"bed-{len(beds)}", name=name, hosts_n=hosts, user=user, groups=groups or {},
                       vars=vars or {}, bridge=bridge, hardware=hardware or {})
        bed = cm.__enter__()
        stack.append(cm)
        beds.append(bed)
        return bed

    old = os.getcwd()
    yield make
    for cm in reversed(stack):
        cm.__exit__(None, None, None)  # type: ignore[attr-defined]
    os.chdir(old)


class _SharedBed:
    """The worker's local testbed: provisioned on first use, reset between the modules that share it."""

    def __init__(self, root: Path):
        self.root = root
        self.bed: LocalBed | None = None
        self.made = 0

    def get(self) -> LocalBed:
        old_env, old_cwd = os.environ.get("TESTBED_HOME"), os.getcwd()
        try:
            if self.bed is not None and not reset(self.bed):  # a module set it up: a new one
                self.close()
            if self.bed is None:
                cwd = self.root / f"shared-{self.made}"
                self.made += 1
                cwd.mkdir()
                self.bed = LocalBed(name="shared", cwd=cwd).up()
            return self.bed
        finally:
            _restore(old_env, old_cwd)

    def close(self) -> None:
        if self.bed is not None:
            old_env, old_cwd = os.environ.get("TESTBED_HOME"), os.getcwd()
            self.bed.down()
            self.bed = None
            _restore(old_env, old_cwd)


def _restore(env: str | None, cwd: str) -> None:
    os.chdir(cwd)
    if env is None:
        os.environ.pop("TESTBED_HOME", None)
    else:
        os.environ["TESTBED_HOME"] = env


@pytest.fixture(scope="session")
def _worker_local_testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_SharedBed]:
    reason = local_available()
    if reason:
        pytest.skip(f"local testbed unavailable: {reason}")
    shared = _SharedBed(tmp_path_factory.mktemp("shared"))
    yield shared
    shared.close()


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real Slurm (slurmctld, 3 slurmd, munge) on 5 local hosts with a shared home, for a whole test module
    (tests/slurmbed.py); gone after it, with no daemon left."""
    import slurmbed

    reason = local_available() or slurmbed.slurm_available()
    if reason:
        pytest.skip(f"Slurm cluster unavailable: {reason}")
    SLURM_USED.append(True)
    with local_bed(tmp_path_factory.mktemp("slurm"), name="cluster", hosts_n=5, user=slurmbed.USER,
                   hardware={"shared_home": True}, own_cgroups=True) as bed:
        yield slurmbed.start(bed)
    left = slurm_daemons()
    assert not left, f"Slurm daemons outlived their hosts: {left}"


@pytest.fixture(scope="module")
def shared_local_testbed(_worker_local_testbed: _SharedBed) -> Iterator[LocalBed]:
    """One 4-host local testbed shared by a whole test module: the test worker's, provisioned once and reset
    between modules (tests/localbed.py's reset), its home and folder in TESTBED_HOME and the cwd meanwhile."""
    old_env, old_cwd = os.environ.get("TESTBED_HOME"), os.getcwd()
    bed = _worker_local_testbed.get()
    os.environ["TESTBED_HOME"] = str(bed.home)
    os.chdir(bed.cwd)
    yield bed
    _restore(old_env, old_cwd)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tier markers by fixture (tests/tiers.py): a test using local hosts is `local` whatever its file says."""
    tiers.apply(items)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--tiers-json", metavar="PATH", help="write each collected test's markers and fixtures")


def pytest_collection_finish(session: pytest.Session) -> None:
    path = session.config.getoption("--tiers-json")
    if path:
        tiers.dump(session.items, Path(path))


PAIR = ["torch==2.14.1", "torchvision==0.29.1", "pandas", "pillow", "psutil", "wheel", "setuptools"]


@pytest.fixture(scope="session")
def torch_pair() -> Iterator[str]:
    """site-packages of a venv holding the stock pair (made once per machine, ~1 min from pip's local files)."""
    old = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "testbed-tests"
    if old.is_dir():  # where earlier versions kept it (unreadable to other users): gone, made again below
        import shutil

        shutil.rmtree(old, ignore_errors=True)
    # where every user can read it: a rehearsal's replica logs in as the real testbed's user (cc, h3trinh ...)
    root = Path(os.environ.get("TESTBED_TEST_CACHE", "/var/tmp/testbed-tests")) / "torch-2.14.1-tv-0.29.1"
    py = root / "bin" / "python"
    probe = [str(py), "-c", "import torch, torchvision.models, pandas, PIL, psutil, wheel, sysconfig; "
                            "print(sysconfig.get_paths()['purelib'])"]
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:  # test workers in parallel make it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        r = subprocess.run(probe, capture_output=True, text=True, check=False) if py.exists() else None
        if r is None or r.returncode != 0:
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(root)], check=True)
            pip = subprocess.run([str(root / "bin" / "pip"), "install", "-q", *PAIR], capture_output=True,
                                 text=True, check=False, timeout=1800)
            if pip.returncode != 0:
                pytest.skip(f"cannot install the stock torch pair here: {pip.stderr.strip()[-500:]}")
            r = subprocess.run(probe, capture_output=True, text=True, check=True)
    yield r.stdout.strip()
