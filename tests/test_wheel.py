"""Install as users do: a wheel built from the repository, installed into a fresh virtualenv, works from a folder
that holds nothing of the checkout (its playbooks, inventories, templates, experiments and scripts come from the
wheel, not from the source tree); and every install command the package and its pages give installs this
project, by the name and extras in the wheel's metadata, or one of its SDKs."""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from test_install_lines import without_quoted

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
    (whl,) = out.glob("*.whl")
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


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain ``python3.11 -m venv`` with the wheel installed by the pip it came with (never upgraded). The
    dependencies come from this environment's site-packages, added after the venv's own (where the wheel and pip
    are): its .pth files are not run, so the checkout's editable install stays out of sight; their commands
    (ansible-playbook) are written into the venv's bin as pip writes them, so Ansible runs on the venv's Python."""
    from importlib.metadata import distribution

    venv = tmp_path_factory.mktemp("plain") / "venv"
    r = _run([sys.executable, "-m", "venv", str(venv)], cwd=venv.parent)
    assert r.returncode == 0, r.stderr
    py = venv / "bin" / "python"
    r = _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], cwd=venv.parent)
    assert r.returncode == 0, r.stderr
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=venv.parent).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    for dist in ("ansible-core", "ansible-runner"):
        for ep in distribution(dist).entry_points.select(group="console_scripts"):
            module, _, attr = ep.value.partition(":")
            script = venv / "bin" / ep.name
            script.write_text(f"#!{py}\nimport sys\nfrom {module} import {attr}\nsys.exit({attr}())\n")
            script.chmod(0o755)
    return venv


def _plain_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TESTBED_HOME")}
    env["TESTBED_HOME"] = str(home)
    return env


def test_installed_wheel_runs_from_an_empty_folder(installed: Path, tmp_path: Path) -> None:
    venv, py = installed, installed / "bin" / "python"
    work = tmp_path / "work"
    work.mkdir()
    env = _plain_env(work / ".testbed")
    where = _run([str(py), "-c", "import testbed, testbed.paths as p; print(testbed.__file__); "
                                 "print(p.resource_dirs('experiments'))"], cwd=work, env=env)
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(str(venv)) and str(ROOT) not in where.stdout, where.stdout
    exe = str(venv / "bin" / "testbed")
    r = _run([exe, "--help"], cwd=work, env=env)
    assert r.returncode == 0 and "provision" in r.stdout, r.stdout + r.stderr
    r = _run([exe, "list", "profiles", "--json"], cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    assert {"base", "local-suites", "tesla"} <= {p["name"] for p in json.loads(r.stdout)["profiles"]}
    r = _run([exe, "list", "suites", "--json"], cwd=work, env=env)  # the suite folders, inside the wheel
    assert r.returncode == 0, r.stderr
    tesla = next(x for x in json.loads(r.stdout) if x["name"] == "tesla")
    assert tesla["origin"] == {"from": "shipped"} and tesla["path"].startswith(str(venv)), tesla
    assert tesla["path"].endswith("_data/experiments/tesla/suite.yml"), tesla
    r = _run([exe, "run", "fault-drill", "--on", "local", "--dry-run", "--json"], cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["run_id"].startswith("fault-drill-") and plan["commands"], plan.keys()
    r = _run([exe, "status", "local"], cwd=work, env=env)  # the shipped inventory, found in the wheel
    assert r.returncode == 1 and "not provisioned" in r.stderr + r.stdout, r.stdout + r.stderr


PROFILE = """description: a venv with tbprobe, its wheel downloaded on the controller by the controller's pip
roles:
  - role: python_env
    vars:
      python_env_path: "{{{{ ansible_facts.user_dir }}}}/tb-wheel-env"
      python_env_pip_packages: [tbprobe==1.0]
      python_env_pip_no_index: true
      python_env_pip_find_links: [{wheels}]
      python_env_wheelhouse: true
      python_env_verify_imports: [tbprobe]
"""


def test_set_up_runs_from_a_plain_venv_with_the_pip_it_came_with(installed: Path, local_testbed: Any,
                                                                 tmp_path: Path) -> None:
    """Issue 41: set-up from the wheel in a plain venv, whose pip (Python 3.11's bundled 23.2.1) lacks options a
    newer pip has: the wheelhouse download on the controller (python_env, offline local hosts) must work with it."""
    from localbed import probe_wheel

    py = installed / "bin" / "python"
    bundled = _run([str(py), "-c", "import ensurepip; print(ensurepip.version())"], cwd=tmp_path).stdout.strip()
    pip = _run([str(py), "-m", "pip", "--version"], cwd=tmp_path).stdout
    assert bundled and pip.startswith(f"pip {bundled} from {installed}"), (bundled, pip)  # never upgraded
    bed = local_testbed(hosts=2)
    (tmp_path / "wheels").mkdir()
    probe_wheel(tmp_path / "wheels")
    profiles = bed.cwd / "playbooks" / "profiles"
    profiles.mkdir(parents=True)
    (profiles / "tb-wheel.yml").write_text(PROFILE.format(wheels=json.dumps(str(tmp_path / "wheels"))))
    r = _run([str(installed / "bin" / "testbed"), "setup", bed.name, "--profile", "tb-wheel"], cwd=bed.cwd,
             env=_plain_env(bed.home))
    assert r.returncode == 0, r.stdout + r.stderr
    for h in bed.hosts:
        got = bed.ssh(h.name, "~/tb-wheel-env/bin/python -c 'import tbprobe; print(tbprobe.__version__)'")
        assert got.stdout.strip() == "1.0", (h.name, got.stdout, got.stderr)


@pytest.mark.slow
def test_the_readme_local_loop_runs_from_a_plain_venv_and_never_waits_silently(installed: Path, need_local: None,
                                                                               tmp_path: Path) -> None:
    """Issue 41: the README's local loop, as written, with the testbed of a plain venv holding the wheel, under a
    pty: every command exits 0 and no wait over 2 s is silent (tests/test_no_silence.py)."""
    from test_no_silence import readme_loop

    ran = readme_loop(str(installed / "bin" / "testbed"), tmp_path, _plain_env(tmp_path / ".testbed"))
    assert [w.argv[1] for w in ran] == ["provision", "exec", "setup", "run", "collect", "report", "destroy"]


# distribution names on PyPI that are other people's projects (pypi.org/simple/testbed/: an unrelated package whose
# install fails on Python 3 with NameError: name 'basestring' is not defined)
FOREIGN = {"testbed"}
# flags of pip and pipx that take a value (the value is not a requirement, except -e's)
VALUED = {"-r", "--requirement", "-c", "--constraint", "-t", "--target", "-w", "--wheel-dir", "-d", "--dest",
          "-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--python", "--suffix"}
STOP = {"or", "and", "into", "in", "from", "then", "to", "with", "for", "the", "a", "an", "after", "as"}
COMMAND = re.compile(r"\b(?:pip|pip3|pipx|python3? -m pip) (?:install|upgrade)\b")


def commands(text: str) -> list[str]:
    """The pip and pipx commands in ``text`` (a message or one line of a page), each with its arguments: they
    end at a word, a parenthesis, a comment, or a token that closes a code span, a clause or a sentence."""
    out = []
    for m in COMMAND.finditer(text):
        args: list[str] = []
        for raw in text[m.end():].split():
            if raw.startswith(("(", "#")) or raw in STOP:  # prose, or a shell comment
                break
            tok, closes = raw, False
            while len(tok) > 1 and tok[-1] in "`,;:).'\"":
                closes = closes or tok[-1] not in "'\""
                tok = tok[:-1]
            args.append(tok.lstrip("`'\""))
            if closes:
                break
        out.append(" ".join([m.group(0), *args]))
    return out


def found_commands() -> dict[str, list[str]]:
    """Where each command is: the package's strings (messages, help, docstrings; f-string holes as {...}),
    docs/ and examples/ (their code spans, code blocks and notebook cells)."""
    found: dict[str, list[str]] = {}
    for py in sorted((ROOT / "testbed").rglob("*.py")):
        if py.name == "distribution.py":  # the one place the command is made: checked by rendering it below
            continue
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "{...}" for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            for c in commands(text):
                where = f"{py.relative_to(ROOT)}:{node.lineno}"
                if where not in found.get(c, []):  # an f-string's parts are strings too
                    found.setdefault(c, []).append(where)
    pages = sorted((ROOT / "docs").rglob("*.md")) + sorted((ROOT / "examples").glob("*.ipynb"))
    for page in pages:
        if page.suffix == ".ipynb":
            cells = json.loads(page.read_text())["cells"]
            lines = [ln for cell in cells for ln in "".join(cell["source"]).splitlines()]
        else:
            lines = without_quoted(page.read_text()).splitlines()  # an artifact's own pip lines are not ours
        for i, line in enumerate(lines, 1):
            for c in commands(line):
                found.setdefault(c, []).append(f"{page.relative_to(ROOT)}:{i}")
    return found


def wheel_metadata(wheel: Path) -> tuple[str, set[str], set[str]]:
    """The wheel's distribution name, its extras, and the names of what it requires (any extra)."""
    z = zipfile.ZipFile(wheel)
    meta = Parser().parsestr(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode())
    reqs = {canonicalize_name(Requirement(r).name) for r in meta.get_all("Requires-Dist") or []}
    return meta["Name"], set(meta.get_all("Provides-Extra") or []), reqs


def wrong(command: str, wheel: Path) -> str | None:
    """Why ``command`` does not install this project (by the wheel's name and extras) or an SDK it requires."""
    name, extras, requires = wheel_metadata(wheel)
    if "{" in command:
        return "built from a variable: give testbed.distribution.install_command()"
    args = shlex.split(command)[2 if command.startswith(("pip", "pipx")) else 4:]
    reqs, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-e", "--editable"):
            continue
        if a in VALUED:
            skip = True
            continue
        if not a.startswith("-"):
            reqs.append(a)
    if not reqs:
        return "names nothing to install"
    for r in reqs:
        if r.endswith(".whl"):
            if not fnmatch.fnmatch(wheel.name, Path(r).name):
                return f"{r} is not the wheel's file name ({wheel.name})"
            continue
        local = r.startswith((".", "/"))
        try:
            req = Requirement("x" + r[len(r.split("[")[0]):] if local else r)
        except InvalidRequirement:
            return f"{r!r} is not a requirement"
        mine = local or canonicalize_name(req.name) == canonicalize_name(name)
        if mine and not req.extras <= extras:
            return f"no extra {sorted(req.extras - extras)} in the wheel (it has {sorted(extras)})"
        if not mine and canonicalize_name(req.name) not in requires:
            return f"{req.name} is neither this project ({name}) nor one of its SDKs"
    return None


def test_the_distribution_is_ours_and_every_install_command_installs_it(wheel: Path) -> None:
    from testbed import distribution
    from testbed.errors import UsageError, require_extra

    name, extras, _ = wheel_metadata(wheel)
    assert canonicalize_name(name) not in FOREIGN, f"{name} is another project on PyPI"
    assert name == distribution.DIST and {"chameleon", "tpu"} <= extras
    found = found_commands()
    # the commands the one function makes: every extra, pip and pipx, install, upgrade and reinstall
    for pipx in (False, True):
        for kw in ({}, {"upgrade": True}, {"reinstall": True}):
            found.setdefault(distribution.install_command(pipx=pipx, **kw), []).append("install_command()")
        for extra in sorted(extras):
            found.setdefault(distribution.install_command(extra, pipx=pipx), []).append("install_command()")
            try:
                require_extra("no_such_module_for_the_test", extra, "this test")
            except UsageError as e:  # the message a missing extra gives
                for c in commands(e.fix or ""):
                    found.setdefault(c, []).append(f"require_extra(..., {extra!r})")
    assert any(w.startswith("docs/") for where in found.values() for w in where), found
    bad = {c: (why, where) for c, where in found.items() if (why := wrong(c, wheel))}
    assert not bad, bad


def test_the_readme_install_commands_install_this_project(wheel: Path) -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    found = {c: i for i, line in enumerate(lines, 1) for c in commands(line)}
    from testbed.distribution import DIST

    assert any(c.startswith(f"pipx install {DIST}") for c in found), f"the README names no `pipx install {DIST}`"
    bad = {c: (why, f"README.md:{i}") for c, i in found.items() if (why := wrong(c, wheel))}
    assert not bad, bad
